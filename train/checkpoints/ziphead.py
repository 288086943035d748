"""A zip-format checkpoint's directory and pickle, read once per version of the file.

Naming a Composer checkpoint (``hashing``: its directory's CRC-32s) and summarising it (``composer.read_summary``:
its pickle) each parsed the zip directory on their own: on a full-size SD2-base checkpoint (3,371 members) three
parses by ``zipfile``, 0.066 s each, in a door that must stay under 2% of a 3.1 s open (bench/door_cost.py).
The directory is now read once, by ``_read_fast`` (the layout PyTorch writes: no encryption, the pickle stored
uncompressed), and by ``zipfile`` for anything else; both give the same ``ZipHead``.
"""
from __future__ import annotations

import functools
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

EOCD, EOCD64_LOCATOR, EOCD64 = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"
MEMBER, LOCAL = b"PK\x01\x02", b"PK\x03\x04"
MAX_DIRECTORY = 64 << 20  # bytes: a 3,371-member checkpoint's directory is 0.2 MB
MAX_PICKLE = 1 << 30
FULL32 = 0xFFFFFFFF


@dataclass(frozen=True)
class ZipHead:
    members: tuple[tuple[str, int, int], ...]  # (name, CRC-32, size) of every member, in the archive's order
    pickle: bytes | None  # the ``data.pkl`` member (None when there is none)


def _is_pickle(name: str) -> bool:
    return name.endswith("/data.pkl") or name == "data.pkl"


def _read_zipfile(path: str) -> ZipHead:
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        name = next((i.filename for i in infos if _is_pickle(i.filename)), None)
        return ZipHead(tuple((i.filename, i.CRC, i.file_size) for i in infos), z.read(name) if name else None)


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


def _read_fast(path: str, size: int) -> ZipHead | None:
    with open(path, "rb") as f:
        place = _directory_place(f, size)
        if place is None:
            return None
        count, offset, length = place
        f.seek(offset)
        directory = f.read(length)
        members, pickle_at, at = [], None, 0
        for _ in range(count):
            if directory[at:at + 4] != MEMBER:
                return None
            (flags, method, crc, csize, usize, n, m, k) = struct.unpack_from("<8x2H4x3I3H", directory, at)
            local = struct.unpack_from("<I", directory, at + 42)[0]
            name = directory[at + 46:at + 46 + n].decode("utf-8" if flags & 0x800 else "cp437")
            usize, csize, local = _zip64(directory[at + 46 + n:at + 46 + n + m], usize, csize, local)
            if flags & 0x1:
                return None  # encrypted
            members.append((name, crc, usize))
            if pickle_at is None and _is_pickle(name):
                pickle_at = (local, csize, method, crc)
            at += 46 + n + m + k
        return ZipHead(tuple(members), _stored_member(f, *pickle_at) if pickle_at else None)


def _stored_member(f, local: int, csize: int, method: int, crc: int) -> bytes:
    """A member written without compression, checked against its CRC-32 (else ``BadZipFile`` via the fallback)."""
    f.seek(local)
    header = f.read(30)
    if method != 0 or len(header) < 30 or header[:4] != LOCAL or csize > MAX_PICKLE:
        raise _Unusual
    n, m = struct.unpack_from("<HH", header, 26)
    f.seek(local + 30 + n + m)
    data = f.read(csize)
    if len(data) != csize or zlib.crc32(data) != crc:
        raise _Unusual
    return data


class _Unusual(Exception):
    """A layout the fast reader leaves to ``zipfile``."""


@functools.lru_cache(maxsize=16)
def _read(path: str, size: int, mtime_ns: int) -> ZipHead:
    try:
        head = _read_fast(path, size)
    except (_Unusual, struct.error, UnicodeDecodeError, IndexError, OverflowError, ValueError):
        head = None
    return head if head is not None else _read_zipfile(path)


def zip_head(path: str | Path) -> ZipHead:
    """Raises what ``zipfile`` raises for a file that is not a readable zip archive (``BadZipFile``, ``OSError``...)."""
    st = Path(path).stat()
    return _read(str(path), st.st_size, st.st_mtime_ns)
