"""Which checkpoints the app may open: the allowed roots, discovery under them, and checkpoint hashes.

Every path a user names (picked from the list or typed in) goes through ``resolve_checkpoint``
before anything reads it: the path is resolved (``..`` and symlinks followed) and accepted only when
it lies under one of the roots given to ``dwb app --checkpoints``. A diffusers folder is accepted
only when every file inside it also resolves under a root, so a symlinked weights file cannot pull
in a file from elsewhere.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from train.errors import WorkbenchError

COMPOSER_PATTERN = re.compile(r"^ep\d+-ba\d+-rank0\.pt$")  # Composer's default save name, rank 0
SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}
# The file that identifies a diffusers folder's weights, in the order diffusers looks for them.
UNET_WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors",
                "diffusion_pytorch_model.bin", "diffusion_pytorch_model.fp16.bin")
SHORT_HASH = 10  # hex digits shown in the UI and the PNG parameters (as A1111's "Model hash")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint found under (or accepted inside) the roots."""

    path: Path  # resolved
    kind: str  # "composer" (a .pt file) or "diffusers" (a pipeline folder)
    label: str  # path relative to its root, as listed in the UI


def resolve_roots(folders: list[str | Path]) -> list[Path]:
    """The allowed roots, resolved; each must be an existing folder."""
    roots: list[Path] = []
    for folder in folders:
        root = Path(folder).expanduser().resolve()
        if not root.is_dir():
            raise WorkbenchError(f"checkpoint folder not found: {folder} (give existing folders to --checkpoints)")
        if root not in roots:
            roots.append(root)
    if not roots:
        raise WorkbenchError("no checkpoint folders given (use --checkpoints DIR)")
    return roots


def _root_of(path: Path, roots: list[Path]) -> Path | None:
    return next((r for r in roots if path == r or path.is_relative_to(r)), None)


def _label(path: Path, roots: list[Path]) -> str:
    root = _root_of(path, roots)
    assert root is not None
    if path == root:
        return root.name
    rel = path.relative_to(root).as_posix()
    return f"{root.name}/{rel}" if len(roots) > 1 else rel


def resolve_checkpoint(text: str | Path, roots: list[Path]) -> Checkpoint:
    """The checkpoint a user named, after checking it lies under the roots; nothing is read before that.

    Absolute paths are taken as they are; relative ones are relative to a root (the first one in
    which the path exists), as the UI lists them.
    """
    raw = str(text).strip()
    if not raw:
        raise WorkbenchError("choose a checkpoint (pick one from the list or type its path)")
    if "://" in raw or "\x00" in raw:
        raise WorkbenchError(f"not a local path: {raw}")
    given = Path(raw)
    try:
        if given.is_absolute():
            candidates = [given]
        else:
            candidates = [root / given for root in roots]
            candidates = [c for c in candidates if os.path.lexists(c)] or candidates[:1]
        path = candidates[0].resolve()
    except (OSError, RuntimeError, ValueError) as e:
        raise WorkbenchError(f"invalid checkpoint path {raw}: {e}") from None
    if _root_of(path, roots) is None:
        raise WorkbenchError(f"{raw} is outside the allowed checkpoint folders "
                             f"({', '.join(str(r) for r in roots)})")
    if path.is_dir():
        if not (path / "model_index.json").is_file():
            raise WorkbenchError(f"{raw} is a folder but not a diffusers pipeline (model_index.json missing)")
        for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
            for name in filenames + dirnames:
                inside = Path(dirpath, name)
                if inside.is_symlink() and _root_of(inside.resolve(), roots) is None:
                    raise WorkbenchError(f"{raw} links to {inside.relative_to(path)} outside the allowed "
                                         "checkpoint folders")
        return Checkpoint(path, "diffusers", _label(path, roots))
    if path.is_file():
        return Checkpoint(path, "composer", _label(path, roots))
    raise WorkbenchError(f"checkpoint not found: {raw}")


def _natural(text: str) -> list:
    """Sort key that puts ba2 before ba10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def discover(roots: list[Path], max_depth: int = 8) -> list[Checkpoint]:
    """Composer checkpoints (``ep*-ba*-rank0.pt``) and diffusers folders under the roots.

    Hidden folders are skipped, symlinks are not followed into folders, and a symlinked file is
    listed only when it resolves under a root (and is not another name for a listed file).
    """
    found: dict[Path, Checkpoint] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            here = Path(dirpath)
            depth = len(here.relative_to(root).parts)
            if "model_index.json" in filenames:
                found.setdefault(here, Checkpoint(here, "diffusers", _label(here, roots)))
                dirnames[:] = []  # a pipeline's subfolders hold its parts, not more checkpoints
                continue
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS and depth < max_depth]
            for name in filenames:
                if not COMPOSER_PATTERN.match(name):
                    continue
                path = (here / name).resolve()
                if _root_of(path, roots) is not None and path.is_file():
                    found.setdefault(path, Checkpoint(path, "composer", _label(path, roots)))
    return sorted(found.values(), key=lambda c: _natural(c.label))


# ---------------------------------------------------------------------------------------------
# What a checkpoint is, without loading it


@dataclass(frozen=True)
class CheckpointInfo:
    kind: str
    resolution: int | None  # the training resolution (Composer) or the UNet's native size (diffusers)
    has_ema: bool | None  # None for a diffusers folder: it holds whichever weights were exported
    architecture: str | None = None


def describe(ckpt: Checkpoint) -> CheckpointInfo:
    """Resolution and EMA availability, read from the checkpoint's spec or the folder's configs."""
    if ckpt.kind == "composer":
        from train.checkpoint import has_ema, read_checkpoint

        data = read_checkpoint(ckpt.path)  # memory-mapped: the weights are not read here
        spec = data["spec"]
        return CheckpointInfo("composer", spec.get("resolution"), has_ema(data), spec.get("architecture"))
    try:
        unet = json.loads((ckpt.path / "unet" / "config.json").read_text())
        vae = json.loads((ckpt.path / "vae" / "config.json").read_text())
        resolution = int(unet["sample_size"]) * 2 ** (len(vae["block_out_channels"]) - 1)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise WorkbenchError(f"{ckpt.label}: unreadable unet/vae config ({type(e).__name__}: {e})") from None
    return CheckpointInfo("diffusers", resolution, None)


def weights_file(ckpt: Checkpoint) -> Path:
    """The file whose bytes identify the checkpoint: the .pt itself, or a diffusers folder's UNet weights."""
    if ckpt.kind == "composer":
        return ckpt.path
    for name in UNET_WEIGHTS:
        if (ckpt.path / "unet" / name).is_file():
            return ckpt.path / "unet" / name
    raise WorkbenchError(f"{ckpt.label}: no UNet weights in unet/ ({', '.join(UNET_WEIGHTS[:1])} expected)")


_hashes: dict[tuple[str, int, int], str] = {}
_hash_lock = threading.Lock()


def checkpoint_hash(ckpt: Checkpoint) -> str:
    """sha256 (hex) of ``weights_file(ckpt)``, cached by (path, mtime, size)."""
    path = weights_file(ckpt)
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _hash_lock:
        if key in _hashes:
            return _hashes[key]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    with _hash_lock:
        _hashes[key] = digest.hexdigest()
    return _hashes[key]


def weights_version(ckpt: Checkpoint) -> tuple[int, int]:
    """(mtime_ns, size) of the weights file: a rewritten checkpoint is a different cache entry."""
    st = weights_file(ckpt).stat()
    return st.st_mtime_ns, st.st_size
