"""Composer checkpoints, read safely (``torch.load(weights_only=True)``): this project's and mosaicml/diffusion's.

*This project's* carry a model spec (``models.checkpoints.spec``) in the ``ModelSpec`` callback's state, so they are
rebuilt without their config or data. *mosaicml/diffusion's* (the trainer of MosaicML's SD2 replication:
its ``StableDiffusion`` ComposerModel) hold ``unet.*``, ``vae.*`` and ``text_encoder.*`` weights under
``state.model`` and no spec; their architecture is inferred from the weights (``spec_from_weights.py``).

A checkpoint written while Composer's EMA runs stores the EMA weights as the model's weights (EMA swaps
them in for saving) and the raw training weights inside the EMA algorithm's state; the
``ema_weights_active`` flag says which is which. ``model_weights(ckpt, ema=...)`` hides that.
"""
from __future__ import annotations

import collections
import functools
import io
import logging
import pickle
import zipfile
from pathlib import Path

import torch

from ..errors import CheckpointError, first_line
from ..readers import SAFE_TYPES, check_inflation, zip_head
from .spec import SPEC_FORMATS

EMA_ALGORITHMS = ("EMA", "FusedEMA")
# Keys transformers before 4.31 saved with CLIP's text model (``embeddings.position_ids``, 0..76): a constant
# buffer, no longer part of the model's state, which a strict load would refuse.
DROPPED_SUFFIXES = (".position_ids",)
log = logging.getLogger("checkpoints")


def load_state(path: str | Path) -> dict:
    """The ``state`` dict of a Composer checkpoint, memory-mapped (tensors are read when touched); a sharded
    one's folder (``fsdp_state_dict_type: sharded``) consolidated, its optimizer state left out."""
    from ..readers import is_sharded_folder, load_sharded_state

    path = Path(path)
    if is_sharded_folder(path):
        return load_sharded_state(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    check_inflation(path)  # PyTorch's reader allocates what a member declares, before inflating it
    try:
        with torch.serialization.safe_globals(SAFE_TYPES):
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - any failure to read a foreign file is one line
        reason = first_line(e)
        raise CheckpointError(f"cannot read checkpoint {path}: corrupt, not a PyTorch file, or holding more than "
                              f"plain data ({reason})") from None
    state = ckpt.get("state") if isinstance(ckpt, dict) else None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CheckpointError(f"{path} is not a Composer checkpoint (no state.model inside)")
    return state


def is_mosaicml_state(state: dict) -> bool:
    """mosaicml/diffusion's StableDiffusion: diffusers-format parts under unet., vae. and text_encoder."""
    keys = state["model"].keys()
    return all(any(k.startswith(p) for k in keys) for p in ("unet.", "vae.", "text_encoder."))


def read_checkpoint(path: str | Path, settings: dict | None = None) -> dict:
    """``{kind, spec, model, ema_state, timestamp, callbacks, dropped, notes}`` of a Composer checkpoint, ours or
    mosaicml/diffusion's. ``settings`` (``prediction_type``, ``latent_scale``: the command's flags) say what a
    mosaicml/diffusion file does not; one that contradicts what the file says is refused. What was dropped
    or assumed is logged, one line each."""
    ckpt = _interpret(load_state(path), path, settings)
    if ckpt["dropped"]:
        log.warning("%s: dropped %s (a constant buffer transformers before 4.31 saved with CLIP's text model, "
                    "not a weight)", path, ", ".join(ckpt["dropped"]))
    for note in ckpt["notes"]:
        log.warning("%s", note)
    return ckpt


def _interpret(state: dict, path, settings: dict | None = None) -> dict:
    from .spec_from_weights import recorded_settings, settle_spec, spec_from_weights

    spec = (state.get("callbacks") or {}).get("ModelSpec", {}).get("spec")
    kind = "composer"
    model = state["model"]
    dropped = sorted(k for k in model if k.endswith(DROPPED_SUFFIXES))
    if dropped:
        model = {k: v for k, v in model.items() if k not in dropped}
    if not spec or spec.get("format") not in SPEC_FORMATS:
        if not is_mosaicml_state(state):
            raise CheckpointError(f"{path} is neither a diffusion-workbench checkpoint (no model spec inside) nor "
                                  "a mosaicml/diffusion one (no unet., vae. and text_encoder. weights)")
        said = recorded_settings(state)
        spec, kind = spec_from_weights(model, where=str(path)), "mosaicml"
    else:
        said = {"prediction_type": spec["prediction_type"], "latent_scale": spec["vae"].get("scaling_factor")}
    spec, notes = settle_spec(spec, said, settings or {}, where=str(path))
    ema_state = next((s for name, s in state.get("algorithms", []) if name in EMA_ALGORITHMS), None)
    return {"kind": kind, "spec": spec, "model": model, "ema_state": ema_state,
            "timestamp": state.get("timestamp"), "callbacks": state.get("callbacks") or {}, "dropped": dropped,
            "notes": notes}


# ---------------------------------------------------------------------------------------------
# What a checkpoint is, read from its pickle without building a tensor or importing anything


class _Stub:
    """What every object of the pickle but plain data becomes: built from anything, holding nothing."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


class _TensorStub(_Stub):
    """A tensor's shape, without its storage (``torch._utils._rebuild_tensor_v2``'s third argument)."""

    def __init__(self, storage=None, offset=0, size=(), *rest):
        self.shape = tuple(size)


class _Skeleton(pickle.Unpickler):
    """Reads a checkpoint's plain data (dicts, lists, strings, numbers): every global the pickle names is a
    stand-in that runs nothing (it is never imported), and tensor storages are not read. Measured on a tiny
    checkpoint: 0.06 s against 0.86 s for ``torch.load(weights_only=True, mmap=True)``, whose cost is
    building each tensor."""

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _TensorStub
        return _Stub

    def persistent_load(self, pid):
        return None


def read_summary(path: str | Path) -> dict:
    """``{'kind', 'spec', 'model'  (names -> shape stubs), 'ema_state', 'timestamp'}`` as ``read_checkpoint``
    gives them, from the pickle alone: what listing, naming and describing a checkpoint need (read once per
    version of the file: finding a checkpoint and describing it both ask)."""
    from ..readers import METADATA, is_sharded_folder

    path = Path(path)
    try:
        st = (path / METADATA if is_sharded_folder(path) else path).stat()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {first_line(e)}") from None
    return dict(_summary(str(path), st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=16)
def _summary(path: str, size: int, mtime_ns: int) -> dict:
    from ..readers import is_sharded_folder, load_sharded_state

    if is_sharded_folder(path):  # the index and the small values; each tensor as its shape
        return _interpret(load_sharded_state(path, tensors=False), path)
    try:
        data = zip_head(path).pickle
        if data is None:
            raise StopIteration
        ckpt = _Skeleton(io.BytesIO(data)).load()
    except (zipfile.BadZipFile, StopIteration, OSError, EOFError, ValueError, pickle.UnpicklingError) as e:
        raise CheckpointError(f"cannot read checkpoint {path}: corrupt, not a PyTorch file, or holding more than "
                              f"plain data ({type(e).__name__})") from None
    state = ckpt.get("state") if isinstance(ckpt, dict) else None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CheckpointError(f"{path} is not a Composer checkpoint (no state.model inside)")
    return _interpret(state, path)


def training_batches(ckpt: dict) -> int | None:
    """The batch count a Composer checkpoint was taken at, from its timestamp (any file name)."""
    ts = ckpt.get("timestamp")
    ts = ts.get("Timestamp", ts) if isinstance(ts, dict) else None
    return int(ts["batch"]) if isinstance(ts, dict) and "batch" in ts else None


def has_ema(ckpt: dict) -> bool:
    return bool(ckpt["ema_state"] and ckpt["ema_state"].get("ema_started"))


# Wrappers' parts of a parameter's name: DDP's ``module.`` and FSDP's, which Composer's EMA keeps in the names of
# the weights it swaps and Composer's saved model drops (a 2-rank DDP run's raw weights were read as its EMA
# weights before these were removed).
WRAPPER_PARTS = ("module", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")


def model_key(name: str) -> str:
    """A parameter's name as the saved model has it: without the wrappers' parts."""
    parts = name.split(".")
    while parts and parts[0] in WRAPPER_PARTS:
        parts.pop(0)
    return ".".join(p for p in parts if p not in WRAPPER_PARTS[1:])


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
    parameters = {model_key(k): v for k, v in other["named_parameters_dict"].items()}
    if missing := sorted(set(parameters) - set(weights))[:1]:
        raise CheckpointError(f"this checkpoint's {'EMA' if ema else 'raw'} weights name a parameter its model "
                              f"lacks ({missing[0]})")
    weights.update(parameters)
    # EMA also tracks non-persistent buffers, which are not part of the saved model
    weights.update({key: v for k, v in other["named_buffers_dict"].items() if (key := model_key(k)) in weights})
    return weights


def checkpoint_cost(path) -> dict:
    """The cost a Composer checkpoint of this workbench records (``{}`` for one written without it), from the
    checkpoint's pickle alone (``read_summary``): no weights are read, so a report over 12 GB checkpoints reads
    a few kilobytes of each."""
    return dict(read_summary(path)["callbacks"].get("RunCost") or {})
