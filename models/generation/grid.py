"""Sample grids: fixed prompts x seeds through a pipeline, one labelled PNG per checkpoint, with the record of
its first image (``models.generation.png``, as AUTOMATIC1111 writes a grid's) and every prompt and seed."""
from __future__ import annotations

from dataclasses import dataclass
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


def grid_image(images, prompts: list[str], title: str = "") -> Image.Image:
    """Lay out (P, S, H, W, 3) images (or P rows of (S, H, W, 3), each at its own size) with each row's prompt on its
    left; a row's tiles are enlarged as ``cell_size`` says for its size, in cells as large as the largest row's."""
    n_prompts, n_seeds = len(images), len(images[0])
    cells = [cell_size(*row.shape[1:3]) for row in images]
    cell_w, cell_h = max(w for w, _ in cells), max(h for _, h in cells)
    label_w, head = 300, 24 if title else 0
    grid = Image.new("RGB", (label_w + n_seeds * cell_w, head + n_prompts * cell_h), (255, 255, 255))
    draw = ImageDraw.Draw(grid)
    if title:
        draw.text((6, 6), title, fill=(0, 0, 0))
    for i, prompt in enumerate(prompts):
        draw.text((6, head + i * cell_h + cell_h // 2 - 6), prompt, fill=(0, 0, 0))
        for j in range(n_seeds):
            tile = Image.fromarray(images[i][j]).resize(cells[i], Image.Resampling.NEAREST)
            grid.paste(tile, (label_w + j * cell_w, head + i * cell_h))
    return grid


def write_grid(pipe, out: str | Path, prompts: list[str] = DEMO_PROMPTS, seeds=(0, 1, 2, 3), title: str = "",
               settings: Settings = Settings(), *, checkpoint: str = "", checkpoint_hash: str = "",
               weights: str = "stored", max_batch: int = 64, images_to: str | Path | None = None) -> Path:
    """The grid as ``out``: a PNG, JPEG or WebP as its suffix names (``png.image_format``), holding its first
    image's record, as AUTOMATIC1111 writes a grid's (a PNG's ``dwb`` JSON also every prompt and seed). ``images_to``: each image also on its own
    there, with its own record (``write_images``)."""
    rows = [GridRow(prompt, tuple(seeds), settings) for prompt in prompts]
    return write_rows(pipe, out, rows, title, checkpoint=checkpoint, checkpoint_hash=checkpoint_hash,
                      weights=weights, max_batch=max_batch, images_to=images_to)


@dataclass(frozen=True)
class GridRow:
    """One row of a grid: its prompt drawn at each of ``seeds`` with ``settings`` (`dwb sample --prompts` gives a row
    its own first seed, size and negative prompt)."""

    prompt: str
    seeds: tuple[int, ...]
    settings: Settings
    text: str | None = None  # what the model reads where it is not the prompt recorded (its <lora:...> tags taken out)


def draw_rows(pipe, rows: list[GridRow], max_batch: int = 64) -> list[np.ndarray]:
    """Each row's (S, H, W, 3) images. Rows with the same seeds and the same ``Settings`` object are drawn together,
    in calls of up to ``max_batch`` images, so a grid of one setting is batched as it always was (an image is bit for
    bit the same with the same batch composition)."""
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault((row.seeds, id(row.settings)), []).append(i)
    drawn: list[np.ndarray | None] = [None] * len(rows)
    for members in groups.values():
        first = rows[members[0]]
        images = generate(pipe, [rows[i].prompt if rows[i].text is None else rows[i].text for i in members],
                          list(first.seeds), first.settings, max_batch=max_batch)
        for i, row_images in zip(members, images):
            drawn[i] = row_images
    return drawn


def write_rows(pipe, out: str | Path, rows: list[GridRow], title: str = "", *, checkpoint: str = "",
               checkpoint_hash: str = "", weights: str = "stored", max_batch: int = 64,
               images_to: str | Path | None = None) -> Path:
    """``write_grid`` of rows that may each have their own seeds and settings: the grid holds its first image's
    record, its ``dwb`` JSON every prompt and the first row's seeds (and each row's, where they differ)."""
    out = Path(out)
    image_format(out)  # a format that would carry no parameters is refused before any image is made
    out.parent.mkdir(parents=True, exist_ok=True)
    images = draw_rows(pipe, rows, max_batch)
    kind = guidance_kind_of(pipe)
    records = [[ImageRecord.of(row.settings, row.prompt, seed, (drawn.shape[2], drawn.shape[1]),
                               sampler_of(row.settings), checkpoint, checkpoint_hash, weights, kind)
                for seed in row.seeds] for row, drawn in zip(rows, images)]
    if images_to is not None:
        write_images(images, records, images_to)
    grid = grid_image(images, [row.prompt for row in rows], title)
    about = {"prompts": [row.prompt for row in rows], "seeds": list(rows[0].seeds)}
    if any(row.seeds != rows[0].seeds for row in rows):
        about["row_seeds"] = [list(row.seeds) for row in rows]
    save_image(grid, out, records[0][0], extra={"grid": about})
    return out


def write_images(images, records: list[list[ImageRecord]], folder: str | Path) -> list[Path]:
    """Each image of a (prompts, seeds, H, W, 3) grid (or of its rows) as its own PNG with its record, named as AUTOMATIC1111 names
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
