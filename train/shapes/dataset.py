"""Shapes samples and datasets: a scene, its caption and its images, a pure function of (seed, split, index).

`sample_meta` makes every random draw of a sample (scene, layout, phrasing); `make_sample` renders its
images, `write_shapes_dataset` writes the MDS buckets and the prompt sets (``prompts.py``) call
`sample_meta` itself, so a caption is the same wherever it is asked for.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .grammar import captions_for
from .scenes import layout, render, sample_scene

# Stream ids keep the train and eval splits disjoint for the same seed.
SPLITS = {"train": 0, "eval": 1}


def sample_meta(seed: int, split: str, index: int) -> tuple[str, dict]:
    """A sample's caption and its stored attributes (``meta``: groups, relation, boxes, every phrasing,
    with_size), with no image drawn."""
    rng = np.random.default_rng([seed, SPLITS[split], index])
    scene = sample_scene(rng)
    boxes = layout(scene, rng)
    with_size = bool(rng.random() < 0.5)
    phrasings = captions_for(scene, with_size)
    caption = phrasings[rng.integers(len(phrasings))]
    return caption, {**scene, "boxes": boxes, "captions": phrasings, "with_size": with_size}


def make_sample(seed: int, split: str, index: int, sizes: tuple[int, ...]) -> dict:
    """One sample: images per size, caption and attributes."""
    caption, meta = sample_meta(seed, split, index)
    scene = {"groups": meta["groups"], "relation": meta["relation"]}
    return {"images": {s: render(scene, meta["boxes"], s) for s in sizes}, "caption": caption, "meta": meta}


def write_shapes_dataset(out, n: int, seed: int, sizes: tuple[int, ...] = (16, 32), n_eval: int = 1000,
                         eval_size: int | None = None, progress: bool = True) -> dict:
    """Write ``n`` training samples per bucket under ``out/<size>`` and ``n_eval`` under ``out/eval/<size>``."""
    from tqdm import tqdm

    from ..data import open_writer

    out = Path(out)
    eval_size = eval_size or max(sizes)
    plan = [("train", n, sizes, lambda s: out / str(s)), ("eval", n_eval, (eval_size,), lambda s: out / "eval" / str(s))]
    counts = {}
    for split, count, split_sizes, folder in plan:
        if count <= 0:
            continue
        writers = {s: open_writer(folder(s), "png") for s in split_sizes}
        try:
            for i in tqdm(range(count), desc=f"shapes {split}", unit="img", disable=not progress):
                sample = make_sample(seed, split, i, split_sizes)
                for s, w in writers.items():
                    w.write({"image": sample["images"][s], "caption": sample["caption"], "meta": sample["meta"]})
        finally:
            for w in writers.values():
                w.finish()
        counts[split] = count
    return counts
