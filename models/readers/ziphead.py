"""A zip-format checkpoint's directory and pickle, read once per version of the file, every inflation bounded.

Naming a Composer checkpoint (``hashing``: its directory's CRC-32s) and summarising it (``composer.read_summary``:
its pickle) each parsed the zip directory on their own: on a full-size SD2-base checkpoint (3,371 members) three
parses by ``zipfile``, 0.066 s each, in a door that must stay under 2% of a 3.1 s open (bench/door_cost.py).
The directory is now read once, by ``_read_fast`` (the end records and the central directory, as PyTorch
writes them), and by ``zipfile`` for anything else; both give the same ``ZipHead``.

**Inflation.** ``torch.save`` stores every member uncompressed, but PyTorch's reader and ``zipfile`` also take
deflated ones, and allocate what the directory declares: a 3 MiB checkpoint whose deflated ``data.pkl``
declared 3 GiB took `dwb sample` and the app's listing past 2 GiB of memory in seconds. Before anything is
inflated, the declared inflated sizes of the compressed members (the central directory's and each local
header's) are summed and held to ``max_inflated()`` (``DWB_MAX_INFLATED_MB``, default 256: the largest tensor
of SD 1.x/2.x, the CLIP token embedding, is 202 MB in float32), and a stored member must declare the size it
holds. The pickle is then inflated in a stream with a running count, so a header that lies is stopped at the
size it declared. Every reader of a zip checkpoint (``torch.load`` in ``composer`` and ``single_file``, the
pickle here, ``autoresume``'s CRC check) calls ``zip_head`` first: the one place the bound is kept. A value of a
sharded checkpoint (a ``torch.save`` zip inside a part) is held to more: ``stored_zip_problem`` takes no compressed
member at all.
"""
from __future__ import annotations

import functools
import io
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError, WorkbenchError

EOCD, EOCD64_LOCATOR, EOCD64 = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"
MEMBER, LOCAL = b"PK\x01\x02", b"PK\x03\x04"
MAX_DIRECTORY = 64 << 20  # bytes: a 3,371-member checkpoint's directory is 0.2 MB
MAX_INFLATED_ENV = "DWB_MAX_INFLATED_MB"
DEFAULT_MAX_INFLATED_MB = 256
STORED, DEFLATED = 0, 8
CHUNK = 1 << 16  # compressed bytes read at a time while inflating
FULL32 = 0xFFFFFFFF


@dataclass(frozen=True)
class ZipHead:
    members: tuple[tuple[str, int, int], ...]  # (name, CRC-32, size) of every member, in the archive's order
    pickle: bytes | None  # the ``data.pkl`` member (None when there is none)


@dataclass(frozen=True)
class _Member:
    name: str
    crc: int
    size: int  # inflated, as the central directory declares it
    compressed: int
    method: int
    local: int  # offset of its local header
    flags: int


def mib_limit(env: str, default_mib: int) -> int:
    """Bytes a limit set in MiB by the environment variable ``env`` allows (``default_mib`` where it is unset);
    a one-line error for a value that is not a whole number of at least 1."""
    raw = os.environ.get(env, str(default_mib))
    try:
        mib = int(raw)
    except ValueError:
        mib = 0
    if mib < 1:
        raise WorkbenchError(f"{env}={raw!r}: expected a whole number of MiB, at least 1")
    return mib << 20


def max_inflated() -> int:
    """Bytes the compressed members of one checkpoint may inflate to, in all (``DWB_MAX_INFLATED_MB``)."""
    return mib_limit(MAX_INFLATED_ENV, DEFAULT_MAX_INFLATED_MB)


def _is_pickle(name: str) -> bool:
    return name.endswith("/data.pkl") or name == "data.pkl"


def _zipfile_members(path: str) -> list[_Member]:
    with zipfile.ZipFile(path) as z:
        return [_Member(i.filename, i.CRC, i.file_size, i.compress_size, i.compress_type, i.header_offset, i.flag_bits)
                for i in z.infolist()]


def _directory_place(f, size: int) -> tuple[int, int, int] | None:
    """(members, offset, length) of the central directory, from the end records (zip64 when they overflow)."""
    tail_length = min(size, 22 + 0xFFFF)
    f.seek(size - tail_length)
    tail = f.read(tail_length)
    at = tail.rfind(EOCD)
    if at < 0 or at + 22 > len(tail):
        return None
    count, length, offset = struct.unpack_from("<HII", tail, at + 10)
    if count == 0xFFFF or FULL32 in (length, offset):
        if at < 20 or tail[at - 20:at - 16] != EOCD64_LOCATOR:
            return None
        f.seek(struct.unpack_from("<Q", tail, at - 12)[0])
        record = f.read(56)
        if len(record) < 56 or record[:4] != EOCD64:
            return None
        count, length, offset = struct.unpack_from("<QQQ", record, 32)
    return (count, offset, length) if length <= MAX_DIRECTORY and offset + length <= size else None


def _zip64(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    """Sizes and offset that overflowed 32 bits, from the zip64 extra field (in that order)."""
    at = 0
    while at + 4 <= len(extra):
        kind, n = struct.unpack_from("<HH", extra, at)
        if kind == 1:
            values = list(struct.unpack_from(f"<{n // 8}Q", extra, at + 4))
            usize = values.pop(0) if usize == FULL32 else usize
            csize = values.pop(0) if csize == FULL32 else csize
            offset = values.pop(0) if offset == FULL32 else offset
            break
        at += 4 + n
    return usize, csize, offset


def _fast_members(f, size: int) -> list[_Member] | None:
    """The central directory's members, read directly; None for a layout left to ``zipfile``."""
    place = _directory_place(f, size)
    if place is None:
        return None
    count, offset, length = place
    f.seek(offset)
    directory = f.read(length)
    members, at = [], 0
    for _ in range(count):
        if directory[at:at + 4] != MEMBER:
            return None
        (flags, method, crc, csize, usize, n, m, k) = struct.unpack_from("<8x2H4x3I3H", directory, at)
        local = struct.unpack_from("<I", directory, at + 42)[0]
        name = directory[at + 46:at + 46 + n].decode("utf-8" if flags & 0x800 else "cp437")
        usize, csize, local = _zip64(directory[at + 46 + n:at + 46 + n + m], usize, csize, local)
        members.append(_Member(name, crc, usize, csize, method, local, flags))
        at += 46 + n + m + k
    return members


def _local_header(f, member: _Member) -> tuple[int, int, int]:
    """(where the member's data starts, the inflated size its local header declares, its method)."""
    f.seek(member.local)
    header = f.read(30)
    if len(header) < 30 or header[:4] != LOCAL:
        raise zipfile.BadZipFile(f"bad local header for {member.name!r}")
    method, csize, usize, n, m = struct.unpack_from("<8xH8x2I2H", header)
    try:
        usize = _zip64(f.read(n + m)[n:], usize, csize, 0)[0]
    except struct.error:
        raise zipfile.BadZipFile(f"bad zip64 field in the local header of {member.name!r}") from None
    return member.local + 30 + n + m, usize, method


def _check_sizes(path: str, f, members: list[_Member], limit: int) -> None:
    """A one-line CheckpointError, before anything is inflated, for members whose declared sizes (directory and
    local header) would take more than ``limit`` bytes in all, or a stored member that declares another size
    than it holds."""
    declared = 0
    for member in members:
        if member.method == STORED:
            if member.size != member.compressed:
                raise CheckpointError(f"cannot read checkpoint {path}: zip member {member.name} is stored as "
                                      f"{member.compressed:,} bytes but declares {member.size:,}")
            continue
        local_size = _local_header(f, member)[1]
        declared += max(member.size, local_size)
        if declared > limit:
            raise CheckpointError(
                f"cannot read checkpoint {path}: its compressed zip members would inflate to at least {declared:,} "
                f"bytes ({member.name}: {member.size:,} in the directory, {local_size:,} in its local header), "
                f"over the limit of {limit:,} ({MAX_INFLATED_ENV}={limit >> 20})")


def _inflate(f, path: str, member: _Member, start: int) -> bytes:
    """A deflated member, inflated a chunk at a time and stopped once past the size its directory declared."""
    out, left, inflater = bytearray(), member.compressed, zlib.decompressobj(-15)
    f.seek(start)
    while left > 0 and not inflater.eof:
        data = f.read(min(CHUNK, left))
        if not data:
            raise zipfile.BadZipFile(f"{member.name!r} is cut short")
        left -= len(data)
        while data:
            out += inflater.decompress(data, member.size - len(out) + 1)
            if len(out) > member.size:
                raise CheckpointError(f"cannot read checkpoint {path}: zip member {member.name} inflates past the "
                                      f"{member.size:,} bytes its directory declares")
            data = inflater.unconsumed_tail
    return bytes(out)


def _member_bytes(f, path: str, member: _Member) -> bytes:
    """A member's bytes (stored or deflated), checked against its size and CRC-32 as ``zipfile`` checks them."""
    start, _, method = _local_header(f, member)
    if member.flags & 0x1:
        raise zipfile.BadZipFile(f"{member.name!r} is encrypted")
    if method != member.method or method not in (STORED, DEFLATED):
        raise zipfile.BadZipFile(f"{member.name!r}: compression method {method} (stored or deflated expected)")
    if method == STORED:
        f.seek(start)
        data = f.read(member.compressed)
    else:
        data = _inflate(f, path, member, start)
    if len(data) != member.size:
        raise zipfile.BadZipFile(f"{member.name!r} is cut short")
    if zlib.crc32(data) != member.crc:
        raise zipfile.BadZipFile(f"Bad CRC-32 for file {member.name!r}")
    return data


def _head(path: str, members: list[_Member], limit: int) -> ZipHead:
    with open(path, "rb") as f:
        _check_sizes(path, f, members, limit)
        pickle = next((m for m in members if _is_pickle(m.name)), None)
        return ZipHead(tuple((m.name, m.crc, m.size) for m in members),
                       _member_bytes(f, path, pickle) if pickle else None)


def _read_fast(path: str, size: int, limit: int | None = None) -> ZipHead | None:
    with open(path, "rb") as f:
        members = _fast_members(f, size)
    return None if members is None else _head(path, members, max_inflated() if limit is None else limit)


def _read_zipfile(path: str, limit: int | None = None) -> ZipHead:
    return _head(path, _zipfile_members(path), max_inflated() if limit is None else limit)


@functools.lru_cache(maxsize=16)
def _read(path: str, size: int, mtime_ns: int, limit: int) -> ZipHead:
    """The fast reader's head; ``zipfile``'s where the fast reader does not know the layout or fails on it (an
    archive with bytes before it, a damaged file: ``zipfile`` raises what it always raised)."""
    try:
        head = _read_fast(path, size, limit)
    except (zipfile.BadZipFile, struct.error, IndexError, OverflowError, ValueError):
        head = None
    return head if head is not None else _read_zipfile(path, limit)


def zip_head(path: str | Path) -> ZipHead:
    """The directory and pickle of a zip checkpoint; a one-line CheckpointError for one whose members would
    inflate past ``max_inflated()``. Raises what ``zipfile`` raises for a file that is not a readable zip
    archive (``BadZipFile``, ``OSError``...)."""
    st = Path(path).stat()
    return _read(str(path), st.st_size, st.st_mtime_ns, max_inflated())


def check_inflation(path: str | Path) -> None:
    """Before a library opens ``path`` as a zip (``torch.load``): a one-line CheckpointError when its members
    would inflate past ``max_inflated()``; a file that is no readable zip is left to that library to name."""
    try:
        zip_head(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, struct.error):
        pass


def stored_zip_problem(data: bytes, max_pickle: int | None = None) -> str | None:
    """Why the zip archive ``data`` (a value of a sharded checkpoint: ``torch.save``'s zip, every member stored as
    it is) could make PyTorch's reader allocate more than it holds, or is damaged; None when every member is stored,
    within the archive, no two overlapping (their sizes sum to no more than it holds), each with its CRC-32, and its
    pickle (``data.pkl``) no longer than ``max_pickle``: the tensors' bytes are allocated as they are stored, the
    objects a pickle builds grow with its length. The directory is read where PyTorch's reader reads it (at the
    offset its end record gives)."""
    f = io.BytesIO(data)
    try:
        members = _fast_members(f, len(data))
        if members is None:
            return "no zip directory where PyTorch's reader looks for one"
        for member in members:
            start, _, method = _local_header(f, member)
            if STORED != member.method or STORED != method:
                return (f"zip member {member.name} is compressed ({member.compressed:,} bytes declared to inflate to "
                        f"{member.size:,}; torch.save stores every member as it is)")
            if member.size != member.compressed or start + member.size > len(data):
                return f"zip member {member.name} declares {member.size:,} bytes, more than it holds"
            if zlib.crc32(memoryview(data)[start:start + member.size]) != member.crc:
                return f"bad CRC-32 for zip member {member.name}"
            if max_pickle is not None and member.name.endswith(".pkl") and member.size > max_pickle:
                return f"its pickle {member.name} is {member.size:,} bytes, more than plain data may take ({max_pickle:,})"
    except (zipfile.BadZipFile, struct.error, UnicodeDecodeError, ValueError, IndexError) as e:
        return f"a damaged zip directory ({type(e).__name__})"
    if sum(member.size for member in members) > len(data):
        return "zip members that overlap (their sizes sum to more than the archive holds)"
    return None
