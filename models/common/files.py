"""Files written whole or not at all, and a full disk said in one line; the SHA-256 of a file's bytes.

A write that runs out of space (ENOSPC), quota (EDQUOT) or the file-size limit (EFBIG) stops partway. Written
in place, that left a torn file behind, and ``torch.save`` given a path said only "unexpected pos 3328 vs
3216". Here a file is written under a temporary name beside its place and renamed over it once whole; on any
error the temporary file is removed, and a full disk is a WorkbenchError naming the folder.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..errors import WorkbenchError

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")  # how Rust writers (safetensors) report the OS error


def _os_error_code(e: BaseException) -> int | None:
    if isinstance(e, OSError):
        return e.errno
    code = RUST_OS_ERROR.search(str(e))
    return int(code.group(1)) if code else None


def _full_disk_cause(e: BaseException | None) -> int | None:
    """The disk-full error code behind ``e``, also where a library raised its own error while handling it:
    ``torch.save`` into a file ends a failed write with "unexpected pos ..." whose context is the OSError."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if _os_error_code(e) in DISK_FULL:
            return _os_error_code(e)
        e = e.__cause__ or e.__context__
    return None


def is_disk_full(e: BaseException) -> bool:
    return _full_disk_cause(e) is not None


def disk_full_error(folder: str | Path, what: str, e: BaseException) -> WorkbenchError:
    """``what``: the file or rows that were not written (nothing of them is left behind)."""
    return WorkbenchError(f"the disk is full under {folder} ({os.strerror(_full_disk_cause(e))}); {what} not written: "
                          f"free some space and run again")


@contextmanager
def whole_file(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to (hidden, and no ``*.png`` a folder listing would take for a
    result: give image writers the format); it replaces ``path`` once the block ends without error and is
    removed otherwise."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if is_disk_full(e):
            raise disk_full_error(path.parent, path.name, e) from None
        raise


def write_bytes_whole(path: str | Path, data: bytes) -> Path:
    with whole_file(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_whole(path: str | Path, text: str) -> Path:
    return write_bytes_whole(path, text.encode())


def torch_save_whole(obj: Any, path: str | Path) -> Path:
    """``torch.save`` into an open file: given a path, PyTorch's writer reports a failed write only as
    "unexpected pos 3328 vs 3216"; into a file, that error's context is the OSError (``is_disk_full``)."""
    import torch

    with whole_file(path) as tmp, open(tmp, "wb") as f:
        torch.save(obj, f)
    return Path(path)


@contextmanager
def whole_folder(path: str | Path) -> Iterator[Path]:
    """A temporary folder beside ``path`` to fill; it becomes ``path`` (which must be absent or empty) once the
    block ends without error and is removed otherwise."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
        os.replace(tmp, path)  # over an empty folder too
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(e):
            raise disk_full_error(path.parent, path.name, e) from None
        raise


def sha256_of(path: str | Path, start: int = 0) -> str:
    """The hex SHA-256 of a file's bytes from ``start`` to its end, read in 1 MiB pieces (the hashes A1111 and kohya
    give a file: a VAE's whole file, a LoRA's bytes after its safetensors header)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        for piece in iter(lambda: f.read(1 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()
