"""A zip-format checkpoint's directory and pickle, read once per version of the file.

Naming a Composer checkpoint (``hashing``: its directory's CRC-32s) and summarising it (``composer.read_summary``:
its pickle) each parsed the zip directory on their own; on a full-size SD2-base checkpoint (3,371 members) that
was three parses, 0.12 s of a door that must stay under 2% of a 3.3 s open (bench/door_cost.py).
"""
from __future__ import annotations

import functools
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ZipHead:
    members: tuple[tuple[str, int, int], ...]  # (name, CRC-32, size) of every member, in the archive's order
    pickle: bytes | None  # the ``data.pkl`` member (None when there is none)


@functools.lru_cache(maxsize=16)
def _read(path: str, size: int, mtime_ns: int) -> ZipHead:
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        name = next((i.filename for i in infos if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"), None)
        return ZipHead(tuple((i.filename, i.CRC, i.file_size) for i in infos), z.read(name) if name else None)


def zip_head(path: str | Path) -> ZipHead:
    """Raises what ``zipfile`` raises for a file that is not a readable zip archive (``BadZipFile``, ``OSError``...)."""
    st = Path(path).stat()
    return _read(str(path), st.st_size, st.st_mtime_ns)
