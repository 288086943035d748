"""What a checkpoint is called before anything in it is read: the ``Checkpoint`` record, the kinds, and the
file-name rules a run's listing follows (local or ``s3://``). The modules that find, list and fetch
checkpoints all take these from here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePath

KINDS = ("composer", "mosaicml", "diffusers", "single-file", "hub")
WEIGHT_SUFFIXES = (".pt", ".safetensors", ".ckpt")
OTHER_RANKS = re.compile(r"-rank[1-9]\d*\.pt$")  # a sharded checkpoint's other ranks: rank 0's file stands for it
LATEST = re.compile(r"^latest-rank\d+\.pt")  # Composer's pointer to the newest (a link, or a copy of one)


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint found or named, before its weights are read."""

    ref: str  # as given: a path, a hub id, an s3:// URI
    kind: str  # one of KINDS, or "unreadable" for a file that does not read as any of them
    label: str  # how people call it: ``<run>/<file stem>``, a folder's name, the hub id, a path under the roots
    path: Path | None  # the local file or folder (a hub id's snapshot, an s3 object's cached copy)
    step: int | None = None  # training batches (Composer checkpoints)
    parts: Path | None = None  # a single file's other parts: a diffusers folder named with it (``--parts``)


def in_run_listing(name: str) -> bool:
    """Whether a run's listing counts a file of this name: a weight file that is neither another rank's shard
    nor Composer's ``latest-rank0.pt``."""
    return name.endswith(WEIGHT_SUFFIXES) and not OTHER_RANKS.search(name) and not LATEST.match(name)


def step_in_name(name: str) -> int | None:
    """The batch count a file name gives (``ep0-ba2000-rank0.pt``: 2000), for files whose contents cannot say."""
    m = re.search(r"ba(\d+)", name)
    return int(m.group(1)) if m else None


def file_label(path: PurePath) -> str:
    """``<run>/<stem>`` for a file in ``<run>/checkpoints/`` (a local path or an object key), else its stem."""
    if path.parent.name == "checkpoints" and path.parent.parent.name:
        return f"{path.parent.parent.name}/{path.stem}"
    return path.stem


def run_label(path: Path) -> str:
    """A local checkpoint's label: a folder's name, or a file's ``file_label``."""
    return path.name if path.is_dir() else file_label(path)
