"""SD 1/2: a UNet on the diffusion schedule, conditioned on one CLIP tower's states (``LatentDiffusion``)."""
from __future__ import annotations

from models.errors import WorkbenchError

from ..config import TrainConfig
from .denoiser import (caption_options, prepared_denoiser, source_denoiser, source_parts, source_prediction_type,
                       with_source_schedule)
from .latent_diffusion import LatentDiffusion
from .recipe import Recipe


def build_unet_model(cfg: TrainConfig, vae, text_encoder, tokenizer) -> LatentDiffusion:
    m = cfg.model
    unet = prepared_denoiser(cfg, vae)
    if unet.config.cross_attention_dim != text_encoder.config.hidden_size:
        raise WorkbenchError(f"the UNet's cross_attention_dim ({unet.config.cross_attention_dim}) does not match the "
                             f"text encoder's width ({text_encoder.config.hidden_size}) from '{m.pretrained}'")
    return LatentDiffusion(unet, vae, text_encoder, tokenizer, prediction_type=m.prediction_type,
                           min_snr_gamma=m.min_snr_gamma, **caption_options(cfg))


def unet_model_from(cfg: TrainConfig, pipe) -> LatentDiffusion:
    """An SD 1/2 pipeline's UNet, VAE, text tower and tokenizer, on its scheduler's schedule and prediction type."""
    vae, text_encoder, tokenizer = source_parts(pipe, "vae", "text_encoder", "tokenizer")
    model = LatentDiffusion(source_denoiser(cfg, pipe.unet), vae, text_encoder, tokenizer,
                            prediction_type=source_prediction_type(pipe), min_snr_gamma=cfg.model.min_snr_gamma,
                            **caption_options(cfg))
    return with_source_schedule(model, pipe)


RECIPE = Recipe(families=("sd1", "sd2"), model=LatentDiffusion, build=build_unet_model, from_pipeline=unet_model_from)
