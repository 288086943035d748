"""Shapes samples and datasets: a scene, its caption and its images, a pure function of (seed, split, index).

`sample_meta` makes every random draw of a sample (scene, frame, layout, phrasing); `make_sample` renders its
images, `write_shapes_dataset` writes the MDS buckets and the prompt sets (``prompts.py``) call
`sample_meta` itself, so a caption is the same wherever it is asked for.

With a share of wide and tall scenes (``wide``), each split is drawn at a source resolution into an image
folder (PNG, caption, attributes; a temporary one beside OUT) and converted by `dwb data convert
--aspect-buckets` itself into each budget's aspect-ratio buckets (``OUT/<side>``, ``OUT/eval/<side>``), as a
photo collection would be.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from models.errors import WorkbenchError

from .grammar import captions_for
from .scenes import FRAME_OF, FRAMES, layout, render, sample_scene

# Stream ids keep the train and eval splits disjoint for the same seed.
SPLITS = {"train": 0, "eval": 1}
FRAME_STREAM = 1  # a sample's frame comes from a stream of its own: its scene and a square dataset stay as they were
# Conversion of a dataset with wide and tall scenes: buckets on the VAE's step of 8, which is also the size step
# evaluate and `dwb sample --aspect` draw a bucket on (a step of 32 leaves a 32 px budget only its square).
BUCKET_STEP = 8
SOURCE_SCALE = 3  # the source's shorter side: 3 x the largest budget, whole pixels for 5:3 and above every bucket


def sample_frame(seed: int, split: str, index: int, relation: str | None, wide: float) -> str:
    """The sample's frame: with probability ``wide`` the one its relation takes (``FRAME_OF``; one group: wide or
    tall alike), else square."""
    if wide <= 0:
        return "square"
    rng = np.random.default_rng([seed, SPLITS[split], index, FRAME_STREAM])
    if rng.random() >= wide:
        return "square"
    return FRAME_OF[relation] if relation else ("wide", "tall")[int(rng.integers(2))]


def sample_meta(seed: int, split: str, index: int, wide: float = 0.0) -> tuple[str, dict]:
    """A sample's caption and its stored attributes (``meta``: groups, relation, boxes, every phrasing,
    with_size, and ``frame`` where it is not square), with no image drawn."""
    rng = np.random.default_rng([seed, SPLITS[split], index])
    scene = sample_scene(rng)
    frame = sample_frame(seed, split, index, scene["relation"], wide)
    boxes = layout(scene, rng, frame)
    with_size = bool(rng.random() < 0.5)
    phrasings = captions_for(scene, with_size)
    caption = phrasings[rng.integers(len(phrasings))]
    meta = {**scene, "boxes": boxes, "captions": phrasings, "with_size": with_size}
    return caption, meta if frame == "square" else {**meta, "frame": frame}


def framed_prompts(n: int, seed: int = 0, wide: float = 0.0) -> list[tuple[str, str, str]]:
    """The captions of the first ``n`` held-out samples, their category ("one group" or "two groups") and their
    frame ("square", "wide", "tall"; ``wide``: the dataset's share of wide and tall scenes)."""
    prompts = []
    for i in range(n):
        caption, meta = sample_meta(seed, "eval", i, wide)
        prompts.append((caption, "two groups" if meta["relation"] else "one group", meta.get("frame", "square")))
    return prompts


def make_sample(seed: int, split: str, index: int, sizes: tuple[int, ...], wide: float = 0.0) -> dict:
    """One sample: images per size (the frame's shorter side), caption and attributes."""
    caption, meta = sample_meta(seed, split, index, wide)
    scene = {"groups": meta["groups"], "relation": meta["relation"]}
    frame = meta.get("frame", "square")
    return {"images": {s: render(scene, meta["boxes"], s, frame) for s in sizes}, "caption": caption, "meta": meta}


def write_shapes_dataset(out, n: int, seed: int, sizes: tuple[int, ...] = (16, 32), n_eval: int = 1000,
                         eval_size: int | None = None, progress: bool = True, wide: float = 0.0,
                         workers: int | None = None) -> dict:
    """Write ``n`` training samples per bucket under ``out/<size>`` and ``n_eval`` under ``out/eval/<size>``.

    ``wide``: the share of scenes in a wide or tall frame; above 0 the splits are drawn at the source resolution
    and converted with aspect-ratio buckets (``write_wide_dataset``)."""
    eval_size = eval_size or max(sizes)
    if not 0 <= wide <= 1:
        raise WorkbenchError(f"the share of wide and tall scenes must be from 0 to 1, got {wide}")
    if wide > 0:
        return write_wide_dataset(out, n, seed, sizes, n_eval, eval_size, wide, progress, workers)
    from tqdm import tqdm

    from ..data import open_writer

    out = Path(out)
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


def source_fields(meta: dict) -> dict:
    """What a source sample's ``.json`` keeps through conversion (which keeps a source's scalar fields only):
    the frame, the relation and the whole scene as its canonical caption with sizes, which the grammar reads
    back (``grammar.scene_from_meta``)."""
    scene = captions_for(meta, with_size=True)[0]
    return {"frame": meta.get("frame", "square"), "relation": meta["relation"], "scene": scene,
            "with_size": meta["with_size"]}


def write_source(folder: Path, seed: int, split: str, count: int, side: int, wide: float, progress: bool) -> None:
    """``count`` samples of ``split`` as an image folder: ``NNNNNN.png`` (shorter side ``side``), ``.txt`` (the
    caption) and ``.json`` (`source_fields`)."""
    from tqdm import tqdm

    folder.mkdir(parents=True, exist_ok=True)
    width = len(str(max(count - 1, 0)))
    for i in tqdm(range(count), desc=f"shapes {split} source", unit="img", disable=not progress):
        sample = make_sample(seed, split, i, (side,), wide)
        stem = folder / f"{i:0{max(6, width)}d}"
        sample["images"][side].save(stem.with_suffix(".png"))
        stem.with_suffix(".txt").write_text(sample["caption"], encoding="utf-8")
        stem.with_suffix(".json").write_text(json.dumps(source_fields(sample["meta"])), encoding="utf-8")


def write_prompts(path: Path, seed: int, count: int, wide: float) -> None:
    """The held-out captions with their category and their frame's aspect (``prompt,category,aspect``): evaluate's
    ``prompts`` with ``aspect_column: aspect`` draws each at its own aspect."""
    rows = framed_prompts(count, seed, wide)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["prompt", "category", "aspect"])
        writer.writerows((caption, category, "{}:{}".format(*FRAMES[frame])) for caption, category, frame in rows)


def write_wide_dataset(out, n: int, seed: int, sizes: tuple[int, ...], n_eval: int, eval_size: int, wide: float,
                       progress: bool = True, workers: int | None = None) -> dict:
    """Each split drawn at ``SOURCE_SCALE`` x the largest budget into a temporary image folder beside ``out`` (the
    converter takes an empty OUT), converted into ``out/<side>`` and ``out/eval/<eval_size>`` with aspect-ratio
    buckets on ``BUCKET_STEP``; the held-out prompts with their aspects in ``out/eval/prompts.csv``."""
    import tempfile

    from ..data import convert_to_mds

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    side = SOURCE_SCALE * max(*sizes, eval_size)
    counts = {}
    for split, count, buckets, target in (("train", n, sizes, out), ("eval", n_eval, (eval_size,), out / "eval")):
        if count <= 0:
            continue
        with tempfile.TemporaryDirectory(prefix=f".{out.name}-source-", dir=out.parent) as source:
            write_source(Path(source), seed, split, count, side, wide, progress)
            convert_to_mds(source, target, buckets=buckets, image_format="png", aspect_buckets=True,
                           bucket_step=BUCKET_STEP, workers=workers, progress=progress)
        counts[split] = count
    if n_eval > 0:
        write_prompts(out / "eval" / "prompts.csv", seed, n_eval, wide)
    return counts
