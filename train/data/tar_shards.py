"""WebDataset tar shards, as img2dataset's ``webdataset`` output writes them (``00000.tar`` of
``000000000.jpg/.txt/.json``, with ``00000.parquet`` of every row's metadata beside it) or any WebDataset
writer does.

A sample is the run of members sharing a key: the member's path up to the first dot of its file name
(WebDataset's rule). The tar is read in one forward pass, local or streamed from S3. Members are untrusted:
links, devices, absolute or ``..`` names and members over ``MAX_FILE_BYTES`` are refused and counted, never
read; a tar cut short ends its shard with the samples read whole before the cut, and is counted.
"""
from __future__ import annotations

import tarfile
from pathlib import PurePosixPath
from typing import Any, Iterator

from .records import IMAGE_SUFFIXES, MAX_FILE_BYTES, ReadCounts, Record, caption_and_fields
from .storage import exists, open_stream, unsafe_name
from .tables import metadata_by_key

IMAGE_EXTENSIONS = tuple(s.lstrip(".") for s in sorted(IMAGE_SUFFIXES))


def _key_and_extension(name: str) -> tuple[str, str]:
    path = PurePosixPath(name)
    stem, _, extension = path.name.partition(".")
    return str(path.parent / stem) if str(path.parent) != "." else stem, extension.lower()


def _members(tar: tarfile.TarFile, counts: ReadCounts) -> Iterator[tuple[str, str, tarfile.TarInfo]]:
    """(key, extension, member) of each regular, safely named member of bounded size; its data is read by
    the caller before the next one (stream mode)."""
    for member in tar:
        if member.isdir():
            continue
        if not member.isfile() or unsafe_name(member.name) or member.size > MAX_FILE_BYTES:
            counts.refused += 1  # tarfile's stream mode skips its data without keeping it
            continue
        yield (*_key_and_extension(member.name), member)


def _record(shard: str, key: str, parts: dict[str, bytes], joined: dict[str, Any] | None) -> Record:
    image = next((parts[e] for e in IMAGE_EXTENSIONS if e in parts), None)
    txt = parts["txt"].decode("utf-8", errors="replace") if "txt" in parts else None
    try:
        caption, fields = caption_and_fields(parts.get("json"), txt, joined)
    except ValueError:  # a broken .json: the sample keeps its .txt caption, without fields
        caption, fields = txt, {}
    return Record(f"{shard}:{key}", image, caption, fields)


def tar_records(url: str, name: str, counts: ReadCounts) -> Iterator[Record]:
    """The samples of one tar shard, joined by key with the img2dataset parquet beside it when there is one."""
    beside = url[: -len(".tar")] + ".parquet" if url.endswith(".tar") else None
    metadata = metadata_by_key(beside) if beside and exists(beside) else {}
    key, parts = None, {}
    try:
        with open_stream(url) as stream, tarfile.open(fileobj=stream, mode="r|*") as tar:
            for member_key, extension, member in _members(tar, counts):
                if member_key != key and parts:  # a sample ends where the next begins, before its data is read
                    yield _record(name, key, parts, metadata.get(key))
                    parts = {}
                key = member_key
                parts[extension] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError):  # cut short or not a tar: the sample being read is lost
        counts.truncated += 1
        return
    if parts:
        yield _record(name, key, parts, metadata.get(key))
