"""The app's requests: parameters, their validation and limits, and the call into ``train.generation``.

No Gradio here: the app, its tests and the benchmark call the same ``generate``. Image ``i`` of a batch
uses seed ``seed + i``; how a seed becomes an image, and the PNG parameters, are ``train.generation``'s.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable

from PIL import Image

from train.errors import WorkbenchError
from train.generation import (DEFAULT_GUIDANCE, DEFAULT_SAMPLER, DEFAULT_STEPS, DEFAULT_WEIGHTS,  # noqa: F401 - app's names
                              MAX_GUIDANCE, MAX_SEED, MAX_SIZE, MAX_STEPS, MIN_SIZE, ImageRecord, Settings, StepHook,
                              Stopped, check_sampler, generate_images)


@dataclass(frozen=True)
class Limits:
    """What one request, and one client at once, may ask for; `dwb app` flags set them."""

    max_steps: int = MAX_STEPS  # these four as in `dwb sample` (train.generation.defaults)
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
    # (338 s a 1024 px step). SD2-base makes 13.1M (512x512, 50 steps) in 1.49 s on one H200 (BENCHMARKS.md):
    # 250M is about half a minute there, and holds 512x512 at 50 steps in a batch of 8 (105M) or a 5x5 plot of
    # such images at 25 steps (164M).
    max_pixel_steps: int = 250_000_000
    # What one client (address) may have waiting or running at once: a quarter of the default queue of 16, and
    # two requests at the limit above. One client could fill the queue for everyone else.
    max_client_requests: int = 4
    max_client_pixel_steps: int = 500_000_000


class LimitError(WorkbenchError):
    """A request over one of the server's limits on work (``Limits``); refused when it joins the queue."""


def pixel_steps(params: GenerationParams, images: int | None = None) -> int:
    """What a request costs: width x height x steps for each of its images (``batch_size`` unless given)."""
    return params.width * params.height * params.steps * (params.batch_size if images is None else images)


def check_pixel_steps(cost: int, limits: Limits) -> int:
    """``cost``, or a one-line LimitError naming the limit and its flag."""
    if cost > limits.max_pixel_steps:
        raise LimitError(f"this request is {cost:,} pixel-steps (width x height x steps, for each image); at most "
                         f"{limits.max_pixel_steps:,} are allowed (dwb app --max-pixel-steps)")
    return cost


def check_client(held: list[int], cost: int, limits: Limits) -> None:
    """Whether a client holding requests of costs ``held`` (waiting or running) may add one of ``cost``."""
    if len(held) >= limits.max_client_requests:
        raise LimitError(f"this client has {len(held)} requests waiting or running; at most "
                         f"{limits.max_client_requests} at once (dwb app --max-client-requests)")
    if sum(held) + cost > limits.max_client_pixel_steps:
        raise LimitError(f"this client has {sum(held):,} pixel-steps waiting or running and this request adds "
                         f"{cost:,}; at most {limits.max_client_pixel_steps:,} at once "
                         "(dwb app --max-client-pixel-steps)")


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
    checked = GenerationParams(prompt, negative, params.sampler, steps, guidance, sizes["width"], sizes["height"],
                               seed, batch)
    check_pixel_steps(pixel_steps(checked), limits)
    return checked


def settings_of(params: GenerationParams) -> Settings:
    """The generation settings (``train.generation``) of validated request parameters."""
    return Settings(steps=params.steps, guidance=params.guidance, width=params.width, height=params.height,
                    sampler=params.sampler, negative_prompt=params.negative_prompt)


def generate(pipe, params: GenerationParams, *, on_step: StepHook | None = None,
             should_stop: Callable[[], bool] | None = None) -> list[Image.Image]:
    """``params.batch_size`` images from validated ``params``; image i from seed ``params.seed + i``."""
    images = generate_images(pipe, [params.prompt] * params.batch_size, params.seeds(), settings_of(params),
                             on_step=on_step, should_stop=should_stop)
    return [Image.fromarray(image) for image in images]


def record_of(params: GenerationParams, index: int, checkpoint: str, checkpoint_hash: str, weights: str) -> ImageRecord:
    """How image ``index`` of a request was made."""
    return ImageRecord.of(settings_of(params), params.prompt, params.seed + index, (params.width, params.height),
                          params.sampler, checkpoint, checkpoint_hash, weights)
