"""Image folders with ``.txt``/``.json`` caption sidecars, among them img2dataset's ``files`` output
(``00000/000000000.jpg/.txt/.json``, with ``00000.parquet`` of every row's metadata beside the folder,
joined by key: the file name without its extension).

A unit of work is up to ``IMAGES_PER_UNIT`` images of one directory, in name order; a worker lists only its
own directory.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

from .records import IMAGE_SUFFIXES, Record, caption_and_fields
from .tables import metadata_by_key

IMAGES_PER_UNIT = 2000  # about 8 s of one core at 256/512 px; img2dataset's files shards hold 10000


def _images_in(directory: Path) -> list[str]:
    with os.scandir(directory) as entries:
        return sorted(e.name for e in entries
                      if os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES and e.is_file())


def folder_plan(root: Path) -> list[dict]:
    """Units of every directory under ``root`` that holds images, directories in path order."""
    directories = sorted({p.parent for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()},
                         key=lambda d: d.relative_to(root).parts)
    units = []
    for directory in directories:
        names = _images_in(directory)
        for start in range(0, len(names), IMAGES_PER_UNIT):
            chunk = names[start:start + IMAGES_PER_UNIT]
            units.append({"kind": "images", "root": str(root), "dir": directory.relative_to(root).as_posix(),
                          "first": chunk[0], "last": chunk[-1]})
    return units


def has_json_sidecars(root: Path) -> bool:
    return next(root.rglob("*.json"), None) is not None


def _read_sidecars(image: Path, joined: dict[str, Any] | None) -> tuple[str | None, dict[str, Any]]:
    """Caption from ``<stem>.txt`` (preferred) or ``<stem>.json``; the json's other keys become fields."""
    try:
        sidecar = image.with_suffix(".json")
        json_text = sidecar.read_text(encoding="utf-8") if sidecar.is_file() else None
        sidecar = image.with_suffix(".txt")
        txt = sidecar.read_text(encoding="utf-8") if sidecar.is_file() else None
        return caption_and_fields(json_text, txt, joined)
    except (OSError, ValueError):  # an unreadable sidecar means no caption, like a missing one
        return None, {}


def folder_records(unit: dict) -> Iterator[Record]:
    root = Path(unit["root"])
    directory = root / unit["dir"]
    beside = directory.parent / f"{directory.name}.parquet"  # img2dataset's files layout
    metadata = metadata_by_key(str(beside)) if unit["dir"] != "." and beside.is_file() else {}
    for name in _images_in(directory):
        if unit["first"] <= name <= unit["last"]:
            path = directory / name
            caption, fields = _read_sidecars(path, metadata.get(path.stem))
            yield Record(path.relative_to(root).as_posix(), path, caption, fields)
