"""Class images for DreamBooth's prior preservation: drawn by the base model through the workbench's one
generation path (the checkpoint door's pipeline, ``models.generation.generate_images``), once, and cached.

The cache is a folder per key, ``CACHE/<16 hex digits>/``, the digits a hash of what the images are a function of:
the base's content hash (``models.checkpoints.content_hash``: its bytes, not its path or name), the class prompt,
the count, the size, the first seed and the sampling settings. Image i is ``{i:05d}.png``, drawn from seed
``seed + i``, its PNG parameters saying how (``models.generation.save_png``); ``key.json`` holds the key. A folder
whose images are all there is used as it is; another base or prompt is another folder, drawn anew. A draw killed
half-way leaves whole images only (each is written whole), and the next run draws the rest.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from models.common import write_text_whole
from models.errors import WorkbenchError

KEY_FILE = "key.json"
MAX_CLASS_IMAGES = 10_000  # kohya pairs one class image with each instance image's repeat: 200 x 50 at most


@dataclass(frozen=True)
class ClassPrompt:
    """What the class images are drawn with: ``base`` is any checkpoint the door opens (a folder, a single file, a
    hub id, a Composer checkpoint); the sampling settings default to every command's (``models.generation``)."""

    base: str
    prompt: str
    count: int
    size: int
    seed: int = 0
    steps: int | None = None
    guidance: float | None = None
    sampler: str | None = None
    # the T5 tokens the run reads (its ``model.text_tokens``: SD3, Flux.1), which the base draws with; None: its
    # pipeline's own default
    text_tokens: int | None = None

    def __post_init__(self):
        from models.families import MAX_TEXT_TOKENS

        if not self.prompt.strip():
            raise WorkbenchError("the class prompt is empty")
        if not 1 <= self.count <= MAX_CLASS_IMAGES:
            raise WorkbenchError(f"class images must number from 1 to {MAX_CLASS_IMAGES}, got {self.count}")
        if self.text_tokens is not None and not 1 <= self.text_tokens <= MAX_TEXT_TOKENS:
            raise WorkbenchError(f"class images' T5 tokens must be from 1 to {MAX_TEXT_TOKENS}, got {self.text_tokens}")

    def settings(self):
        from models.generation import DEFAULT_GUIDANCE, DEFAULT_SAMPLER, DEFAULT_STEPS, Settings

        return Settings(steps=self.steps or DEFAULT_STEPS,
                        guidance=DEFAULT_GUIDANCE if self.guidance is None else self.guidance,
                        width=self.size, height=self.size, sampler=self.sampler or DEFAULT_SAMPLER)


def cache_key(request: ClassPrompt, base_hash: str, weights: str) -> dict:
    """What the images are a function of (the base by its content, never by its path)."""
    settings = request.settings()
    return {"base": base_hash, "weights": weights, "prompt": request.prompt, "count": request.count,
            "size": request.size, "seed": request.seed, "steps": settings.steps, "guidance": settings.guidance,
            "sampler": settings.sampler, **({"text_tokens": request.text_tokens} if request.text_tokens else {})}


def cache_folder(cache: str | Path, key: dict) -> Path:
    return Path(cache) / hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cached_class_images(request: ClassPrompt, cache: str | Path, *, device: str = "auto", batch: int = 4,
                 say: Callable[[str], None] = print) -> tuple[list[Path], int]:
    """(the class images' files, how many were drawn now: 0 when the cache held them all)."""
    from models.checkpoints import content_hash, find_checkpoint, weights_of
    from models.generation import DEFAULT_WEIGHTS

    ckpt = find_checkpoint(request.base)
    weights = weights_of(ckpt, DEFAULT_WEIGHTS)
    key = cache_key(request, content_hash(ckpt), weights)
    folder = cache_folder(cache, key)
    files = [folder / f"{i:05d}.png" for i in range(request.count)]
    missing = [i for i, f in enumerate(files) if not f.is_file()]
    if not missing:
        return files, 0
    folder.mkdir(parents=True, exist_ok=True)
    write_text_whole(folder / KEY_FILE, json.dumps(key, indent=1))
    say(f"drawing {len(missing)} class images of {request.prompt!r} with {ckpt.label} into {folder}")
    _draw(ckpt, weights, request, key, [(i, files[i]) for i in missing], device, batch)
    return files, len(missing)


def _draw(ckpt, weights: str, request: ClassPrompt, key: dict, todo: list[tuple[int, Path]], device: str,
          batch: int) -> None:
    """Each image of ``todo`` drawn from seed ``request.seed + i``, in calls of ``batch`` images."""
    from PIL import Image

    from models.checkpoints import load_pipeline
    from models.generation import ImageRecord, generate_images, guidance_kind_of, pick_device, pipeline_dtype, save_png

    where = pick_device(device)
    pipe = with_text_tokens(load_pipeline(ckpt, ema=weights == "ema", device=where,
                                          dtype=pipeline_dtype("auto", where)), request.text_tokens)
    pipe.set_progress_bar_config(disable=True)
    settings = request.settings()
    for start in range(0, len(todo), batch):
        chunk = todo[start:start + batch]
        seeds = [request.seed + i for i, _ in chunk]
        images = generate_images(pipe, [request.prompt] * len(chunk), seeds, settings)
        for (i, file), seed, pixels in zip(chunk, seeds, images):
            record = ImageRecord.of(settings, request.prompt, seed, (request.size, request.size), key["sampler"],
                                    ckpt.label, key["base"], weights, guidance_kind_of(pipe))
            save_png(Image.fromarray(pixels), file, record)


def with_text_tokens(pipe, tokens: int | None):
    """``pipe`` drawing with ``tokens`` T5 tokens (``Family.text_length``: its T5 tokenizer saying so), as the run
    that trains on the class images reads them; one line for a family whose pipeline takes no such count."""
    from models.checkpoints import with_max_length
    from models.families import family_of_pipeline

    if tokens is None:
        return pipe
    family = family_of_pipeline(pipe)
    tokenizer = getattr(pipe, family.text_length_tokenizer, None)
    if family.text_length_option is None or tokenizer is None:
        raise WorkbenchError(f"--class-text-tokens: this {family.label} pipeline has no T5 tower whose tokens it counts")
    pipe.register_modules(**{family.text_length_tokenizer: with_max_length(tokenizer, tokens)})
    return pipe
