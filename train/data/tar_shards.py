"""WebDataset tar shards, as img2dataset's ``webdataset`` output writes them (``00000.tar`` of
``000000000.jpg/.txt/.json``, with ``00000.parquet`` of every row's metadata beside it) or any WebDataset
writer does.

A sample is the run of members sharing a key: the member's path up to the first dot of its file name
(WebDataset's rule). The tar is read in one forward pass, local or streamed from S3. Members are untrusted:
links, devices, absolute or ``..`` names and members over ``MAX_FILE_BYTES`` are refused and counted, never
read; a tar cut short ends its shard with the samples read whole before the cut, and is counted.

Only what a sample is made of is read: one image (the first of ``IMAGE_EXTENSIONS`` it has), its ``.txt`` and
its ``.json``, each text up to ``MAX_SIDECAR_BYTES``; so a sample holds at most one file's limit however many
members share its key (forty 60 MiB members of one key took 2.4 GB when every member was kept). A shard stops,
counted, at a long-name or pax header over ``MAX_HEADER_BYTES`` (``tarfile`` reads one whole into memory:
2.5 GiB for a hostile one) or at an old GNU sparse member, and a ``.tar.gz`` once it has expanded to more than
``MAX_GZIP_RATIO`` times the compressed bytes read (3.5 MiB expanded to 3.4 GiB); the members read whole
before the stop are kept.
"""
from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import PurePosixPath
from typing import Any, BinaryIO, Iterator

from models.errors import WorkbenchError

from .records import IMAGE_SUFFIXES, MAX_FILE_BYTES, MAX_SIDECAR_BYTES, ReadCounts, Record, caption_and_fields
from .storage import exists, is_remote, open_stream, outside_root, unsafe_name
from .tables import metadata_by_key

IMAGE_EXTENSIONS = tuple(s.lstrip(".") for s in sorted(IMAGE_SUFFIXES))
TEXT_EXTENSIONS = ("txt", "json")
# A GNU long name or link, or a pax header: real ones hold a path (at most 4 KiB on Linux) and a few
# attributes (extended attributes, ACLs: a few KiB).
MAX_HEADER_BYTES = 2**20
LONG_HEADERS = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                tarfile.SOLARIS_XHDTYPE)
# Tars of JPEGs compress by 1-5%, of tiny PNGs and their headers about 3x; gzip's own limit is about 1000x.
MAX_GZIP_RATIO = 100
GZIP_MAGIC = b"\x1f\x8b"


class ShardStopped(Exception):
    """A tar shard refused part-way (a header over its limit, a gzip bomb): counted, the rest never read."""


class _BoundedHeaders(tarfile.TarInfo):
    """tarfile's headers, each judged before tarfile reads what it announces: a long-name or pax header over
    ``MAX_HEADER_BYTES``, and the old GNU sparse format (its extension blocks chain without end), stop the
    shard. ``fromtarfile`` is tarfile's own (Python 3.8-3.13) with the check between header and extension."""

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> tarfile.TarInfo:
        block = tar.fileobj.read(tarfile.BLOCKSIZE)
        header = cls.frombuf(block, tar.encoding, tar.errors)
        header.offset = tar.fileobj.tell() - tarfile.BLOCKSIZE
        if header.type in LONG_HEADERS and header.size > MAX_HEADER_BYTES:
            raise ShardStopped
        if header.type == tarfile.GNUTYPE_SPARSE:
            raise ShardStopped
        return header._proc_member(tar)


class _Gunzip(io.RawIOBase):
    """A gzip stream's decompressed bytes, refused (``ShardStopped``) past ``MAX_GZIP_RATIO`` times the compressed
    bytes read, plus one file's limit."""

    def __init__(self, compressed: "_Prefixed"):
        self.compressed = compressed
        self.gzip = gzip.GzipFile(fileobj=compressed, mode="rb")
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.gzip.read(len(buffer))
        buffer[:len(data)] = data
        self.count += len(data)
        if self.count > MAX_GZIP_RATIO * self.compressed.count + MAX_FILE_BYTES:
            raise ShardStopped
        return len(data)


class _Prefixed(io.RawIOBase):
    """``head`` (bytes already read) and then the rest of ``stream``, counted as they are read."""

    def __init__(self, head: bytes, stream: BinaryIO):
        self.head, self.stream, self.count = head, stream, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.head:
            data, self.head = self.head[:len(buffer)], self.head[len(buffer):]
        else:
            data = self.stream.read(len(buffer))
        buffer[:len(data)] = data
        self.count += len(data)
        return len(data)


def _tar_bytes(stream: BinaryIO) -> BinaryIO:
    """The tar inside a plain or gzipped stream, told apart by its first bytes."""
    head = stream.read(len(GZIP_MAGIC))
    whole = _Prefixed(head, stream)
    return io.BufferedReader(_Gunzip(whole)) if head == GZIP_MAGIC else whole


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


def _wanted(parts: dict[str, bytes], extension: str, member: tarfile.TarInfo, counts: ReadCounts) -> bool:
    """Whether a member is read into its sample: its image (the first of ``IMAGE_EXTENSIONS``; one it
    replaces is dropped first) or a text within ``MAX_SIDECAR_BYTES`` (over it: refused, counted)."""
    if extension in TEXT_EXTENSIONS:
        if member.size > MAX_SIDECAR_BYTES:
            counts.refused += 1
            return False
        return True
    if extension not in IMAGE_EXTENSIONS:
        return False
    held = next((e for e in IMAGE_EXTENSIONS if e in parts), None)
    if held is not None and IMAGE_EXTENSIONS.index(held) <= IMAGE_EXTENSIONS.index(extension):
        return False
    parts.pop(held, None)
    return True


def _record(shard: str, key: str, parts: dict[str, bytes], joined: dict[str, Any] | None,
            counts: ReadCounts) -> Record:
    image = next((parts[e] for e in IMAGE_EXTENSIONS if e in parts), None)
    txt = parts["txt"].decode("utf-8", errors="replace") if "txt" in parts else None
    try:
        caption, fields = caption_and_fields(parts.get("json"), txt, joined)
    except WorkbenchError:  # a .json too large, too deep or broken: the sample keeps its .txt caption
        counts.bad_json += 1
        caption, fields = caption_and_fields(None, txt, joined)
    return Record(f"{shard}:{key}", image, caption, fields)


def _metadata_beside(url: str, counts: ReadCounts) -> dict[str, dict]:
    """img2dataset's Parquet beside a ``.tar`` (``00000.parquet``), when there is one; a local one that is a
    link or not a regular file is refused and counted."""
    if not url.endswith(".tar"):
        return {}
    beside = url[: -len(".tar")] + ".parquet"
    if is_remote(beside):
        return metadata_by_key(beside, counts) if exists(beside) else {}
    folder, _, name = beside.rpartition("/")
    reason = outside_root(folder or ".", name)
    if reason == "does not exist":
        return {}
    if reason:
        counts.refused += 1
        return {}
    return metadata_by_key(beside, counts)


def tar_records(url: str, name: str, counts: ReadCounts) -> Iterator[Record]:
    """The samples of one tar shard, joined by key with the img2dataset parquet beside it when there is one."""
    metadata = _metadata_beside(url, counts)
    key, parts = None, {}
    try:
        with open_stream(url) as stream, tarfile.open(fileobj=_tar_bytes(stream), mode="r|",
                                                      tarinfo=_BoundedHeaders) as tar:
            for member_key, extension, member in _members(tar, counts):
                if member_key != key and parts:  # a sample ends where the next begins, before its data is read
                    yield _record(name, key, parts, metadata.get(key), counts)
                    parts = {}
                key = member_key
                if _wanted(parts, extension, member, counts):
                    parts[extension] = tar.extractfile(member).read()
    except ShardStopped:  # the members read whole are kept; the rest of the shard is never read
        counts.tars_stopped += 1
    except (tarfile.TarError, EOFError, OSError):  # cut short or not a tar: the sample being read is lost
        counts.truncated += 1
        return
    if parts:
        yield _record(name, key, parts, metadata.get(key), counts)
