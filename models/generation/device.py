"""Where models run and in what precision: one rule for every command and the app.

``auto`` is the GPU of this process (``LOCAL_RANK``'s under ``composer -n N``) when CUDA is visible, else
the CPU. Pipelines run in float32 on a CPU and bfloat16 on a GPU (float16 where the GPU has no bf16).
"""
from __future__ import annotations

import os

import torch

from ..errors import WorkbenchError

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def pick_device(name: str = "auto") -> torch.device:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``; a GPU that is not there is one line."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise WorkbenchError(f"unknown device {name!r}; choose auto, cpu or cuda") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise WorkbenchError(f"device {name!r} asked for, but no CUDA GPU is visible")
    return device


def pipeline_dtype(name: str, device: str | torch.device) -> torch.dtype:
    """A pipeline's precision by name (``auto``, ``float32``/``fp32``, ``bfloat16``/``bf16``, ``float16``/``fp16``)."""
    if name == "auto":
        if torch.device(device).type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if name not in DTYPES:
        raise WorkbenchError(f"unknown dtype {name!r}; choose auto, float32, bfloat16 or float16")
    return DTYPES[name]
