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

from .errors import WorkbenchError
from .spec import FORMAT

# Plain data types Composer's checkpoints hold besides tensors (RNG states, timestamps, versions).
_SAFE = [np.ndarray, np.dtype, np._core.multiarray._reconstruct, datetime.timedelta, torch.torch_version.TorchVersion,
         *(type(np.dtype(t)) for t in ("uint32", "int64", "float64", "float32", "bool"))]


def read_checkpoint(path: str | Path) -> dict:
    """``{'spec', 'model', 'ema_state', 'timestamp'}`` from a workbench Composer checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise WorkbenchError(f"checkpoint not found: {path}")
    try:
        with torch.serialization.safe_globals(_SAFE):
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise WorkbenchError(f"cannot read checkpoint {path}: corrupt or not a PyTorch file ({reason})") from None
    state = ckpt.get("state") if isinstance(ckpt, dict) else None
    spec = (state or {}).get("callbacks", {}).get("ModelSpec", {}).get("spec")
    if not spec or spec.get("format") != FORMAT:
        raise WorkbenchError(f"{path} is not a diffusion-workbench checkpoint (no model spec inside)")
    ema_state = next((s for name, s in state.get("algorithms", []) if name in ("EMA", "FusedEMA")), None)
    return {"spec": spec, "model": state["model"], "ema_state": ema_state, "timestamp": state.get("timestamp")}


def has_ema(ckpt: dict) -> bool:
    return bool(ckpt["ema_state"] and ckpt["ema_state"].get("ema_started"))


def model_weights(ckpt: dict, ema: bool = False) -> dict[str, torch.Tensor]:
    """The model's state dict with EMA (``ema=True``) or raw training weights."""
    weights = dict(ckpt["model"])
    if ema and not has_ema(ckpt):
        raise WorkbenchError("this checkpoint has no EMA weights (EMA was off or had not started)")
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
