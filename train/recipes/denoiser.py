"""What every recipe builds the same way: the trainable denoiser from its architecture (random weights, the config's
overrides, gradient checkpointing), the frozen parts from ``model.pretrained`` or random, and the options every
Composer model takes about its captions and draws."""
from __future__ import annotations

import contextlib
import contextvars

import torch

from models.errors import WorkbenchError
from models.families import family_or_ours

from ..config import TrainConfig

DENOISER_WORDS = {"unet": "UNet", "transformer": "transformer"}


def frozen_dtype(device: str, precision: str) -> torch.dtype:
    """The dtype the frozen parts (VAE, text towers) are held in: the half precision a GPU's autocast computes in
    (``amp_bf16``, and ``auto``, which is amp_bf16 there: bfloat16; ``amp_fp16``: float16), float32 on a CPU or
    under ``fp32``. ``device``: Composer's name ("gpu", "cpu") or torch's ("cuda", "cpu"). Autocast runs their
    matmuls and convolutions in that precision whatever they are held in, so holding them in it halves their memory
    (T5-XXL: 19 GB to 9.5 GB on every GPU) without changing what they compute but for the rounding of the weights."""
    if device not in ("gpu", "cuda"):
        return torch.float32
    return {"auto": torch.bfloat16, "amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}.get(precision,
                                                                                                torch.float32)


def run_frozen_dtype(cfg: TrainConfig) -> torch.dtype:
    """``frozen_dtype`` of the run: its configured device as training resolves it, and its precision."""
    from models.generation import pick_device

    try:
        device = pick_device(cfg.device).type
    except WorkbenchError as e:
        raise WorkbenchError(f"config key 'device': {e}") from None
    return frozen_dtype(device, cfg.precision)


def frozen_parts(cfg: TrainConfig):
    """The VAE, text encoder and tokenizer: from ``model.pretrained``, or random (``pretrained: null``), in the
    run's ``run_frozen_dtype``."""
    from models.checkpoints import hold_in, load_frozen_parts, random_text_encoder, random_vae

    m, dtype = cfg.model, run_frozen_dtype(cfg)
    if m.pretrained is not None:
        return load_frozen_parts(m.pretrained, dtype)
    if m.architecture.startswith("tiny"):
        raise WorkbenchError(f"config key 'model.pretrained' is required for {m.architecture} (run `dwb prepare` "
                             "and point it there)")
    return hold_in(random_vae(m.architecture), dtype), hold_in(random_text_encoder(m.architecture), dtype), None


def denoiser_kind(architecture: str) -> str:
    """"unet" or "transformer": the part of the architecture's family that denoises."""
    from models.checkpoints import ARCHITECTURES

    return family_or_ours(ARCHITECTURES[architecture].get("family")).denoiser


# Set while ``denoiser_on_meta`` builds a model: its denoiser holds no memory and no weights
_DENOISER_ON_META = contextvars.ContextVar("denoiser_on_meta", default=False)


@contextlib.contextmanager
def denoiser_on_meta():
    """Models built inside have their denoiser on the meta device: their frozen parts, built and loaded as training
    builds them, to encode data with (`dwb data precompute`) without making the denoiser's weights."""
    token = _DENOISER_ON_META.set(True)
    try:
        yield
    finally:
        _DENOISER_ON_META.reset(token)


def build_denoiser(cfg: TrainConfig):
    """The architecture's denoiser with random weights, ``model.unet`` or ``model.transformer`` over its config; a
    key the denoiser does not take is one line."""
    from models.checkpoints import build_transformer, build_unet

    m = cfg.model
    kind = denoiser_kind(m.architecture)
    build, overrides = {"unet": (build_unet, m.unet), "transformer": (build_transformer, m.transformer)}[kind]
    try:
        with torch.device("meta") if _DENOISER_ON_META.get() else contextlib.nullcontext():
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


def source_prediction_type(pipe) -> str:
    """What a diffusion-schedule pipeline's denoiser predicts, as its scheduler says (``epsilon`` unless told)."""
    prediction = pipe.scheduler.config.get("prediction_type") or "epsilon"
    if prediction not in ("epsilon", "v_prediction"):
        raise WorkbenchError(f"config key 'model.init_from': its scheduler's prediction type {prediction!r} is not "
                             "trained here (epsilon, v_prediction)")
    return prediction


def with_source_schedule(model, pipe):
    """``model`` on the noise schedule of the pipeline it was opened from (its scheduler's betas and timesteps),
    not the default one (``models.checkpoints.ddpm_scheduler``)."""
    from diffusers import DDPMScheduler

    c = pipe.scheduler.config
    model.noise_scheduler = DDPMScheduler(
        num_train_timesteps=c.get("num_train_timesteps", 1000), beta_start=c.get("beta_start", 0.0001),
        beta_end=c.get("beta_end", 0.02), beta_schedule=c.get("beta_schedule", "linear"),
        trained_betas=c.get("trained_betas"), prediction_type=model.prediction_type, clip_sample=False)
    model.register_buffer("alphas_cumprod", model.noise_scheduler.alphas_cumprod.clone(), persistent=False)
    return model


def source_denoiser(cfg: TrainConfig, denoiser):
    """A pipeline's denoiser as the run trains it: float32 (a half-precision file trains in full precision, as a
    built one does), gradient checkpointing where configured."""
    import torch

    if denoiser.dtype != torch.float32:  # diffusers warns about a cast that changes nothing
        denoiser = denoiser.to(torch.float32)
    if cfg.model.gradient_checkpointing:
        denoiser.enable_gradient_checkpointing()
    return denoiser


def source_parts(pipe, *names: str):
    """The pipeline's parts by name, in float32 (frozen parts compute as the built ones do)."""
    import torch

    return tuple(part.to(torch.float32) if isinstance(part, torch.nn.Module) and part.dtype != torch.float32 else part
                 for part in (getattr(pipe, name, None) for name in names))
