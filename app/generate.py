"""Text-to-image generation with a loaded pipeline: parameters, validation, samplers, seeds, PNG metadata.

No Gradio here: the app, its tests and the benchmark call the same ``generate``.

Seeds: image ``i`` of a batch starts from the noise of ``torch.Generator("cpu").manual_seed(seed + i)``
(a CPU generator, so a seed means the same noise on any device). The batch is one pipeline call
with one generator per image, so image ``i`` equals, up to float rounding in batched kernels, the
image generated alone with seed ``seed + i`` and batch size 1.
"""
from __future__ import annotations

import json
import math
import random
import re
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from diffusers import StableDiffusionPipeline
from PIL import Image, PngImagePlugin

from train.errors import WorkbenchError
from train.samplers import DEFAULT_SAMPLER, SAMPLERS, make_sampler

MAX_SEED = 2**32 - 1  # seeds are 32-bit, as in A1111 and ComfyUI; -1 asks for a random one

# Samplers by the names A1111 shows, built from the pipeline's own scheduler config (train owns them).
SCHEDULERS = SAMPLERS
DEFAULT_SCHEDULER = DEFAULT_SAMPLER  # the workbench pipelines' own sampler


@dataclass(frozen=True)
class Limits:
    """What one request may ask for; `dwb app` flags set them."""

    max_steps: int = 150
    min_size: int = 16
    max_size: int = 1024
    max_batch: int = 8
    max_guidance: float = 30.0


@dataclass
class GenerationParams:
    prompt: str
    negative_prompt: str = ""
    scheduler: str = DEFAULT_SCHEDULER
    steps: int = 25
    guidance: float = 7.5
    width: int = 512
    height: int = 512
    seed: int = -1
    batch_size: int = 1

    def seeds(self) -> list[int]:
        """Image i of the batch uses ``seed + i`` (call after ``validate``, which fixes a random seed)."""
        return [self.seed + i for i in range(self.batch_size)]


def _integer(name: str, value, lo: int, hi: int) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise WorkbenchError(f"{name} must be a whole number, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):
        raise WorkbenchError(f"{name} must be a whole number, got {value!r}")
    if not lo <= number <= hi:
        raise WorkbenchError(f"{name} must be between {lo} and {hi}, got {int(number)}")
    return int(number)


def validate(params: GenerationParams, limits: Limits, *, need_prompt: bool = True) -> GenerationParams:
    """Checked and normalised parameters (a random seed drawn for -1); one-line WorkbenchError otherwise."""
    prompt = params.prompt if isinstance(params.prompt, str) else ""
    if need_prompt and not prompt.strip():
        raise WorkbenchError("the prompt is empty: describe the image to generate")
    if params.scheduler not in SCHEDULERS:
        raise WorkbenchError(f"unknown scheduler {params.scheduler!r}; choose one of: {', '.join(SCHEDULERS)}")
    steps = _integer("steps", params.steps, 1, limits.max_steps)
    sizes = {}
    for name in ("width", "height"):
        size = _integer(name, getattr(params, name), limits.min_size, limits.max_size)
        if size % 8:
            raise WorkbenchError(f"{name} must be a multiple of 8, got {size}")
        sizes[name] = size
    try:
        guidance = float(params.guidance)
    except (TypeError, ValueError):
        raise WorkbenchError(f"guidance scale must be a number, got {params.guidance!r}") from None
    if not (math.isfinite(guidance) and 0 <= guidance <= limits.max_guidance):
        raise WorkbenchError(f"guidance scale must be between 0 and {limits.max_guidance:g}, got {params.guidance}")
    batch = _integer("batch size", params.batch_size, 1, limits.max_batch)
    seed = _integer("seed", params.seed, -1, MAX_SEED)
    if seed == -1:
        seed = random.randint(0, MAX_SEED - batch + 1)
    elif seed + batch - 1 > MAX_SEED:
        raise WorkbenchError(f"seed + batch size - 1 must be at most {MAX_SEED}, got {seed + batch - 1}")
    negative = params.negative_prompt if isinstance(params.negative_prompt, str) else ""
    return GenerationParams(prompt, negative, params.scheduler, steps, guidance, sizes["width"], sizes["height"],
                            seed, batch)


def make_scheduler(name: str, base_config: dict):
    """A fresh scheduler (schedulers hold per-call state) built from the pipeline's scheduler config;
    ``validate`` has checked the name against SCHEDULERS already (make_sampler errors on any other)."""
    return make_sampler(name, base_config)


class Stopped(Exception):
    """The user pressed Stop; raised from the step callback, so the pipeline call ends there."""


StepHook = Callable[[int, int], None]  # (steps done, steps in all) after each denoising step


@torch.no_grad()
def generate(pipe: StableDiffusionPipeline, params: GenerationParams, *, on_step: StepHook | None = None,
             should_stop: Callable[[], bool] | None = None) -> list[Image.Image]:
    """``params.batch_size`` images from validated ``params``; image i from seed ``params.seed + i``.

    The cached ``pipe`` is never modified: the call runs on a lightweight pipeline sharing its modules
    with a fresh scheduler, so concurrent requests with different samplers do not interfere.
    """
    scheduler = make_scheduler(params.scheduler, pipe.scheduler.config)
    run = type(pipe)(**{**pipe.components, "scheduler": scheduler}, requires_safety_checker=False)
    run.set_progress_bar_config(disable=True)
    generators = [torch.Generator("cpu").manual_seed(s) for s in params.seeds()]

    def step_end(p, i: int, t, tensors: dict) -> dict:
        if should_stop is not None and should_stop():
            raise Stopped(f"stopped after {i + 1} of {p.num_timesteps} steps")
        if on_step is not None:
            on_step(i + 1, p.num_timesteps)
        return {}

    negative = params.negative_prompt or None
    out = run([params.prompt] * params.batch_size,
              negative_prompt=[negative] * params.batch_size if negative else None,
              num_inference_steps=params.steps, guidance_scale=params.guidance, width=params.width,
              height=params.height, generator=generators, output_type="pil", callback_on_step_end=step_end)
    return list(out.images)


# ---------------------------------------------------------------------------------------------
# PNG parameters: A1111's "parameters" text chunk, plus the same as JSON


@dataclass
class ImageRecord:
    """Everything needed to make one image again."""

    prompt: str
    negative_prompt: str
    scheduler: str
    steps: int
    guidance: float
    width: int
    height: int
    seed: int  # this image's own seed
    checkpoint: str  # label under the roots
    checkpoint_hash: str  # full sha256
    weights: str  # "ema", "raw" or "exported" (a diffusers folder)
    software: str = field(default="diffusion-workbench")

    @classmethod
    def of(cls, params: GenerationParams, index: int, checkpoint: str, checkpoint_hash: str,
           weights: str) -> "ImageRecord":
        return cls(params.prompt, params.negative_prompt, params.scheduler, params.steps, params.guidance,
                   params.width, params.height, params.seed + index, checkpoint, checkpoint_hash, weights)

    def parameters(self) -> str:
        """The text A1111 writes (and its PNG Info tab reads): prompt, negative prompt, settings line."""
        lines = [self.prompt]
        if self.negative_prompt:
            lines.append(f"Negative prompt: {self.negative_prompt}")
        weights = {"ema": "EMA", "raw": "raw", "exported": "exported"}.get(self.weights, self.weights)
        settings = [("Steps", self.steps), ("Sampler", self.scheduler), ("CFG scale", f"{self.guidance:g}"),
                    ("Seed", self.seed), ("Size", f"{self.width}x{self.height}"),
                    ("Model hash", self.checkpoint_hash[:10]), ("Model", _quote(self.checkpoint)),
                    ("Weights", weights), ("Version", self.software)]
        lines.append(", ".join(f"{k}: {v}" for k, v in settings))
        return "\n".join(lines)

    def pnginfo(self) -> dict[str, str]:
        """Text chunks: ``parameters`` (A1111) and ``dwb`` (the record as JSON, with the full hash)."""
        return {"parameters": self.parameters(), "dwb": json.dumps(asdict(self), sort_keys=True)}

    def caption(self) -> str:
        return f"seed {self.seed}"


def _quote(value: str) -> str:
    return json.dumps(value) if re.search(r'[,:"\n]', value) else value


def with_metadata(image: Image.Image, record: ImageRecord) -> Image.Image:
    """The image with its record in ``image.info``; PNG writers (ours and Gradio's) keep text chunks."""
    image.info.update(record.pnginfo())
    return image


def save_png(image: Image.Image, path, record: ImageRecord) -> None:
    info = PngImagePlugin.PngInfo()
    for key, value in record.pnginfo().items():
        info.add_text(key, value)
    image.save(path, format="PNG", pnginfo=info)


def parse_parameters(text: str) -> dict[str, str]:
    """A1111 ``parameters`` text back to a dict: prompt, negative prompt and each ``Key: value``."""
    lines = text.split("\n")
    settings = lines[-1]
    out: dict[str, str] = {}
    body = lines[:-1]
    negative = [i for i, line in enumerate(body) if line.startswith("Negative prompt: ")]
    if negative:
        out["prompt"] = "\n".join(body[:negative[0]])
        out["negative_prompt"] = "\n".join(body[negative[0]:]).removeprefix("Negative prompt: ")
    else:
        out["prompt"] = "\n".join(body)
        out["negative_prompt"] = ""
    for m in re.finditer(r'\s*([\w ]+):\s*("(?:\\.|[^\\"])*"|[^,]*)(?:,|$)', settings):
        key, value = m.group(1).strip(), m.group(2).strip()
        out[key] = json.loads(value) if value.startswith('"') else value
    return out
