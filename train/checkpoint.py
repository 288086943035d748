"""Reading Composer checkpoints of the workbench safely (``torch.load(weights_only=True)``).

A checkpoint written while Composer's EMA runs stores the EMA weights as the model's weights (EMA
swaps them in for saving) and the raw training weights inside the EMA algorithm's state; the
``ema_weights_active`` flag says which is which. ``model_weights(ckpt, ema=...)`` hides that.
"""
from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import torch

from .errors import CheckpointError, WorkbenchError
from .spec import FORMAT

# Plain data types Composer's checkpoints hold besides tensors (RNG states, timestamps, versions).
_SAFE = [np.ndarray, np.dtype, np._core.multiarray._reconstruct, datetime.timedelta, torch.torch_version.TorchVersion,
         *(type(np.dtype(t)) for t in ("uint32", "int64", "float64", "float32", "bool"))]


def read_checkpoint(path: str | Path) -> dict:
    """``{'spec', 'model', 'ema_state', 'timestamp'}`` from a workbench Composer checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with torch.serialization.safe_globals(_SAFE):
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot read checkpoint {path}: corrupt or not a PyTorch file ({reason})") from None
    state = ckpt.get("state") if isinstance(ckpt, dict) else None
    spec = (state or {}).get("callbacks", {}).get("ModelSpec", {}).get("spec")
    if not spec or spec.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a diffusion-workbench checkpoint (no model spec inside)")
    ema_state = next((s for name, s in state.get("algorithms", []) if name in ("EMA", "FusedEMA")), None)
    return {"spec": spec, "model": state["model"], "ema_state": ema_state, "timestamp": state.get("timestamp")}


def has_ema(ckpt: dict) -> bool:
    return bool(ckpt["ema_state"] and ckpt["ema_state"].get("ema_started"))


def model_weights(ckpt: dict, ema: bool = False) -> dict[str, torch.Tensor]:
    """The model's state dict with EMA (``ema=True``) or raw training weights."""
    weights = dict(ckpt["model"])
    if ema and not has_ema(ckpt):
        raise CheckpointError("this checkpoint has no EMA weights (EMA was off or had not started)")
    if not has_ema(ckpt):
        return weights
    state = ckpt["ema_state"]
    stored_are_ema = bool(state.get("ema_weights_active"))
    if ema == stored_are_ema:
        return weights
    other = state["ema_model"]  # the weights not swapped into the model
    for swapped in (other["named_parameters_dict"], other["named_buffers_dict"]):
        # EMA also tracks non-persistent buffers, which are not part of the saved model
        weights.update({k: v for k, v in swapped.items() if k in weights})
    return weights


# ---------------------------------------------------------------------------------------------
# Autoresume: the newest readable checkpoint of a save folder


def checkpoint_problem(path: str | Path) -> str | None:
    """Why a checkpoint file cannot be resumed from (truncated, corrupt), or None when it reads whole.

    PyTorch checkpoints are zip archives: the central directory at the end catches truncation and
    each member's CRC-32 catches corrupted bytes, without unpickling anything.
    """
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'unreadable'}"
    return f"corrupt member {bad}" if bad else None


def _batch_of(path: Path) -> int:
    import re

    m = re.search(r"ba(\d+)", path.name)
    return int(m.group(1)) if m else -1


def select_resume_checkpoint(folder: str | Path, pattern: str = "ep*-ba*-rank0.pt",
                             latest_name: str = "latest-rank0.pt") -> Path | None:
    """Point ``latest_name`` at the newest readable checkpoint in ``folder`` and return it.

    Unreadable checkpoints (a run killed while writing, a damaged disk) are renamed to
    ``*.corrupt`` with a warning, never deleted, so autoresume falls back to the one before.
    """
    import logging
    import os

    log = logging.getLogger("train.checkpoint")
    folder = Path(folder)
    if not folder.is_dir():
        return None
    for ckpt in sorted(folder.glob(pattern), key=_batch_of, reverse=True):
        problem = checkpoint_problem(ckpt)
        if problem is None:
            latest = folder / latest_name
            if latest.is_symlink() or latest.exists():
                if latest.resolve() == ckpt.resolve():
                    return ckpt
                latest.unlink()
            os.symlink(ckpt.name, latest)
            return ckpt
        aside = ckpt.with_name(ckpt.name + ".corrupt")
        ckpt.rename(aside)
        log.warning("warning: checkpoint %s is unreadable (%s); moved to %s and resuming from an earlier one",
                    ckpt, problem, aside.name)
    latest = folder / latest_name
    if latest.is_symlink() and not latest.exists():
        latest.unlink()  # a link to a checkpoint that was moved aside
    return None
