"""One way from prompts and seeds to images.

Everything that generates goes through ``generate_images``: the grids (`dwb sample`, the demo), evaluate's
sample sets and the app. So the same (checkpoint, prompt, seed, settings) gives the same image in each.

**Seeds.** Every image has its own seed, and its starting noise is drawn from
``torch.Generator("cpu").manual_seed(seed)`` alone: a CPU generator, so a seed means the same noise on any
device, and one generator per image, so its noise does not depend on what else is in the batch. Callers
choose the seeds (the app: the typed seed + i; evaluate: one per (prompt, image) from its base seed; the
grids: one per column). A batch is one pipeline call; an image made in a batch equals the one made alone
with its seed up to float rounding in batched kernels, and bit for bit with the same batch composition.
How an image was made is written into its PNG by ``models.generation.png``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import WorkbenchError
from ..families import FAMILIES, family_of_pipeline
from .defaults import (DEFAULT_GUIDANCE, DEFAULT_REFINER_SWITCH, DEFAULT_SAMPLER, DEFAULT_SIZE, DEFAULT_STEPS,
                       check_drawable)
from .modes import MAX_CLIP_SKIP, Control, HiresFix, InitImage, upscale_latents, upscale_pixels
from .prompt_weights import check_prompt_weights, plain_prompt, prompt_conditioning
from .samplers import make_sampler

StepHook = Callable[[int, int], None]  # (steps done, steps in all) after each denoising step


@dataclass(frozen=True)
class Refiner:
    """A second stage (SDXL's refiner): the base denoises the schedule up to ``switch`` and hands its latents to
    ``pipe`` (the refiner's own pipeline, from ``models.checkpoints.load_pipeline(ref, refiner=True)``), which
    denoises the rest with the same prompts, seeds' generators, sampler, steps and guidance."""

    pipe: object = field(repr=False, compare=False)
    name: str  # the refiner checkpoint's label, for the images' records
    hash: str  # its content hash
    switch: float = DEFAULT_REFINER_SWITCH

    def __post_init__(self):
        switch = self.switch
        if isinstance(switch, bool) or not isinstance(switch, (int, float)) or not 0 < switch < 1:
            raise WorkbenchError(f"the refiner switch is the fraction of the steps the base takes, between 0 and 1 "
                                 f"(not either); got {switch!r}")
        object.__setattr__(self, "switch", float(switch))


@dataclass(frozen=True)
class Settings:
    """How to sample: the same for every image of one call; unset, the workbench's defaults (``defaults``)."""

    steps: int = DEFAULT_STEPS
    guidance: float = DEFAULT_GUIDANCE
    width: int | None = DEFAULT_SIZE  # None: the model's native size
    height: int | None = DEFAULT_SIZE
    sampler: str | None = DEFAULT_SAMPLER  # a name in models.generation.SAMPLERS; None: DEFAULT_SAMPLER
    negative_prompt: str = ""
    refiner: Refiner | None = None  # a second stage that finishes the base's schedule; None: the base alone
    init: InitImage | None = None  # image to image (with a mask: inpainting) from it; None: from noise (``modes``)
    hires: HiresFix | None = None  # the text-to-image draw enlarged and redrawn (``modes``); None: drawn once
    # A1111's "Clip skip": 1 conditions on the text towers' usual layer, 2 on the one before it (diffusers' clip_skip 1)
    clip_skip: int = 1
    # the adapters applied to the pipeline (``models.adapters.apply_adapters``), for the record: (name, AUTOMATIC1111's
    # short hash, strength) each
    loras: tuple[tuple[str, str, float], ...] = ()
    control: Control | None = None  # a ControlNet steering a text-to-image draw (``modes``); None: none
    # a VAE in place of the checkpoint's own (AUTOMATIC1111's SD VAE): what ``models.checkpoints.open_vae`` gives, its
    # ``model`` judged to make the same latents, its ``name`` and ``hash`` for the record; None: the checkpoint's
    vae: object | None = None
    # whether prompts are read as AUTOMATIC1111 reads them ((word:1.2), [word], BREAK: ``prompt_weights``), as `dwb
    # sample` and the app, where people type them; False: as literal text (prompt sets, evaluate, training previews)
    prompt_weighting: bool = False


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
    """How the pipeline's model takes its guidance scale (``models.families.GUIDANCE_KINDS``), for its records."""
    family = family_of_pipeline(pipe)
    return family.variant_of(getattr(pipe, family.denoiser).config).guidance


@torch.no_grad()
def generate_images(pipe, prompts: list[str], seeds: list[int], settings: Settings, *,
                    on_step: StepHook | None = None, should_stop: Callable[[], bool] | None = None) -> np.ndarray:
    """(B, H, W, 3) uint8 images, image i from ``prompts[i]`` and ``seeds[i]``, in one pipeline call (two with a
    refiner or a hires fix): from text, or from ``settings.init`` (image to image, inpainting; ``modes``).

    The pipeline is never modified: the call runs on a lightweight pipeline sharing its modules with a
    fresh scheduler, so concurrent calls with different samplers do not interfere.
    """
    if len(prompts) != len(seeds):
        raise ValueError("one seed per prompt")
    family = family_of_pipeline(pipe)
    family.check_sampler(sampler_of(settings))
    denoiser_config = getattr(pipe, family.denoiser).config
    variant = family.variant_of(denoiser_config)
    conditioning = {**family.pipeline_arguments(variant, settings.guidance, settings.negative_prompt, len(prompts)),
                    **family.call_options(denoiser_config, family.has_all_text_encoders(pipe)),
                    **family.text_length(pipe)}
    width, height = settings.width or native_size(pipe), settings.height or native_size(pipe)
    check_drawable(family, (width, height), "the size", limits=None)  # the one rule (the caller's limits held)
    if settings.refiner is not None:
        check_refiner(family, variant, settings.refiner)
    check_modes(family, denoiser_config, settings)
    if settings.prompt_weighting:
        check_prompt_weights(family, [*prompts, settings.negative_prompt], settings.clip_skip)
    if settings.vae is not None:  # every call below is made on this copy, its VAE swapped
        pipe = _sampling_copy(pipe, sampler_of(settings), family.pipeline_options, added={"vae": settings.vae.model})
    generators = [torch.Generator("cpu").manual_seed(int(s)) for s in seeds]
    call = dict(num_inference_steps=settings.steps, **conditioning, **clip_skip_option(family, settings.clip_skip),
                generator=generators)
    if settings.control is not None:
        images = _controlled(pipe, family, settings, list(prompts), (width, height), call, on_step, should_stop)
        return (images * 255).round().astype(np.uint8)
    if settings.init is not None or settings.hires is not None:
        draw = _from_image if settings.init is not None else _hires_fix
        images = draw(pipe, family, settings, list(prompts), (width, height), call, on_step, should_stop)
        return (images * 255).round().astype(np.uint8)
    run = _sampling_copy(pipe, sampler_of(settings), family.pipeline_options)
    if settings.refiner is None:
        images = _call(run, pipe, family, settings, prompts, width=width, height=height, output_type="np",
                       callback_on_step_end=_step_end(on_step, should_stop), **call).images
        return (images * 255).round().astype(np.uint8)
    # The published two-stage use: the base stops at the switch and returns its latents, the refiner starts there
    # (no noise added) with the same generators, so each image's noise still comes from its seed alone.
    switch, done = settings.refiner.switch, [0]
    latents = _call(run, pipe, family, settings, prompts, width=width, height=height, denoising_end=switch,
                    output_type="latent", callback_on_step_end=_step_end(on_step, should_stop, done, base=True),
                    **call).images
    refine = _sampling_copy(settings.refiner.pipe, sampler_of(settings), family.pipeline_options,
                            added=None if settings.vae is None else {"vae": settings.vae.model})
    images = _call(refine, settings.refiner.pipe, family, settings, prompts, image=latents, denoising_start=switch,
                   output_type="np", callback_on_step_end=_step_end(on_step, should_stop, done), **call).images
    return (images * 255).round().astype(np.uint8)


def _call(run, pipe, family, settings: Settings, prompts, **arguments):
    """``run`` (a copy of ``pipe``, whose text towers it shares) called with its text: compel's embeddings where a
    prompt or the negative prompt is weighted (``prompt_weights``; they hold the negative prompt and the clip skip),
    the prompts as AUTOMATIC1111 reads them otherwise (as typed, where they hold no weighting syntax); without
    ``settings.prompt_weighting``, the prompts as they are."""
    if not settings.prompt_weighting:
        return run(list(prompts), **arguments)
    weighted = prompt_conditioning(pipe, run, family, list(prompts), settings.negative_prompt, settings.clip_skip)
    if weighted is None:
        if "negative_prompt" in arguments:
            arguments["negative_prompt"] = [plain_prompt(p) for p in arguments["negative_prompt"]]
        return run([plain_prompt(p) for p in prompts], **arguments)
    return run(**weighted, **{k: v for k, v in arguments.items() if k not in ("negative_prompt", "clip_skip")})


def _sampling_copy(pipe, sampler: str, options: dict, cls_name: str | None = None, added: dict | None = None):
    """A lightweight pipeline sharing ``pipe``'s modules and settings with a fresh scheduler of ``sampler``: of
    ``pipe``'s class, or of the diffusers pipeline ``cls_name`` (its family's image-to-image or inpainting one,
    given the modules it takes, as diffusers' ``from_pipe`` builds one). ``components`` holds the modules only: the
    settings its folder saved (the refiner's ``requires_aesthetics_score``, without which its UNet is given six time
    ids for five) are copied from its config."""
    import diffusers

    cls = type(pipe) if cls_name is None else getattr(diffusers, cls_name)
    expected, optional = cls._get_signature_keys(cls)
    saved = {k: v for k, v in pipe.config.items() if k in optional and isinstance(v, (bool, int, float, str))}
    modules = {k: v for k, v in {**pipe.components, **(added or {})}.items() if k in expected or k in optional}
    run = cls(**{**modules, **saved, "scheduler": make_sampler(sampler, pipe.scheduler.config), **options})
    run.set_progress_bar_config(disable=True)
    return run


def _step_end(on_step: StepHook | None, should_stop: Callable[[], bool] | None, done: list[int] | None = None,
              base: bool = False):
    """The step callback of one pipeline call; ``done`` counts the steps of a refined call's two stages: the
    ``base`` stage reports against its whole schedule (its scheduler holds it; the pipeline stops at the switch),
    the refiner's against what the base did plus its own."""
    done = [0] if done is None else done
    before = done[0]

    def step_end(p, i: int, t, tensors: dict) -> dict:
        total = len(p.scheduler.timesteps) if base else before + p.num_timesteps
        if should_stop is not None and should_stop():
            raise Stopped(f"stopped after {before + i + 1} of {total} steps")
        done[0] = before + i + 1
        if on_step is not None:
            on_step(done[0], total)
        return {}

    return step_end


def check_modes(family, denoiser_config: dict, settings: Settings) -> None:
    """A one-line error unless the family draws what ``settings`` start from (an init image, a mask, a hires fix)
    with this denoiser: an inpainting model draws only with a mask, and a refiner or a hires fix follows a
    text-to-image draw alone."""
    init, hires = settings.init, settings.hires
    if family.takes_mask(denoiser_config) and (init is None or init.mask is None):
        raise WorkbenchError(f"this {family.label} model is an inpainting model (its denoiser takes a mask and the "
                             "masked image beside its latents): it draws from an init image and a mask")
    if settings.refiner is not None and (init is not None or hires is not None):
        raise WorkbenchError("a refiner finishes a text-to-image draw: give it without an init image or a hires fix")
    if settings.control is not None and (init is not None or hires is not None or settings.refiner is not None):
        raise WorkbenchError("a ControlNet steers a text-to-image draw here: give it without an init image, a hires "
                             "fix or a refiner")
    if settings.control is not None and family.controlnet_pipeline is None:
        raise WorkbenchError(f"{family.label} has no ControlNet pipeline here")
    if init is not None and hires is not None:
        raise WorkbenchError("a hires fix enlarges a text-to-image draw: give it without an init image")
    wanted = ((init.mode, family.inpaint_pipeline if init.mask is not None else family.img2img_pipeline)
              if init is not None else ("hires fix", family.img2img_pipeline) if hires is not None else ("", ""))
    if wanted[1] is None:
        raise WorkbenchError(f"{family.label} has no {wanted[0]} pipeline in diffusers")
    redraw = (init.strength, settings.steps) if init is not None else \
        (hires.strength, hires.steps_of(settings.steps)) if hires is not None else None
    if redraw is not None and int(redraw[0] * redraw[1]) < 1:  # SD's pipelines crashed on an empty batch
        raise WorkbenchError(f"denoising strength {redraw[0]:g} of {redraw[1]} steps redraws none of them: raise the "
                             "steps or the strength")




def clip_skip_option(family, clip_skip: int) -> dict:
    """The pipeline call's ``clip_skip`` (layers skipped: A1111's Clip skip less one) where it is above 1; a one-line
    error for a number outside 1 to MAX_CLIP_SKIP, or above 1 for a family whose pipelines take none."""
    if isinstance(clip_skip, bool) or not isinstance(clip_skip, int) or not 1 <= clip_skip <= MAX_CLIP_SKIP:
        raise WorkbenchError(f"clip skip must be a whole number from 1 to {MAX_CLIP_SKIP}, got {str(clip_skip)[:40]!r}")
    if clip_skip == 1:
        return {}
    if not family.takes_clip_skip:
        raise WorkbenchError(f"{family.label} takes no clip skip: its CLIP tower gives its pooled output alone")
    return {"clip_skip": clip_skip - 1}


def _sized(run, size: tuple[int, int]) -> dict:
    """The (width, height) a pipeline's call takes where it takes them (SD's and SDXL's image-to-image draw at the
    size of their image, which ``InitImage.fitted`` gave)."""
    import inspect

    takes = inspect.signature(run.__call__).parameters
    return {"width": size[0], "height": size[1]} if "width" in takes else {}


def _from_image(pipe, family, settings: Settings, prompts: list[str], size: tuple[int, int], call: dict,
                on_step, should_stop) -> np.ndarray:
    """Image to image, or inpainting with a mask: the family's own pipeline for it, called with the init image
    (and mask, blurred by diffusers' mask processor) at the drawn size; (B, H, W, 3) floats in [0, 1]."""
    init = settings.init
    name = family.inpaint_pipeline if init.mask is not None else family.img2img_pipeline
    run = _sampling_copy(pipe, sampler_of(settings), family.pipeline_options, name)
    image, mask = init.fitted(*size)
    # one init image per prompt, so image i's VAE draw is from generator i alone (SD3's pipeline, given one image
    # for two generators, encoded an empty slice for the second)
    inputs = {"image": [image] * len(prompts), "strength": init.strength}
    if mask is not None:
        blurred = run.mask_processor.blur(mask, init.mask_blur) if init.mask_blur else mask
        inputs["mask_image"] = [blurred] * len(prompts)
    return _call(run, pipe, family, settings, prompts, **inputs, **_sized(run, size), output_type="np",
                 callback_on_step_end=_step_end(on_step, should_stop), **call).images


def _controlled(pipe, family, settings: Settings, prompts: list[str], size: tuple[int, int], call: dict,
                on_step, should_stop) -> np.ndarray:
    """Text to image steered by a ControlNet: the family's ControlNet pipeline around the pipeline's modules and the
    ControlNet, given the control image once (diffusers repeats it for each prompt and resizes it to ``size``) at the
    control's weight, start and end; (B, H, W, 3) floats in [0, 1]."""
    control = settings.control
    run = _sampling_copy(pipe, sampler_of(settings), family.pipeline_options, family.controlnet_pipeline,
                         {"controlnet": control.model})
    return _call(run, pipe, family, settings, prompts, image=control.hint(),
                 controlnet_conditioning_scale=control.weight, control_guidance_start=control.start,
                 control_guidance_end=control.end, width=size[0], height=size[1], output_type="np",
                 callback_on_step_end=_step_end(on_step, should_stop), **call).images


def _hires_fix(pipe, family, settings: Settings, prompts: list[str], size: tuple[int, int], call: dict,
               on_step, should_stop) -> np.ndarray:
    """A1111's hires fix as diffusers' two calls: text to image at ``size`` (its latents, or its pixels), enlarged
    by the upscaler, then image to image at the hires strength with the same generators; (B, H, W, 3) floats."""
    from ..families import unpack_latents

    hires, (width, height), done = settings.hires, size, [0]
    run = _sampling_copy(pipe, sampler_of(settings), family.pipeline_options)
    first = _call(run, pipe, family, settings, prompts, width=width, height=height,
                  output_type="latent" if hires.in_latents else "np",
                  callback_on_step_end=_step_end(on_step, should_stop, done), **call).images
    target, scale = hires.target(width, height, family.size_multiple(pipe)), pipe.vae_scale_factor
    if hires.in_latents:
        if family.latent_packing > 1:  # Flux.1's latents come back packed into 2x2 patches
            first = unpack_latents(first, height // scale, width // scale)
        image = upscale_latents(first, (target[1] // scale, target[0] // scale), hires.upscaler)
    else:
        image = upscale_pixels(first, target, hires.upscaler)
    refine = _sampling_copy(pipe, sampler_of(settings), family.pipeline_options, family.img2img_pipeline)
    second = {**call, "num_inference_steps": hires.steps_of(settings.steps)}
    return _call(refine, pipe, family, settings, prompts, image=image, strength=hires.strength,
                 **_sized(refine, target), output_type="np",
                 callback_on_step_end=_step_end(on_step, should_stop, done), **second).images


def check_refiner(family, base, refiner: Refiner) -> None:
    """A one-line error unless ``refiner`` can finish what a ``base`` variant of ``family`` starts: a refiner of
    the same family, after a base that is not itself one."""
    if family.refiner_pipeline is None:
        having = ", ".join(f.label for f in FAMILIES if f.refiner_pipeline)
        raise WorkbenchError(f"{family.label} has no refiner stage: a refiner finishes the latents of a base of its "
                             f"own family ({having})")
    if base.refiner:
        raise WorkbenchError(f"the base is a {family.label} refiner, which draws nothing from text alone")
    refiner_family = family_of_pipeline(refiner.pipe)
    refiner_variant = refiner_family.variant_of(getattr(refiner.pipe, refiner_family.denoiser).config)
    if refiner_family is not family or not refiner_variant.refiner:
        raise WorkbenchError(f"{refiner.name} is a {refiner_family.label} ({refiner_variant.name}) model, not a "
                             f"refiner of {family.label}")
