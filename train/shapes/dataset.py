"""Shapes datasets: the samples of the shapes domain written as MDS datasets, square or in aspect-ratio buckets.

`write_shapes_dataset` writes each sample `models.shapes.make_sample` draws into the MDS buckets, and the prompt sets
beside them (``models.shapes``' prompt sets, drawn by the same function).

With a share of wide and tall scenes (``wide``), each split is drawn at a source resolution into an image
folder (PNG, caption, attributes; a temporary one beside OUT) and converted by `dwb data convert
--aspect-buckets` itself into each budget's aspect-ratio buckets (``OUT/<side>``, ``OUT/eval/<side>``), as a
photo collection would be.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from models.errors import WorkbenchError
from models.shapes import FRAMES, captions_for, framed_prompts, make_sample

# Conversion of a dataset with wide and tall scenes: buckets on the VAE's step of 8, which is also the size step
# evaluate and `dwb sample --aspect` draw a bucket on (a step of 32 leaves a 32 px budget only its square).
BUCKET_STEP = 8
SOURCE_SCALE = 3  # the source's shorter side: 3 x the largest budget, whole pixels for 5:3 and above every bucket


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

    from models.datasets import open_writer

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
