"""Image folders with ``.txt``/``.json`` caption sidecars, among them img2dataset's ``files`` output
(``00000/000000000.jpg/.txt/.json``, with ``00000.parquet`` of every row's metadata beside the folder,
joined by key: the file name without its extension); local or under an ``s3://`` prefix.

A unit of work is up to ``IMAGES_PER_UNIT`` images of one directory, in name order; a worker lists only its
own directory. A local image is opened from its file (its header first); an object on S3 is read whole, and
one over ``MAX_FILE_BYTES`` is refused and counted, never read. Local files are read only inside the source
folder (``storage.outside_root``): a link, image or sidecar, is never followed (a caption linked to
``/proc/self/environ`` put the process's environment, its cloud keys among it, into the dataset). A sidecar is
read up to ``MAX_SIDECAR_BYTES``; a ``.json`` too large, too deep or broken is counted and the sample keeps its
``.txt`` caption.
"""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from models.errors import WorkbenchError

from .records import IMAGE_SUFFIXES, MAX_FILE_BYTES, MAX_SIDECAR_BYTES, ReadCounts, Record, caption_and_fields
from .storage import exists, is_remote, list_objects, outside_root, read_bounded
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


class _Folder:
    """One directory of a unit: its files (name -> size on S3, None locally), each local one judged by
    ``outside_root`` when a sample reads it (a link or device is refused and counted, never opened)."""

    def __init__(self, root: str, directory: str):
        self.root, self.directory = root, directory
        self.where = root if directory == "." else f"{root}/{directory}"
        if is_remote(self.where):
            self.files = {name: o["size"] for name, o in list_objects(self.where, below=False).items()}
        else:
            with os.scandir(self.where) as entries:
                self.files = {e.name: None for e in entries if not e.is_dir(follow_symlinks=False)}

    def relative(self, name: str) -> str:
        return name if self.directory == "." else f"{self.directory}/{name}"

    def _refused(self, name: str, limit: int, counts: ReadCounts) -> bool:
        """Whether a file is refused (counted): outside the source folder locally, over ``limit`` on S3."""
        local = not is_remote(self.where)
        if (local and outside_root(self.root, self.relative(name))) or (self.files[name] or 0) > limit:
            counts.refused += 1
            return True
        return False

    def text(self, name: str, counts: ReadCounts) -> bytes | None:
        """A sidecar's bytes, None when there is none; a refused one, or one over ``MAX_SIDECAR_BYTES``, is
        counted and taken as none."""
        if name not in self.files or self._refused(name, MAX_SIDECAR_BYTES, counts):
            return None
        data = read_bounded(f"{self.where}/{name}", MAX_SIDECAR_BYTES)
        if data is None:
            counts.refused += 1
        return data

    def image(self, name: str, counts: ReadCounts):
        """A local image's path (opened lazily, header first), an object's bytes, or None: refused, counted."""
        if self._refused(name, MAX_FILE_BYTES, counts):
            return None
        if not is_remote(self.where):
            return Path(self.where, name)
        return read_bounded(f"{self.where}/{name}", MAX_FILE_BYTES)


def _sidecars(folder: _Folder, stem: str, joined: dict[str, Any] | None, counts: ReadCounts):
    """Caption from ``<stem>.txt`` (preferred) or ``<stem>.json``; the json's other keys become fields. A .txt
    that is not UTF-8 is no caption; a .json too large, deep or broken is counted and left out."""
    raw_txt = folder.text(f"{stem}.txt", counts)
    try:
        txt = None if raw_txt is None else raw_txt.decode("utf-8")
    except UnicodeDecodeError:
        return None, {}
    json_text = folder.text(f"{stem}.json", counts)
    try:
        return caption_and_fields(json_text, txt, joined)
    except WorkbenchError:
        counts.bad_json += 1
        return caption_and_fields(None, txt, joined)


def _metadata_beside(root: str, directory: str, counts: ReadCounts) -> dict[str, dict]:
    """img2dataset's ``files`` layout: ``00000.parquet`` beside the folder ``00000/``."""
    if directory == ".":
        return {}
    if is_remote(root):
        beside = f"{root}/{directory}.parquet"
        return metadata_by_key(beside, counts) if exists(beside) else {}
    reason = outside_root(root, f"{directory}.parquet")
    if reason and reason != "does not exist":
        counts.refused += 1
    return {} if reason else metadata_by_key(f"{root}/{directory}.parquet", counts)


def folder_records(unit: dict, counts: ReadCounts) -> Iterator[Record]:
    root = unit["root"].rstrip("/")
    metadata = _metadata_beside(root, unit["dir"], counts)
    folder = _Folder(root, unit["dir"])
    for name in sorted(n for n in folder.files if _is_image(n) and unit["first"] <= n <= unit["last"]):
        stem = os.path.splitext(name)[0]
        caption, fields = _sidecars(folder, stem, metadata.get(stem), counts)
        yield Record(folder.relative(name), folder.image(name, counts), caption, fields)
