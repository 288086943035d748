"""The dtype a frozen part (VAE, CLIP tower, T5) is held in, tensor by tensor, as its library's ``from_pretrained``
holds it when told a ``torch_dtype``: every floating tensor in that dtype, except the modules a transformers class
keeps in float32 under float16 (``_keep_in_fp32_modules``: T5's ``wo`` projections, whose activations overflow
float16) and, under float16 and bfloat16, those it keeps strictly (``_keep_in_fp32_modules_strict``). A part built
here (the tiny architectures' towers) is cast by the same rule, and precomputed latents name the weights they were
made with by it (``hashing.fingerprint``), so a part loaded in half precision on a GPU and one cast from float32 on
a CPU are the same weights to both."""
from __future__ import annotations

import torch


def _kept_modules(module: torch.nn.Module, dtype: torch.dtype) -> list[str]:
    keep = []
    if dtype == torch.float16:
        keep += list(getattr(module, "_keep_in_fp32_modules", None) or [])
    if dtype in (torch.float16, torch.bfloat16):
        keep += list(getattr(module, "_keep_in_fp32_modules_strict", None) or [])
    return keep


def held_dtype(module: torch.nn.Module, name: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    """The dtype ``module``'s tensor ``name`` (a state-dict key) is held in when the part is held in ``dtype``."""
    if not tensor.is_floating_point():
        return tensor.dtype
    keep = _kept_modules(module, dtype)
    if keep and any(k in name.split(".") for k in keep):
        return torch.float32
    return dtype


def hold_in(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``module`` (a frozen part) with its tensors in the dtypes ``held_dtype`` gives, in place; returned. Each tensor
    is cast once, from what it holds (a kept module cast to float16 and back would lose its float32 digits)."""
    keep = _kept_modules(module, dtype)
    for name, sub in module.named_modules():
        target = torch.float32 if keep and any(k in name.split(".") for k in keep) else dtype
        for p in sub.parameters(recurse=False):
            if p.is_floating_point() and p.dtype != target:
                p.data = p.data.to(target)
        for key, buffer in sub.named_buffers(recurse=False):
            if buffer.is_floating_point() and buffer.dtype != target:
                sub._buffers[key] = buffer.to(target)
    return module


def load_options(cls: type, dtype: torch.dtype | None) -> dict:
    """What ``cls.from_pretrained`` is told to load a frozen part in ``dtype`` (nothing for float32, which both
    libraries load in unless told: transformers names the option ``dtype``, diffusers ``torch_dtype``)."""
    if dtype is None or dtype == torch.float32:
        return {}
    return {"torch_dtype" if cls.__module__.startswith("diffusers") else "dtype": dtype}


def held_bytes(module: torch.nn.Module, dtype: torch.dtype) -> int:
    """Bytes of ``module``'s parameters and buffers once held in ``dtype`` (counted on the meta device as well)."""
    named = [*module.named_parameters(), *module.named_buffers()]
    return sum(t.numel() * torch.empty((), dtype=held_dtype(module, name, t, dtype)).element_size()
               for name, t in named)
