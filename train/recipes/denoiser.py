"""What every recipe builds the same way: the trainable denoiser from its architecture (random weights, the config's
overrides, gradient checkpointing), the frozen parts from ``model.pretrained`` or random, and the options every
Composer model takes about its captions and draws."""
from __future__ import annotations

from models.errors import WorkbenchError
from models.families import family_or_ours

from ..config import TrainConfig

DENOISER_WORDS = {"unet": "UNet", "transformer": "transformer"}


def frozen_parts(cfg: TrainConfig):
    """The VAE, text encoder and tokenizer: from ``model.pretrained``, or random (``pretrained: null``)."""
    from models.checkpoints import load_frozen_parts, random_text_encoder, random_vae

    m = cfg.model
    if m.pretrained is not None:
        return load_frozen_parts(m.pretrained)
    if m.architecture.startswith("tiny"):
        raise WorkbenchError(f"config key 'model.pretrained' is required for {m.architecture} (run `dwb prepare` "
                             "and point it there)")
    return random_vae(m.architecture), random_text_encoder(m.architecture), None


def denoiser_kind(architecture: str) -> str:
    """"unet" or "transformer": the part of the architecture's family that denoises."""
    from models.checkpoints import ARCHITECTURES

    return family_or_ours(ARCHITECTURES[architecture].get("family")).denoiser


def build_denoiser(cfg: TrainConfig):
    """The architecture's denoiser with random weights, ``model.unet`` or ``model.transformer`` over its config; a
    key the denoiser does not take is one line."""
    from models.checkpoints import build_transformer, build_unet

    m = cfg.model
    kind = denoiser_kind(m.architecture)
    build, overrides = {"unet": (build_unet, m.unet), "transformer": (build_transformer, m.transformer)}[kind]
    try:
        return build(m.architecture, overrides)
    except TypeError as e:
        raise WorkbenchError(f"config key 'model.{kind}': {e}") from None


def prepared_denoiser(cfg: TrainConfig, vae, packed: int = 1):
    """The run's denoiser, checked against the VAE's latent channels (``packed``: latents per token, Flux.1's 2x2
    patches take 4), with gradient checkpointing where configured."""
    m, denoiser = cfg.model, build_denoiser(cfg)
    channels, latent = denoiser.config.in_channels, vae.config.latent_channels
    if channels != packed * latent:
        raise WorkbenchError(f"the {DENOISER_WORDS[denoiser_kind(m.architecture)]} takes {channels} channels but the VAE from '{m.pretrained}' makes {latent}"
                             + (f", packed 2x2: {packed * latent}" if packed > 1 else ""))
    if m.gradient_checkpointing:
        denoiser.enable_gradient_checkpointing()
    return denoiser


def with_recorded_shift(vae):
    """The VAE with a latent shift in its config: SD's VAEs shift nothing and do not say so, and SD3's and Flux.1's
    pipelines read the key."""
    if getattr(vae.config, "shift_factor", None) is None:
        vae.register_to_config(shift_factor=0.0)
    return vae


def caption_options(cfg: TrainConfig) -> dict:
    """What every training model takes from the config about its captions and draws: dropout for guidance, the
    other phrasing's share, and the per-sample seed (``randomness: per_sample``)."""
    m = cfg.model
    return dict(caption_dropout=m.caption_dropout, other_phrasing=m.other_phrasing,
                per_sample_seed=cfg.seed if cfg.randomness == "per_sample" else None)
