"""Every training recipe, and the one a run's architecture trains with: by its family's name."""
from __future__ import annotations

from models.checkpoints import ARCHITECTURES
from models.errors import WorkbenchError
from models.families import Family, family_or_ours

from ..config import TrainConfig
from . import flux, sd3, sdxl, stable_diffusion
from .denoiser import denoiser_on_meta, frozen_parts, run_frozen_dtype
from .latent_diffusion import LatentDiffusion
from .recipe import Recipe

RECIPES: tuple[Recipe, ...] = (stable_diffusion.RECIPE, sdxl.RECIPE, sd3.RECIPE, flux.RECIPE)


def recipe_for(family: Family) -> Recipe:
    for recipe in RECIPES:
        if family.name in recipe.families:
            return recipe
    trained = sorted(name for recipe in RECIPES for name in recipe.families)
    raise WorkbenchError(f"the workbench does not train {family.label} models; it trains: {', '.join(trained)}")


def family_of_architecture(architecture: str) -> Family:
    return family_or_ours(ARCHITECTURES[architecture].get("family"))


def build_model(cfg: TrainConfig) -> LatentDiffusion:
    """The architecture's Composer model, by its family's recipe: a UNet on the diffusion schedule (SD 2's, or SDXL's
    with two text towers and size conditioning), or a transformer on rectified flow (SD3's MMDiT, Flux.1's)."""
    if cfg.model.init_from is not None:  # the family, parts and schedule come from the checkpoint it names
        from .source import model_from_source

        model = model_from_source(cfg, recipe_for)
    else:
        model = recipe_for(family_of_architecture(cfg.model.architecture)).build(cfg, *frozen_parts(cfg))
    return model.hold_frozen_in(run_frozen_dtype(cfg))  # a GPU's autocast dtype (float32 on a CPU)


def frozen_model(cfg: TrainConfig) -> LatentDiffusion:
    """The run's model with its denoiser on the meta device: its VAE and text towers, built, loaded and held as
    training holds them, and its ``encode_captions``, for `dwb data precompute` to encode with what the run reads."""
    with denoiser_on_meta():
        return build_model(cfg)
