"""One diffusers model a user holds beside a checkpoint (a ControlNet, a VAE), judged before a tensor of it is read:
the steps every such model takes through the door, each refusal one line starting with ``what`` (``"ControlNet
NAME"``), never a server path.

- ``model_files``: a diffusers folder (``config.json`` and ``diffusion_pytorch_model.safetensors``) or one
  ``.safetensors`` file; a pickle (``.pth``, ``.ckpt``, ``.bin``) is never opened, since unpickling runs whatever
  code the file names;
- ``judged_head``: the file within ``max_bytes``, its safetensors head within bounds
  (``models.readers.read_safetensors_head``), float tensors alone;
- ``folder_config``: a folder's ``config.json`` read as JSON from elsewhere (bounded), of the expected class;
- ``built_on_meta`` and ``check_tensors``: the model its config builds, on the meta device (nothing allocated),
  whose tensors the file must hold exactly: names, shapes, none besides, so loading allocates no more than that;
- ``loaded``: the judged weights read into that model, on the pipeline's device and dtype.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import WorkbenchError, first_line

WEIGHTS, CONFIG = "diffusion_pytorch_model.safetensors", "config.json"
PICKLES = (".pt", ".pth", ".ckpt", ".bin", ".pkl", ".pickle")
FLOATS = ("F16", "BF16", "F32")


def model_files(path: Path, what: str, cls: str) -> tuple[Path | None, Path]:
    """(the folder or None for a single file, the weights file) of a local model of class ``cls``; one line for a
    pickle, a folder without its config and safetensors weights, or anything else."""
    if path.is_dir():
        weights, config = path / WEIGHTS, path / CONFIG
        if not weights.is_file() or not config.is_file():
            pickled = any((path / f"diffusion_pytorch_model{s}").exists() for s in PICKLES)
            raise WorkbenchError(f"{what} is no diffusers {cls} folder ({CONFIG} and {WEIGHTS})" + (
                ": it holds pickled weights alone, which are never opened; convert them to safetensors" if pickled
                else ""))
        return path, weights
    if path.suffix.lower() in PICKLES:
        raise WorkbenchError(f"{what} is a pickle ({path.suffix}), which is never opened (unpickling runs the code a "
                             "file names): use its .safetensors version")
    if path.suffix.lower() != ".safetensors" or not path.is_file():
        raise WorkbenchError(f"{what} is neither a diffusers {cls} folder nor a .safetensors file")
    return None, path


def judged_head(weights: Path, what: str, max_bytes: int):
    """The file's safetensors head (``SafetensorsHead``), the file within ``max_bytes`` and every tensor a float."""
    from ..readers import read_safetensors_head

    size = weights.stat().st_size
    if size > max_bytes:
        raise WorkbenchError(f"{what} is {size / 2**20:,.0f} MiB; at most {max_bytes >> 20:,} MiB is read")
    head = read_safetensors_head(weights, what=what)
    odd = next((k for k, t in head.tensors.items() if t.dtype not in FLOATS), None)
    if odd is not None:
        raise WorkbenchError(f"{what}: tensor {odd[:80]!r} is {head.tensors[odd].dtype}, not a float")
    return head


def folder_config(folder: Path, what: str, cls: str) -> dict:
    """A folder's ``config.json``, read bounded, of class ``cls``."""
    from ..common import loads_outside

    config = loads_outside((folder / CONFIG).read_bytes(), f"{what}'s {CONFIG}")
    if not isinstance(config, dict) or config.get("_class_name") != cls:
        got = config.get("_class_name") if isinstance(config, dict) else type(config).__name__
        raise WorkbenchError(f"{what}'s {CONFIG} is of a {str(got)[:60]}, not {_a(cls)}")
    return config


def built_on_meta(cls: str, config: dict, what: str):
    """diffusers' ``cls`` as ``config`` builds it on the meta device; one line where the class refuses the config."""
    import diffusers
    import torch

    try:
        with torch.device("meta"):
            return getattr(diffusers, cls).from_config({k: v for k, v in config.items() if not k.startswith("_")})
    except Exception as e:  # noqa: BLE001 - a config from elsewhere: the class's own check of it
        raise WorkbenchError(f"{what}'s config does not build {_a(cls)} ({first_line(e)})") from None


def _a(cls: str) -> str:
    """``cls`` after its article, as a message reads it: an AutoencoderKL, a ControlNetModel, a UNet2DConditionModel."""
    return f"{'an' if cls[:1] in 'AEIO' else 'a'} {cls}"


def check_tensors(model, shapes: dict, what: str) -> None:
    """One line unless ``shapes`` are exactly the model's own tensors: none missing, none besides, each its shape."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing, extra = sorted(set(expected) - set(shapes)), sorted(set(shapes) - set(expected))
    if missing or extra:
        which = f"lacks {missing[0][:100]}" if missing else f"holds {extra[0][:100]}, which the model has not"
        raise WorkbenchError(f"{what} does not fit this model: it {which} ({len(missing)} missing, "
                             f"{len(extra)} besides)")
    wrong = next((k for k in sorted(expected) if expected[k] != tuple(shapes[k])), None)
    if wrong is not None:
        raise WorkbenchError(f"{what} does not fit this model: {wrong[:100]} is {list(shapes[wrong])}, the model's "
                             f"{list(expected[wrong])}")


def loaded(model, state: dict, like):
    """``model`` (built on the meta device) holding the judged ``state``, on the device and in the dtype of the
    module ``like``, for inference."""
    model.load_state_dict(state, strict=True, assign=True)
    model.to(device=like.device)
    if model.dtype != like.dtype:  # diffusers warns on a cast to the dtype a module has
        model.to(dtype=like.dtype)
    return model.eval().requires_grad_(False)
