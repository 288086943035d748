"""Sample sets: N images per prompt from one checkpoint, PNGs with their parameters, a manifest, grids.

Each image has its own seed, derived from (base seed, prompt index, image index), and its own
``torch.Generator``, so its starting noise is the same whatever the batch size or number of processes.
Batches are cut from the whole job list before ranks share them out, so ``composer -n N`` gives the
same images bit for bit as one process with the same batch size; across batch sizes images agree up
to the rounding of batched float kernels (rarely one 8-bit level on a pixel).
``manifest.jsonl`` (one JSON object per image) is the contract `human_eval` reads.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, PngImagePlugin
from tqdm import tqdm

from train.samplers import sampler_name

from .prompts import Prompt

MANIFEST = "manifest.jsonl"


def image_seed(prompt_index: int, image_index: int, base_seed: int = 0) -> int:
    """A 32-bit seed that depends only on (base seed, prompt index, image index)."""
    return int(np.random.SeedSequence([base_seed, prompt_index, image_index]).generate_state(1)[0])


@dataclass
class SampleRecord:
    """One manifest line."""

    prompt: str
    prompt_index: int
    category: str
    image_index: int
    seed: int
    checkpoint: str
    model: str
    guidance: float
    scheduler: str
    steps: int
    width: int
    height: int
    path: str  # relative to the manifest's folder

    def parameters(self) -> str:
        """A1111-style ``parameters`` text, as image viewers and the workbench app read it."""
        return (f"{self.prompt}\nSteps: {self.steps}, Sampler: {self.scheduler}, CFG scale: {self.guidance:g}, "
                f"Seed: {self.seed}, Size: {self.width}x{self.height}, Model: {json.dumps(self.model)}, "
                f"Version: diffusion-workbench")


def save_png(image: Image.Image, path: Path, record: SampleRecord) -> None:
    """PNG with text chunks ``parameters`` (A1111 format) and ``dwb`` (the manifest record as JSON)."""
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", record.parameters())
    info.add_text("dwb", json.dumps(asdict(record), sort_keys=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG", pnginfo=info)


def model_label(checkpoint: str | Path) -> str:
    """The checkpoint's stem, or its run's name for a file in ``<run>/checkpoints/``."""
    path = Path(checkpoint)
    if path.is_dir():
        return path.name
    if path.parent.name == "checkpoints" and path.parent.parent.name:
        return f"{path.parent.parent.name}/{path.stem}"
    return path.stem


def plan(prompts: list[Prompt], n_per_prompt: int, batch_size: int, rank: int = 0,
         world: int = 1) -> list[list[tuple[Prompt, int]]]:
    """This rank's batches of (prompt, image index) jobs.

    The prompt-major job list is cut into batches first and whole batches are dealt to ranks, so every
    batch, and so every image bit for bit, is the same whatever the number of processes.
    """
    jobs = [(p, i) for p in prompts for i in range(n_per_prompt)]
    batches = [jobs[s:s + batch_size] for s in range(0, len(jobs), batch_size)]
    return batches[rank::world]


@torch.no_grad()
def generate_samples(pipe, prompts: list[Prompt], out: str | Path, *, checkpoint: str, model: str | None = None,
                     n_per_prompt: int = 4, guidance: float = 5.0, steps: int = 25, size: int | None = None,
                     batch_size: int = 8, seed: int = 0, rank: int = 0, world: int = 1, progress: bool = True,
                     on_batch: Callable[[torch.Tensor, list[str]], None] | None = None) -> list[SampleRecord]:
    """Generate this rank's share of the images into ``out/images``; returns their manifest records.

    ``on_batch(images, captions)`` sees each batch as (B, 3, H, W) uint8 while it is in memory, so metrics
    stream over the images without holding them all.
    """
    out = Path(out)
    size = size or pipe.unet.config.sample_size * pipe.vae_scale_factor
    model = model or model_label(checkpoint)
    scheduler = sampler_name(pipe.scheduler)
    batches = plan(prompts, n_per_prompt, batch_size, rank, world)
    records: list[SampleRecord] = []
    bar = tqdm(total=sum(map(len, batches)), desc=f"samples {model} cfg {guidance:g}", unit="img", disable=not progress)
    # PNG encoding (zlib, which releases the GIL) runs in threads while the next batch is generated;
    # at most one batch's PNGs are pending, so memory stays flat in the number of images.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="png") as pool:
        pending: list[Future] = []
        for chunk in batches:
            seeds = [image_seed(p.index, i, seed) for p, i in chunk]
            images = pipe([p.text for p, _ in chunk], num_inference_steps=steps, guidance_scale=guidance,
                          height=size, width=size, generator=[torch.Generator().manual_seed(s) for s in seeds],
                          output_type="np").images
            images = (images * 255).round().astype(np.uint8)  # (B, H, W, 3)
            for f in pending:
                f.result()  # the previous batch is on disk (and its errors surface) before this one queues
            pending = []
            for (p, i), s, image in zip(chunk, seeds, images):
                rel = f"images/{p.index:05d}-{i:03d}.png"
                rec = SampleRecord(p.text, p.index, p.category, i, s, str(checkpoint), model, float(guidance),
                                   scheduler, steps, size, size, rel)
                pending.append(pool.submit(save_png, Image.fromarray(image), out / rel, rec))
                records.append(rec)
            if on_batch is not None:
                on_batch(torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(), [p.text for p, _ in chunk])
            bar.update(len(chunk))
        for f in pending:
            f.result()
    bar.close()
    return records


def write_manifest(records: list[SampleRecord], out: str | Path,
                   extra: dict[tuple[int, int], dict] | None = None) -> Path:
    """``out/manifest.jsonl``; ``extra`` adds per-image metric values by (prompt index, image index)."""
    path = Path(out) / MANIFEST
    records = sorted(records, key=lambda r: (r.prompt_index, r.image_index))
    extra = extra or {}
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({**asdict(r), **extra.get((r.prompt_index, r.image_index), {})}) + "\n"
                           for r in records))
    tmp.replace(path)
    return path


def read_manifest(path: str | Path) -> list[dict]:
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "uncategorised"


def write_category_grids(records: list[SampleRecord], out: str | Path, max_prompts: int = 8, title: str = "") -> list[Path]:
    """One grid PNG per category under ``out/grids``: up to ``max_prompts`` prompts x their images."""
    from train.grid import grid_image

    out = Path(out)
    by_category: dict[str, dict[int, list[SampleRecord]]] = {}
    for r in records:
        by_category.setdefault(r.category, {}).setdefault(r.prompt_index, []).append(r)
    paths = []
    for category, by_prompt in sorted(by_category.items()):
        rows = [sorted(rs, key=lambda r: r.image_index) for _, rs in sorted(by_prompt.items())[:max_prompts]]
        n = min(len(r) for r in rows)
        images = np.stack([[np.asarray(Image.open(out / r.path).convert("RGB")) for r in row[:n]] for row in rows])
        path = out / "grids" / f"{_slug(category)}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        grid_image(images, [row[0].prompt for row in rows], title=f"{title} {category}".strip()).save(path)
        paths.append(path)
    return paths
