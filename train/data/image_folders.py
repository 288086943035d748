"""Image folders with ``.txt``/``.json`` caption sidecars, among them img2dataset's ``files`` output
(``00000/000000000.jpg/.txt/.json``, with ``00000.parquet`` of every row's metadata beside the folder,
joined by key: the file name without its extension); local or under an ``s3://`` prefix.

A unit of work is up to ``IMAGES_PER_UNIT`` images of one directory, in name order; a worker lists only its
own directory. A local image is opened from its file (its header first); an object on S3 is read whole, and
one over ``MAX_FILE_BYTES`` is refused and counted, never read.
"""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from .records import IMAGE_SUFFIXES, MAX_FILE_BYTES, ReadCounts, Record, caption_and_fields
from .storage import exists, is_remote, list_objects, read_bounded
from .tables import metadata_by_key

IMAGES_PER_UNIT = 2000  # about 8 s of one core at 256/512 px; img2dataset's files shards hold 10000


def _is_image(name: str) -> bool:
    return PurePosixPath(name).suffix.lower() in IMAGE_SUFFIXES


def folder_plan(root: str, images: list[str]) -> list[dict]:
    """Units of the ``images`` under ``root`` (names relative to it, in path order), directory by directory."""
    by_directory: dict[str, list[str]] = {}
    for name in images:
        directory, _, file = name.rpartition("/")
        by_directory.setdefault(directory or ".", []).append(file)
    units = []
    for directory, names in by_directory.items():
        names.sort()
        for start in range(0, len(names), IMAGES_PER_UNIT):
            chunk = names[start:start + IMAGES_PER_UNIT]
            units.append({"kind": "images", "root": root, "dir": directory, "first": chunk[0], "last": chunk[-1]})
    return units


def _files_in(directory: str) -> dict[str, int | None]:
    """The files directly in a local directory or an S3 prefix, with their sizes (None: not needed, local)."""
    if is_remote(directory):
        return {name: o["size"] for name, o in list_objects(directory, below=False).items()}
    with os.scandir(directory) as entries:
        return {e.name: None for e in entries if e.is_file()}


def _text(where: str, files: dict, name: str) -> str | None:
    if name not in files:
        return None
    if not is_remote(where):
        return Path(where, name).read_text(encoding="utf-8")
    data = read_bounded(f"{where}/{name}", MAX_FILE_BYTES)
    return None if data is None else data.decode("utf-8")


def _read_sidecars(where: str, files: dict, stem: str, joined: dict[str, Any] | None):
    """Caption from ``<stem>.txt`` (preferred) or ``<stem>.json``; the json's other keys become fields."""
    try:
        return caption_and_fields(_text(where, files, f"{stem}.json"), _text(where, files, f"{stem}.txt"), joined)
    except (OSError, ValueError):  # an unreadable sidecar means no caption, like a missing one
        return None, {}


def _image(where: str, name: str, size: int | None, counts: ReadCounts):
    if not is_remote(where):
        return os.path.join(where, name)
    if size is not None and size > MAX_FILE_BYTES:
        counts.refused += 1
        return None
    return read_bounded(f"{where}/{name}", MAX_FILE_BYTES)


def folder_records(unit: dict, counts: ReadCounts) -> Iterator[Record]:
    root = unit["root"].rstrip("/")
    where = root if unit["dir"] == "." else f"{root}/{unit['dir']}"
    beside = f"{where}.parquet"  # img2dataset's files layout
    metadata = metadata_by_key(beside) if unit["dir"] != "." and exists(beside) else {}
    files = _files_in(where)
    for name in sorted(n for n in files if _is_image(n) and unit["first"] <= n <= unit["last"]):
        stem = os.path.splitext(name)[0]
        caption, fields = _read_sidecars(where, files, stem, metadata.get(stem))
        source = name if unit["dir"] == "." else f"{unit['dir']}/{name}"
        yield Record(source, _image(where, name, files[name], counts), caption, fields)
