"""What every source layout yields to conversion: a record (an image, its caption, its other fields), the
counts of what a reader refused, and the filters that read the fields.

Readers (``tar_shards``, ``tables``, ``image_folders``) turn one unit of work into records; ``convert``
decodes, filters and writes them. Filters are plain data, so a unit of work travels to a worker process.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Collection

from models.common import loads_outside

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp"}
# The most one file of a sample (a tar member, an object on S3) may hold to be read into memory: an img2dataset
# JPEG at LAION's 512-1024 px is 50-300 KB, a 64 MP camera photo about 30 MB.
MAX_FILE_BYTES = 64 * 2**20
# The most a caption or a sample's .json (a sidecar, a tar member, a table's caption cell, the scalar fields of a
# row) may hold: LAION's captions are under 1 KB and img2dataset's .json with its EXIF 1-5 KB. Past it a caption
# is refused, like a file; a metadata field is left out of meta.
MAX_SIDECAR_BYTES = 2**20
CAPTION_KEYS = ("caption", "text", "txt", "TEXT", "prompt")  # also the caption columns of tables, in this order
# img2dataset's .json member and the parquet beside a shard repeat the caption; meta keeps it once, as caption
JSON_CAPTION_KEYS = ("caption", "text")


@dataclass
class Record:
    source: str | int  # file path, row or shard:key, kept in meta to trace a sample back
    image: Any  # encoded bytes, a local file (a Path, admitted by storage.outside_root), or None: none for it
    caption: str | None  # None: the source has no caption for this image
    fields: dict[str, Any]  # the source's other json-serializable fields: filters read them, meta keeps them


@dataclass
class ReadCounts:
    """What readers refused below the level of samples."""

    refused: int = 0  # files not read: links, devices, names or paths leading out, files over their limit
    truncated: int = 0  # tar shards that ended before their end-of-archive
    bad_json: int = 0  # .json sidecars and members not read: over MAX_SIDECAR_BYTES, too deep, or not JSON
    tars_stopped: int = 0  # tar shards refused part-way: a header over its limit, or a gzip bomb
    row_groups: int = 0  # Parquet row groups not read: more uncompressed bytes than the limit


@dataclass(frozen=True)
class Filter:
    """Keep a record whose field ``what`` is at least (``min``) or at most (``max``) ``value``, or one of
    ``value`` (``in``, case-insensitive). Applies where the record has the field; an unknown value (None, NaN,
    not a number) is dropped."""

    what: str  # as in the --<what>-column option: aesthetic, language, punsafe, watermark
    column: str | None
    candidates: tuple[str, ...]
    op: str  # "min", "max" or "in"
    value: Any

    def find(self, names: Collection[str]) -> str | None:
        return next((c for c in ((self.column,) if self.column else self.candidates) if c in names), None)

    def keep(self, fields: dict[str, Any]) -> bool:
        name = self.find(fields)
        return name is None or self.accept(fields[name])

    def accept(self, value: Any) -> bool:
        if self.op == "in":
            return value is not None and str(value).lower() in self.value
        try:
            number = float(value)
        except (TypeError, ValueError):
            return False
        if math.isnan(number):
            return False
        return number >= self.value if self.op == "min" else number <= self.value


def scalar_fields(row: dict[str, Any]) -> dict[str, Any]:
    """The json-serializable scalars of a row or a .json member; lists and structs stay out of meta, and so do
    texts that would take it past ``MAX_SIDECAR_BYTES`` (a row of a table is as bounded as a sample's .json)."""
    fields, size = {}, 0
    for k, v in row.items():
        if v is None or isinstance(v, (str, int, float, bool)):
            cost = len(k) + (len(v) if isinstance(v, str) else 8)
            if size + cost <= MAX_SIDECAR_BYTES:
                fields[k], size = v, size + cost
    return fields


def caption_and_fields(json_text: str | bytes | None, txt: str | None,
                       joined: dict[str, Any] | None = None) -> tuple[str | None, dict[str, Any]]:
    """A sample's caption (``.txt`` first, then the json's or the joined row's caption) and its fields: the
    joined metadata row (the parquet beside a shard), overridden by its own ``.json``. Raises WorkbenchError
    (one line) on a json over ``MAX_SIDECAR_BYTES``, nested too deep or not JSON."""
    fields = dict(joined or {})
    if json_text is not None:
        data = loads_outside(json_text, "a sample's .json", max_bytes=MAX_SIDECAR_BYTES)
        if isinstance(data, dict):
            fields.update(scalar_fields(data))
    caption = txt
    for key in JSON_CAPTION_KEYS:
        value = fields.pop(key, None)
        if caption is None and value is not None:
            caption = str(value)
    return caption, fields
