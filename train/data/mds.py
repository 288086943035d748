"""The image-caption MDS format every training dataset of the workbench is written in.

Columns: ``image`` (encoded PNG or JPEG), ``caption`` (str), ``meta`` (json: source attributes).
A dataset folder holds one subfolder per resolution bucket, named by its side in pixels
(``OUT/256``, ``OUT/512``); the shapes domain adds a held-out split under ``OUT/eval/<side>``.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import WorkbenchError


@dataclass
class StreamConfig:
    """One MDS dataset in a mixture (Streaming's ``Stream``): local, or remote with a local cache."""

    path: str = ""  # the local folder, or the cache folder of a remote (empty: a temporary cache)
    remote: Optional[str] = None  # s3://bucket/prefix or any remote Streaming reads
    proportion: Optional[float] = None  # share of each epoch (all streams or none; they sum to 1)
    repeat: Optional[float] = None  # or: how many times each sample is seen per epoch
    choose: Optional[int] = None  # or: how many samples this stream gives per epoch


def image_columns(image_format: str) -> dict[str, str]:
    if image_format not in ("png", "jpeg"):
        raise WorkbenchError(f"image format must be png or jpeg, got {image_format!r}")
    return {"image": image_format, "caption": "str", "meta": "json"}


def open_writer(out: str | Path, image_format: str = "png", size_limit: str = "64mb"):
    """An MDSWriter for one bucket folder; refuses to mix into an existing dataset."""
    from streaming import MDSWriter  # Streaming imports transformers' auto classes (seconds); counting needs none

    out = Path(out)
    if (out / "index.json").exists():
        raise WorkbenchError(f"{out} already holds an MDS dataset; choose an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    return MDSWriter(out=str(out), columns=image_columns(image_format), size_limit=size_limit, compression=None)


def bucket_dirs(root: str | Path) -> dict[int, Path]:
    """The resolution buckets under a dataset folder, by side."""
    root = Path(root)
    return {int(p.name): p for p in sorted(root.iterdir()) if p.name.isdigit() and (p / "index.json").is_file()} if root.is_dir() else {}


def count_samples(folder: str | Path) -> int:
    index = Path(folder) / "index.json"
    if not index.is_file():
        raise WorkbenchError(f"no MDS dataset at {folder} (index.json missing)")
    return sum(shard["samples"] for shard in json.loads(index.read_text())["shards"])


# Streaming's pickle encoding: decoding a sample of such a column runs whatever the pickle says.
UNSAFE_ENCODINGS = frozenset({"pkl"})


def check_safe_columns(dataset, where: str) -> None:
    """Refuse, by column, a dataset (``StreamingDataset`` or ``LocalDataset``) whose columns decode with pickle.

    Call it after the dataset is built (its index is read, no sample yet) and before any sample is read.
    ``StreamingDataset`` refuses them itself while it is built (``allow_unsafe_types`` is never set here);
    ``LocalDataset`` does not.
    """
    for shard in getattr(dataset, "shards", []):
        for name, encoding in zip(getattr(shard, "column_names", []), getattr(shard, "column_encodings", [])):
            if encoding in UNSAFE_ENCODINGS:
                raise WorkbenchError(f"{where}: column '{name}' is stored with pickle ('{encoding}'), which runs code "
                                     "when read; refused (write it as json, str or bytes)")


def open_local(folder: str | Path, where: str | None = None):
    """A ``LocalDataset`` of an MDS folder, its columns checked (``check_safe_columns``)."""
    from streaming import LocalDataset

    dataset = LocalDataset(local=str(folder))
    check_safe_columns(dataset, where or str(folder))
    return dataset


def open_streaming(open_dataset, attempts: int = 5):
    """Open a StreamingDataset, again when another process took its shared-memory name first. Streaming picks
    the first free name, then creates it: two datasets opened at the same moment on one machine (two runs, or
    a run beside a benchmark) can pick the same one, and the second fails with FileExistsError; reopening
    picks the next free name."""
    for attempt in range(attempts):
        try:
            return open_dataset()
        except FileExistsError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
