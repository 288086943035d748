"""Model families: one entry each (SD 1.x, SD 2.x, SDXL, SD3/3.5, Flux.1) saying how its parts are built and
found, how it conditions, noises and samples, and its sizes and recommended settings; every command asks the
entry instead of assuming a UNet.

- ``family``: what an entry holds (``Family``, its ``Variant`` models and their full-size ``Part`` configs);
- ``stable_diffusion``, ``sdxl``, ``sd3``, ``flux``: the entries; ``parts``: the text encoders and VAEs they share;
- ``registry``: every family, and finding one from a folder, a pipeline or a single file's weight names;
- ``full_size``: the parts at full size on the meta device, their parameter counts;
- ``limits``: what a part's config from elsewhere may ask for, held before it is built, and what it then builds;
- ``flow``: rectified flow, how SD3 and Flux.1 noise and step (the objective a transformer family trains with).
"""
from ..common import face

__getattr__, __all__ = face(__name__, {
    "family": "GUIDANCE_KINDS MAX_TEXT_TOKENS ORIGINAL_SD SIZE_FACTOR TRAINED_TOKENS Assembly Family Part SingleFile Variant",
    "flux": "latent_ids pack_latents text_ids unpack_latents",
    "flow": "SAMPLINGS TRAIN_TIMESTEPS WEIGHTINGS RectifiedFlow patches_shift pixels_shift shifted",
    "full_size": "BYTES_PER_PARAMETER build_on_meta full_size_summary parameter_counts published_count",
    "limits": "built_on_meta check_part_config size_limits",
    "stable_diffusion": "NOISE_SCHEDULE",
    "registry": "FAMILIES family_named family_of_folder family_of_keys family_of_pipeline family_or_ours",
})
