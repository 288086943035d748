"""What a family's training recipe is: the Composer model its denoiser trains in and the builder that makes one. The
family's own entry (``models.families``) says what the model is; the recipe says how this workbench trains it."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    families: tuple[str, ...]  # the ``models.families`` names it trains (SD 1 and 2 share one)
    model: type  # the Composer model (a ``LatentDiffusion``)
    # (TrainConfig, vae, text_encoder, tokenizer) -> the model: the frozen parts in, every other part built or loaded
    # from the config, each size checked against the parts it meets in one line
    build: Callable
    # (TrainConfig, pipeline) -> the model around a pipeline the checkpoint door opened (``model.init_from``): its
    # denoiser, frozen parts, tokenizers and noise schedule as they are; one line where the family's recipe cannot
    # train that pipeline's parts
    from_pipeline: Callable
