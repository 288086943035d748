"""Sample grids: fixed prompts x seeds through a pipeline, one labelled PNG per checkpoint, with the record of
its first image (``models.generation.png``, as AUTOMATIC1111 writes a grid's) and every prompt and seed."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from .images import Settings, generate_images, guidance_kind_of, sampler_of
from .png import ImageRecord, image_format, save_image, save_png

DEMO_PROMPTS = [
    "a red circle",
    "two blue squares",
    "three yellow triangles",
    "a large green circle",
    "a white square above a purple triangle",
    "two red circles left of a blue square",
    "a small yellow circle below a green triangle",
    "three purple squares right of a white circle",
]


def generate(pipe, prompts: list[str], seeds: list[int], settings: Settings = Settings(), *,
             max_batch: int = 64) -> np.ndarray:
    """(len(prompts), len(seeds), H, W, 3) uint8; image (i, j) from prompt i and seed ``seeds[j]``
    (``models.generation``), in batched calls of up to ``max_batch`` images."""
    cells = [(p, s) for p in prompts for s in seeds]
    out = [generate_images(pipe, [p for p, _ in chunk], [s for _, s in chunk], settings)
           for chunk in (cells[i:i + max_batch] for i in range(0, len(cells), max_batch))]
    return np.concatenate(out).reshape(len(prompts), len(seeds), *out[0].shape[1:])


MIN_CELL = 96  # the tiny models' 16-32 px images are enlarged pixel for pixel to at least this


def cell_size(height: int, width: int) -> tuple[int, int]:
    """A cell's (width, height): small images enlarged by a whole factor to MIN_CELL, larger ones as they are."""
    scale = max(1, -(-MIN_CELL // min(height, width)))
    return width * scale, height * scale


def grid_image(images: np.ndarray, prompts: list[str], title: str = "") -> Image.Image:
    """Lay out (P, S, H, W, 3) images with each row's prompt on its left."""
    n_prompts, n_seeds = images.shape[:2]
    cell_w, cell_h = cell_size(*images.shape[2:4])
    label_w, head = 300, 24 if title else 0
    grid = Image.new("RGB", (label_w + n_seeds * cell_w, head + n_prompts * cell_h), (255, 255, 255))
    draw = ImageDraw.Draw(grid)
    if title:
        draw.text((6, 6), title, fill=(0, 0, 0))
    for i, prompt in enumerate(prompts):
        draw.text((6, head + i * cell_h + cell_h // 2 - 6), prompt, fill=(0, 0, 0))
        for j in range(n_seeds):
            tile = Image.fromarray(images[i, j]).resize((cell_w, cell_h), Image.Resampling.NEAREST)
            grid.paste(tile, (label_w + j * cell_w, head + i * cell_h))
    return grid


def write_grid(pipe, out: str | Path, prompts: list[str] = DEMO_PROMPTS, seeds=(0, 1, 2, 3), title: str = "",
               settings: Settings = Settings(), *, checkpoint: str = "", checkpoint_hash: str = "",
               weights: str = "stored", max_batch: int = 64, images_to: str | Path | None = None) -> Path:
    """The grid as ``out``: a PNG, JPEG or WebP as its suffix names (``png.image_format``), holding its first
    image's record, as AUTOMATIC1111 writes a grid's (a PNG's ``dwb`` JSON also every prompt and seed). ``images_to``: each image also on its own
    there, with its own record (``write_images``)."""
    out = Path(out)
    image_format(out)  # a format that would carry no parameters is refused before any image is made
    out.parent.mkdir(parents=True, exist_ok=True)
    seeds = list(seeds)
    images = generate(pipe, prompts, seeds, settings, max_batch=max_batch)
    height, width = images.shape[2:4]
    kind = guidance_kind_of(pipe)
    records = [[ImageRecord.of(settings, prompt, seed, (width, height), sampler_of(settings), checkpoint,
                               checkpoint_hash, weights, kind) for seed in seeds] for prompt in prompts]
    if images_to is not None:
        write_images(images, records, images_to)
    grid = grid_image(images, prompts, title)
    save_image(grid, out, records[0][0], extra={"grid": {"prompts": list(prompts), "seeds": seeds}})
    return out


def write_images(images: np.ndarray, records: list[list[ImageRecord]], folder: str | Path) -> list[Path]:
    """Each image of a (prompts, seeds, H, W, 3) grid as its own PNG with its record, named as AUTOMATIC1111 names
    them, ``<5-digit index>-<seed>.png``, prompt by prompt."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cells = [(image, record) for row, rows in zip(images, records) for image, record in zip(row, rows)]
    paths = []
    for i, (image, record) in enumerate(cells):
        path = folder / f"{i:05d}-{record.seed}.png"
        save_png(Image.fromarray(image), path, record)
        paths.append(path)
    return paths
