"""`load_pipeline(path)`: the one way into any checkpoint, a Composer file or a diffusers folder."""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from diffusers import AutoencoderKL, StableDiffusionPipeline, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

from .checkpoint import model_weights, read_checkpoint
from .components import build_pipeline
from .errors import CheckpointError, WorkbenchError


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def pipeline_dtype(name: str, device: str | torch.device) -> torch.dtype:
    """A pipeline's precision by name (``auto``, ``float32``/``fp32``, ``bfloat16``/``bf16``, ``float16``/``fp16``).

    ``auto`` is float32 on a CPU and bfloat16 on a GPU (float16 where the GPU has no bf16).
    """
    if name == "auto":
        if torch.device(device).type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if name not in DTYPES:
        raise WorkbenchError(f"unknown dtype {name!r}; choose auto, float32, bfloat16 or float16")
    return DTYPES[name]


def _tokenizer_from_files(files: dict[str, str]):
    if not files:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            Path(tmp, name).write_text(text)
        return CLIPTokenizer.from_pretrained(tmp)


def _load_module(module: torch.nn.Module, weights: dict, prefix: str, path) -> None:
    sub = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
    try:
        module.load_state_dict(sub, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: the {prefix.rstrip('.')} weights do not match the model spec "
                             f"({str(e).splitlines()[0]})") from None


def pipeline_from_checkpoint(path: str | Path, ema: bool = False) -> StableDiffusionPipeline:
    ckpt = read_checkpoint(path)
    spec = ckpt["spec"]
    weights = model_weights(ckpt, ema=ema)
    unet = UNet2DConditionModel.from_config(spec["unet"])
    vae = AutoencoderKL.from_config(spec["vae"])
    text_encoder = CLIPTextModel(CLIPTextConfig.from_dict(spec["text_encoder"]))
    for module, prefix in ((unet, "unet."), (vae, "vae."), (text_encoder, "text_encoder.")):
        _load_module(module, weights, prefix, path)
    for module in (unet, vae, text_encoder):
        module.eval()
    return build_pipeline(unet, vae, text_encoder, _tokenizer_from_files(spec["tokenizer"]), spec["prediction_type"])


def load_pipeline(path: str | Path, *, ema: bool = False, device: str | torch.device = "cpu",
                  dtype: torch.dtype | None = None) -> StableDiffusionPipeline:
    """A ready StableDiffusionPipeline from a Composer checkpoint (``.pt``) or a diffusers folder.

    ``ema`` picks the EMA weights of a Composer checkpoint (an exported folder holds whichever
    weights were exported).
    """
    path = Path(path)
    if path.is_dir():
        if not (path / "model_index.json").is_file():
            raise CheckpointError(f"{path} is not a diffusers pipeline folder (model_index.json missing)")
        try:
            pipe = StableDiffusionPipeline.from_pretrained(path, safety_checker=None, requires_safety_checker=False)
        except Exception as e:
            raise CheckpointError(f"cannot load the pipeline in {path}: {str(e).strip().splitlines()[0]}") from None
        pipe.set_progress_bar_config(disable=True)
    elif path.is_file():
        pipe = pipeline_from_checkpoint(path, ema=ema)
    else:
        raise CheckpointError(f"checkpoint not found: {path}")
    return pipe.to(device=device, dtype=dtype) if dtype is not None else pipe.to(device)


def export_pipeline(checkpoint: str | Path, out: str | Path, ema: bool = False) -> Path:
    """`dwb export`: a Composer checkpoint to a diffusers folder (safetensors) any diffusers user loads."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise WorkbenchError(f"export folder {out} is not empty")
    pipe = pipeline_from_checkpoint(checkpoint, ema=ema)
    pipe.save_pretrained(out, safe_serialization=True)
    return out
