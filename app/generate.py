"""The app's requests: parameters, their validation and limits, and the call into ``models.generation``.

No Gradio here: the app, its tests and the benchmark call the same ``generate``. Image ``i`` of a batch
uses seed ``seed + i``; how a seed becomes an image, and the PNG parameters, are ``models.generation``'s.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

from PIL import Image

from models.errors import WorkbenchError
from models.generation import (DEFAULT_GUIDANCE, DEFAULT_SAMPLER, DEFAULT_STEPS, DEFAULT_WEIGHTS,  # noqa: F401 - app's names
                               DEFAULT_REFINER_SWITCH, MAX_GUIDANCE, MAX_SEED, MAX_SIZE, MAX_STEPS, MIN_SIZE,
                               MAX_CLIP_SKIP, Control, HiresFix, ImageRecord, InitImage, Refiner, Settings, StepHook,
                               Stopped, check_sampler, generate_images)


# What a million pixel-steps cost, for the refusal's estimate, measured with SD2-base's UNet (classifier-free
# guidance: a batch of 2) at 512x512: 19.8 s a step on a 2-core CPU (x86_64, torch 2.7, float32), 75 s a
# million; on one H200, 13.1M (512x512, 50 steps) in 1.49 s (BENCHMARKS.md), 0.11 s a million. The tiny demo
# model on the same CPU: 0.07 s a step at 32 px (its fixed cost), 10.5 s a step at 512 px (40 s a million) and
# 338 s at 1024 px (322 s a million: attention over every latent pixel).
SECONDS_PER_MILLION = {"cpu": 75.0, "gpu": 0.114}
# The default of --max-pixel-steps by device. On a GPU, 250M is about half a minute of SD2-base and holds
# 512x512 at 50 steps in a batch of 8 (105M). On a CPU the same 250M is 5 h of SD2-base (and 1024x1024 at 150
# steps, 157M, held the only slot for 14 h with the tiny model): 8M is about 10 min of SD2-base, room for one
# 512x512 image at 25 steps (6.6M), or 30 steps of the tiny model at 512x512 (5 min).
DEFAULT_PIXEL_STEPS = {"cpu": 8_000_000, "gpu": 250_000_000}


def device_class(device: str) -> str:
    """"cpu" or "gpu" (CUDA, or any other accelerator), for the defaults and estimates above."""
    return "cpu" if str(device).split(":")[0] == "cpu" else "gpu"


@dataclass(frozen=True)
class Limits:
    """What one request, and one client at once, may ask for; `dwb app` flags set them."""

    max_steps: int = MAX_STEPS  # these four as in `dwb sample` (models.generation.defaults)
    min_size: int = MIN_SIZE
    max_size: int = MAX_SIZE
    max_batch: int = 8
    max_guidance: float = MAX_GUIDANCE
    # CLIP reads 77 tokens (a few hundred characters); a 4 MB prompt held the only generation slot for
    # 108 s (tokenizing it, then writing it twice into every PNG), so longer text is refused at once.
    max_prompt_chars: int = 2000
    max_cells: int = 100  # images in one X/Y/Z plot
    # Work in pixel-steps (width x height x steps, summed over a request's images). Each limit above alone let
    # one request ask for 1024x1024, 150 steps, batch 8: 1,258M pixel-steps, ~4.7 days of the CPU demo model
    # (338 s a 1024 px step). The default depends on the device (DEFAULT_PIXEL_STEPS; ``for_device``).
    max_pixel_steps: int = DEFAULT_PIXEL_STEPS["gpu"]
    # What one client (address) may have waiting or running at once: a quarter of the default queue of 16, and
    # two requests at the limit above. One client could fill the queue for everyone else.
    max_client_requests: int = 4
    max_client_pixel_steps: int = 2 * DEFAULT_PIXEL_STEPS["gpu"]
    device: str = "gpu"  # "cpu" or "gpu": what the refusal's estimate of the time is for

    @classmethod
    def for_device(cls, device: str, *, max_pixel_steps: int | None = None, max_client_pixel_steps: int | None = None,
                   **flags) -> "Limits":
        """The limits on ``device`` ("cpu", "cuda:0"...): the pixel-step limits its defaults unless given (a client:
        two requests at the request's limit)."""
        kind = device_class(device)
        per_request = max_pixel_steps or DEFAULT_PIXEL_STEPS[kind]
        return cls(max_pixel_steps=per_request, max_client_pixel_steps=max_client_pixel_steps or 2 * per_request,
                   device=kind, **flags)


class LimitError(WorkbenchError):
    """A request over one of the server's limits on work (``Limits``); refused when it joins the queue."""


def pixel_steps(params: GenerationParams, images: int | None = None) -> int:
    """What a request costs: width x height x steps for each of its images (``batch_size`` unless given), and a hires
    fix's second draw at its enlarged size and its steps."""
    cost = params.width * params.height * params.steps
    if params.hires is not None:
        width, height = params.hires.target(params.width, params.height, 8)
        cost += width * height * params.hires.steps_of(params.steps)
    return cost * (params.batch_size if images is None else images)


def check_pixel_steps(cost: int, limits: Limits) -> int:
    """``cost``, or a one-line LimitError naming the limit and its flag, and the time the request would take."""
    if cost > limits.max_pixel_steps:
        rate = SECONDS_PER_MILLION[limits.device]
        raise LimitError(f"this request is {cost:,} pixel-steps (width x height x steps, for each image); at most "
                         f"{limits.max_pixel_steps:,} are allowed (dwb app --max-pixel-steps): on this server's "
                         f"{limits.device.upper()} an SD2-size model takes about {rate:g} s a million, so it would "
                         f"hold the generation slot for about {duration(cost / 1e6 * rate)}")
    return cost


def duration(seconds: float) -> str:
    """``42 s``, ``17 min``, ``3.3 h``, ``4.7 days``."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.1f} {unit}" if unit in ("days", "h") else f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def check_client(held: list[int], cost: int, limits: Limits) -> None:
    """Whether a client holding requests of costs ``held`` (waiting or running) may add one of ``cost``."""
    if len(held) >= limits.max_client_requests:
        raise LimitError(f"this client has {len(held)} requests waiting or running; at most "
                         f"{limits.max_client_requests} at once (dwb app --max-client-requests)")
    if sum(held) + cost > limits.max_client_pixel_steps:
        raise LimitError(f"this client has {sum(held):,} pixel-steps waiting or running and this request adds "
                         f"{cost:,}; at most {limits.max_client_pixel_steps:,} at once "
                         "(dwb app --max-client-pixel-steps)")


# Characters in a checkpoint's name (a label, a path under the roots, a hub id): Linux opens no path longer than
# 4,096 bytes (PATH_MAX). Checked before any filesystem work: a 1 MB name of 500,000 "a/" parts took 48 s to
# resolve, holding the GIL, and every other client waited.
MAX_CHECKPOINT_CHARS = 4096


def checkpoint_name(value) -> str:
    """A checkpoint's name as a request sent it; one-line WorkbenchError for another type or a name too long to be
    a path."""
    if not isinstance(value, str):
        raise WorkbenchError(f"a checkpoint is named by one text, got {type(value).__name__}")
    if len(value) > MAX_CHECKPOINT_CHARS:
        raise WorkbenchError(f"a checkpoint name of {len(value):,} characters; at most {MAX_CHECKPOINT_CHARS:,} are "
                             "accepted (no longer path can be opened)")
    return value


@dataclass
class GenerationParams:
    prompt: str
    negative_prompt: str = ""
    sampler: str = DEFAULT_SAMPLER
    steps: int = DEFAULT_STEPS
    guidance: float = DEFAULT_GUIDANCE
    width: int = 512
    height: int = 512
    seed: int = -1
    batch_size: int = 1
    refiner: str = ""  # a refiner checkpoint's name (SDXL's), or "" for the base alone
    refiner_switch: float = DEFAULT_REFINER_SWITCH
    init: InitImage | None = None  # image to image or inpainting from it (``app.modes``); None: from the prompt alone
    hires: HiresFix | None = None  # a hires fix of the text-to-image draw; None: drawn once
    clip_skip: int = 1  # A1111's Clip skip (``models.generation.Settings``)
    vae: str = ""  # a VAE under the folders drawn with in place of the checkpoint's own (``Service.vae``); "": its own
    # a ControlNet steering the draw (``app.modes.control_request``: named, then opened by ``Service.controlled``)
    control: Control | None = None

    def seeds(self) -> list[int]:
        """Image i of the batch uses ``seed + i`` (call after ``validate``, which fixes a random seed)."""
        return [self.seed + i for i in range(self.batch_size)]


def shown(value, width: int = 40) -> str:
    """``repr(value)`` cut to ``width`` characters: messages quote what was sent, never megabytes of it."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def whole_number(name: str, value, lo: int, hi: int) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise WorkbenchError(f"{name} must be a whole number, got {shown(value)}") from None
    if not math.isfinite(number) or number != int(number):
        raise WorkbenchError(f"{name} must be a whole number, got {shown(value)}")
    if not lo <= number <= hi:
        raise WorkbenchError(f"{name} must be between {lo} and {hi}, got {int(number)}")
    return int(number)


def text(name: str, value, max_chars: int) -> str:
    """A text parameter as a string (None reads as empty); one-line WorkbenchError for another type or a long one."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise WorkbenchError(f"{name} must be text, got {type(value).__name__}")
    if len(value) > max_chars:
        raise WorkbenchError(f"{name} is {len(value):,} characters long; at most {max_chars:,} are accepted")
    return value


def validate(params: GenerationParams, limits: Limits, *, need_prompt: bool = True) -> GenerationParams:
    """Checked and normalised parameters (a random seed drawn for -1); one-line WorkbenchError otherwise (a
    LimitError for a request over ``max_pixel_steps``)."""
    prompt = text("prompt", params.prompt, limits.max_prompt_chars)
    negative = text("negative prompt", params.negative_prompt, limits.max_prompt_chars)
    if need_prompt and not prompt.strip():
        raise WorkbenchError("the prompt is empty: describe the image to generate")
    check_sampler(text("sampler", params.sampler, 100))
    steps = whole_number("steps", params.steps, 1, limits.max_steps)
    sizes = {}
    for name in ("width", "height"):
        size = whole_number(name, getattr(params, name), limits.min_size, limits.max_size)
        if size % 8:
            raise WorkbenchError(f"{name} must be a multiple of 8, got {size}")
        sizes[name] = size
    try:
        guidance = float(params.guidance)
    except (TypeError, ValueError):
        raise WorkbenchError(f"guidance scale must be a number, got {shown(params.guidance)}") from None
    if not (math.isfinite(guidance) and 0 <= guidance <= limits.max_guidance):
        raise WorkbenchError(f"guidance scale must be between 0 and {limits.max_guidance:g}, got {guidance:g}")
    batch = whole_number("batch size", params.batch_size, 1, limits.max_batch)
    seed = whole_number("seed", params.seed, -1, MAX_SEED)
    if seed == -1:
        seed = random.randint(0, MAX_SEED - batch + 1)
    elif seed + batch - 1 > MAX_SEED:
        raise WorkbenchError(f"seed + batch size - 1 must be at most {MAX_SEED}, got {seed + batch - 1}")
    refiner = checkpoint_name(params.refiner or "").strip()
    checked = GenerationParams(prompt, negative, params.sampler, steps, guidance, sizes["width"], sizes["height"],
                               seed, batch, refiner, refiner_switch(params.refiner_switch) if refiner else
                               DEFAULT_REFINER_SWITCH, params.init, params.hires,
                               whole_number("clip skip", params.clip_skip, 1, MAX_CLIP_SKIP),
                               checkpoint_name(params.vae or "").strip(), params.control)
    check_pixel_steps(pixel_steps(checked), limits)
    return checked


def refiner_switch(value) -> float:
    """The refiner switch a request sent: a number strictly between 0 and 1; one-line WorkbenchError otherwise."""
    try:
        switch = float(value)
    except (TypeError, ValueError):
        raise WorkbenchError(f"refiner switch must be a number, got {shown(value)}") from None
    if not 0 < switch < 1:  # NaN too
        raise WorkbenchError(f"refiner switch must be between 0 and 1 (the fraction of the steps the base takes), "
                             f"got {switch:g}")
    return switch


def settings_of(params: GenerationParams, refiner: Refiner | None = None, loras=(), vae=None) -> Settings:
    """The generation settings (``models.generation``) of validated request parameters, with the refiner their
    ``refiner`` names, opened, the LoRAs their prompt's tags name, applied (``models.checkpoints.ChosenLora``), and
    the VAE their ``vae`` names, opened (``models.checkpoints.OpenedVae``)."""
    return Settings(steps=params.steps, guidance=params.guidance, width=params.width, height=params.height,
                    sampler=params.sampler, negative_prompt=params.negative_prompt, refiner=refiner, init=params.init,
                    hires=params.hires, clip_skip=params.clip_skip, vae=vae, control=params.control,
                    loras=tuple((c.name, c.hash, c.strength) for c in loras), prompt_weighting=True)


def generate(pipe, params: GenerationParams, *, on_step: StepHook | None = None,
             should_stop: Callable[[], bool] | None = None, refiner: Refiner | None = None,
             vae=None) -> list[Image.Image]:
    """``params.batch_size`` images from validated ``params``; image i from seed ``params.seed + i``."""
    images = generate_images(pipe, [params.prompt] * params.batch_size, params.seeds(),
                             settings_of(params, refiner, vae=vae),
                             on_step=on_step, should_stop=should_stop)
    return [Image.fromarray(image) for image in images]


def record_of(params: GenerationParams, index: int, checkpoint: str, checkpoint_hash: str, weights: str,
              guidance_kind: str = "cfg", refiner: Refiner | None = None, loras=(), vae=None) -> ImageRecord:
    """How image ``index`` of a request was made (``guidance_kind``: how its model took the guidance scale; the prompt
    with its ``<lora:...>`` tags, as A1111 records it, and the LoRAs they named)."""
    return ImageRecord.of(settings_of(params, refiner, loras, vae), params.prompt, params.seed + index,
                          (params.width, params.height), params.sampler, checkpoint, checkpoint_hash, weights,
                          guidance_kind)
