"""A checkpoint's content hash: what a PNG, a results row and a study name it by.

It identifies the weights' bytes without reading all of them, so naming a 10 GB checkpoint costs little
next to opening it:

- a zip-format file (Composer ``.pt``, ``.ckpt``): the archive's directory, whose CRC-32 of every member
  was computed over every byte when the file was written (reading it costs milliseconds);
- any other file (``.safetensors``): its size, its first MiB (a safetensors header: every tensor's name,
  dtype, shape and offset) and 4 KiB at 128 evenly spaced places and at its end: two trainings differ in every tensor, so a
  sample tells them apart. Reading 64 KiB at each place instead cost 8.5% of opening a full-size SD2-base
  diffusers folder from the page cache (bench/door_cost.py); 4 KiB keeps the door under 2%;
- a diffusers folder (a hub snapshot too): its configs and each weights file's hash.

It is an identity, not a check: a zip file damaged after it was written keeps its directory and so its
hash (``composer.checkpoint_problem`` verifies every CRC), and nothing here proves a file was not tampered with.
"""
from __future__ import annotations

import hashlib
import threading
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import CheckpointError
from ..readers import zip_head

if TYPE_CHECKING:
    import torch

SHORT = 12  # hex digits shown and stored
SAMPLES, SAMPLE_BYTES = 128, 4 * 1024
_cache: dict[tuple[str, int, int], str] = {}
_lock = threading.Lock()


def _zip_digest(path: Path, h) -> bool:
    try:
        members = zip_head(path).members
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, CheckpointError):
        return False  # named by its sampled bytes, as any other file
    # the archive's top folder is named after the file it was first saved as: leave it out
    for name, crc, size in sorted(((n.split("/", 1)[-1], c, s) for n, c, s in members)):
        h.update(f"{name}:{crc}:{size}\n".encode())
    return True


def _sampled_digest(path: Path, h) -> None:
    size = path.stat().st_size
    h.update(f"size:{size}\n".encode())
    with open(path, "rb") as f:
        h.update(f.read(min(size, 1 << 20)))  # a safetensors header, or the file's start
        step = max(size // SAMPLES, 1)
        for offset in [*range(0, size, step), max(size - SAMPLE_BYTES, 0)]:  # and the file's end
            f.seek(offset)
            h.update(f.read(SAMPLE_BYTES))


def file_hash(path: Path) -> str:
    """The full hex digest of one file's content (cached by path, size and mtime)."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _lock:
        if key in _cache:
            return _cache[key]
    h = hashlib.sha256()
    if not _zip_digest(path, h):
        h = hashlib.sha256()
        _sampled_digest(path, h)
    digest = h.hexdigest()
    with _lock:
        _cache[key] = digest
    return digest


def folder_hash(folder: Path) -> str:
    """A diffusers folder: every config and weights file under it, by relative path."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if path.suffix in (".json", ".txt"):
            h.update(f"{rel}:".encode() + path.read_bytes())
        elif path.suffix in (".safetensors", ".bin", ".pt", ".ckpt"):
            h.update(f"{rel}:{file_hash(path)}\n".encode())
        elif path.suffix == ".distcp" or path.name == ".metadata":  # a sharded Composer checkpoint's parts
            h.update(f"{rel}:".encode())
            _sampled_digest(path, h)
    return h.hexdigest()


def content_hash(ckpt) -> str:
    """The short content hash of a found ``Checkpoint`` (``SHORT`` hex digits)."""
    path = ckpt.path
    return (folder_hash(path) if path.is_dir() else file_hash(path))[:SHORT]


def fingerprint(module: torch.nn.Module, held_in: torch.dtype | None = None) -> str:
    """A hash of a module's weights (names, dtypes, shapes and bytes), independent of the file format: what
    precomputed latents and the scoring models' results name their weights by. ``held_in``: the hash the module
    would have once held in that dtype (``frozen.held_dtype``: a frozen part in a GPU run's half precision), each
    tensor cast on its own, never the whole module at once."""
    import torch

    from .frozen import held_dtype

    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu()
        if held_in is not None:
            t = t.to(held_dtype(module, name, t, held_in))
        t = t.contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # 0-d tensors too
    return h.hexdigest()[:16]
