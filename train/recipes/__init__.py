"""How each family trains here: one module per family (``stable_diffusion``, ``sdxl``, ``sd3``, ``flux``), each
holding its Composer model and the builder that makes it from a run's config (``Recipe``); ``latent_diffusion``, the
model they all are (a trainable denoiser between a frozen VAE and frozen text towers, on the diffusion schedule or
rectified flow); ``denoiser``, what every builder makes the same way; ``registry``, every recipe and the one an
architecture trains with; ``philox``, the counter-based generator per-sample draws (``Draws``) come from, on the batch's
device. A new family is one entry in ``models/families/`` and one module here.
"""
from models.common import face

__getattr__, __all__ = face(__name__, {
    "denoiser": "DENOISER_WORDS build_denoiser denoiser_kind frozen_dtype frozen_parts run_frozen_dtype",
    "flux": "FluxStyleTransformer",
    "latent_diffusion": "Draws LatentDiffusion RectifiedFlowTransformer TextConditioning",
    "recipe": "Recipe",
    "registry": "RECIPES build_model frozen_model recipe_for",
    "sdxl": "MicroConditionedUNet",
})
