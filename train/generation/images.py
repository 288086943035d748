"""One way from prompts and seeds to images.

Everything that generates goes through ``generate_images``: the grids (`dwb sample`, the demo), evaluate's
sample sets and the app. So the same (checkpoint, prompt, seed, settings) gives the same image in each.

**Seeds.** Every image has its own seed, and its starting noise is drawn from
``torch.Generator("cpu").manual_seed(seed)`` alone: a CPU generator, so a seed means the same noise on any
device, and one generator per image, so its noise does not depend on what else is in the batch. Callers
choose the seeds (the app: the typed seed + i; evaluate: one per (prompt, image) from its base seed; the
grids: one per column). A batch is one pipeline call; an image made in a batch equals the one made alone
with its seed up to float rounding in batched kernels, and bit for bit with the same batch composition.
How an image was made is written into its PNG by ``train.generation.png``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import WorkbenchError
from ..families import family_of_pipeline
from .defaults import DEFAULT_GUIDANCE, DEFAULT_SAMPLER, DEFAULT_SIZE, DEFAULT_STEPS
from .samplers import make_sampler

StepHook = Callable[[int, int], None]  # (steps done, steps in all) after each denoising step


@dataclass(frozen=True)
class Settings:
    """How to sample: the same for every image of one call; unset, the workbench's defaults (``defaults``)."""

    steps: int = DEFAULT_STEPS
    guidance: float = DEFAULT_GUIDANCE
    width: int | None = DEFAULT_SIZE  # None: the model's native size
    height: int | None = DEFAULT_SIZE
    sampler: str | None = DEFAULT_SAMPLER  # a name in train.generation.SAMPLERS; None: DEFAULT_SAMPLER
    negative_prompt: str = ""


class Stopped(Exception):
    """``should_stop`` said so; raised from the step callback, so the pipeline call ends there."""


def native_size(pipe) -> int:
    """The side a pipeline draws at when none is given: its default latent size (a UNet's or transformer's sample
    size; Flux.1's fixed 128) in pixels."""
    latent = getattr(pipe, "default_sample_size", None) or pipe.unet.config.sample_size
    return latent * pipe.vae_scale_factor


def sampler_of(settings: Settings) -> str:
    """The sampler's name a call with these settings uses."""
    return settings.sampler or DEFAULT_SAMPLER


def guidance_kind_of(pipe) -> str:
    """How the pipeline's model takes its guidance scale (``train.families.GUIDANCE_KINDS``), for its records."""
    family = family_of_pipeline(pipe)
    return family.variant_of(getattr(pipe, family.denoiser).config).guidance


@torch.no_grad()
def generate_images(pipe, prompts: list[str], seeds: list[int], settings: Settings, *,
                    on_step: StepHook | None = None, should_stop: Callable[[], bool] | None = None) -> np.ndarray:
    """(B, H, W, 3) uint8 images, image i from ``prompts[i]`` and ``seeds[i]``, in one pipeline call.

    The pipeline is never modified: the call runs on a lightweight pipeline sharing its modules with a
    fresh scheduler, so concurrent calls with different samplers do not interfere.
    """
    if len(prompts) != len(seeds):
        raise ValueError("one seed per prompt")
    family = family_of_pipeline(pipe)
    family.check_sampler(sampler_of(settings))
    variant = family.variant_of(getattr(pipe, family.denoiser).config)
    conditioning = family.pipeline_arguments(variant, settings.guidance, settings.negative_prompt, len(prompts))
    width, height = settings.width or native_size(pipe), settings.height or native_size(pipe)
    multiple = family.size_multiple(pipe)
    if width % multiple or height % multiple:
        raise WorkbenchError(f"{family.label} draws sides that are multiples of {multiple}; {width}x{height} is not")
    scheduler = make_sampler(sampler_of(settings), pipe.scheduler.config)
    run = type(pipe)(**{**pipe.components, "scheduler": scheduler, **family.pipeline_options})
    run.set_progress_bar_config(disable=True)

    def step_end(p, i: int, t, tensors: dict) -> dict:
        if should_stop is not None and should_stop():
            raise Stopped(f"stopped after {i + 1} of {p.num_timesteps} steps")
        if on_step is not None:
            on_step(i + 1, p.num_timesteps)
        return {}

    images = run(list(prompts), num_inference_steps=settings.steps, **conditioning,
                 width=width, height=height,
                 generator=[torch.Generator("cpu").manual_seed(int(s)) for s in seeds], output_type="np",
                 callback_on_step_end=step_end).images
    return (images * 255).round().astype(np.uint8)
