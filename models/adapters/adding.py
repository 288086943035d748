"""An adapter added to a diffusers denoiser through peft, the library diffusers loads and saves LoRAs with.

The denoiser's own ``add_adapter`` (diffusers' ``PeftAdapterMixin``, what diffusers' training scripts call) injects
peft's layers: ``LoraConfig`` for LoRA, the same with ``use_dora`` for DoRA, ``LoHaConfig`` and ``LoKrConfig`` for
LoHa and LoKr. The denoiser's own weights stay as they were; the adapter's start as peft initialises them (LoRA's
up and LoHa's and LoKr's second factors at zero: the adapted model draws what the base draws until it trains).
"""
from __future__ import annotations

import math

import torch

from ..errors import WorkbenchError
from .presets import KINDS, preset_of

MAX_RANK = 4096  # above the full rank of every layer these families hold (at most 3,072: Flux.1's width)


def _number(value, low: float, high: float, what: str, integer: bool = False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise WorkbenchError(f"adapter {what} {value!r} is not a{'n integer' if integer else ' number'}")
    if not (math.isfinite(value) and low <= value <= high):
        raise WorkbenchError(f"adapter {what} {value!r} is outside {low:g} to {high:g}")
    return value


ADAPTER_PARTS = ("lora_", "hada_", "lokr_")  # peft's own submodules' names: no base model has a module so named


def is_adapter_key(key: str) -> bool:
    """Whether a parameter or state-dict key names an adapter's weight (a peft submodule's, DoRA's magnitudes too),
    not the base model's."""
    return any(part.startswith(ADAPTER_PARTS) for part in key.split("."))


def denoiser_layers(denoiser: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Module path -> each Linear and Conv2d of ``denoiser`` an adapter may adapt; where peft already wraps one
    (another adapter is loaded), the path of its wrapper, mapped to the layer it wraps (``base_layer``)."""
    layers = {}
    for path, m in denoiser.named_modules():
        if not isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)):
            continue
        if path.endswith(".base_layer"):
            layers[path[:-len(".base_layer")]] = m
        elif not any(part.startswith(ADAPTER_PARTS) for part in path.split(".")):
            layers[path] = m
    return layers


def _check_targets(denoiser: torch.nn.Module, targets: tuple[str, ...]) -> None:
    """Each target names at least one Linear or Conv2d of ``denoiser``, as peft matches it (the path itself or a
    path that ends with ``.`` and the target)."""
    layers = denoiser_layers(denoiser)
    for target in targets:
        if not isinstance(target, str) or not target:
            raise WorkbenchError(f"adapter target {target!r} is not a module name")
        if not any(name == target or name.endswith("." + target) for name in layers):
            raise WorkbenchError(f"adapter target {target!r} names no Linear or Conv2d layer of the "
                                 f"{type(denoiser).__name__}")


def adapter_config(kind: str, rank: int, alpha: float, dropout: float, targets: tuple[str, ...]):
    """The peft config of one adapter: LoRA and DoRA drop the adapter's input (``lora_dropout``), LoHa and LoKr
    their rank dimensions (``rank_dropout``, as LyCORIS names the same thing)."""
    from peft import LoHaConfig, LoKrConfig, LoraConfig

    if kind in ("lora", "dora"):
        return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets),
                          use_dora=kind == "dora")
    config = LoHaConfig if kind == "loha" else LoKrConfig
    return config(r=rank, alpha=alpha, rank_dropout=dropout, target_modules=list(targets))


def add_adapter(denoiser: torch.nn.Module, family: str, kind: str = "lora", rank: int | None = None,
                alpha: float | None = None, dropout: float | None = None, targets=None, name: str = "default"):
    """Add adapter ``name`` of ``kind`` (``lora``, ``dora``, ``loha``, ``lokr``) to ``denoiser`` (a
    UNet2DConditionModel, SD3Transformer2DModel or FluxTransformer2DModel), the family's preset filling what is
    None; returns its peft config. Bad values are one-line WorkbenchErrors, raised before the denoiser changes."""
    if kind not in KINDS:
        raise WorkbenchError(f"unknown adapter kind {kind!r}; the kinds are: {', '.join(KINDS)}")
    preset = preset_of(family)
    rank = _number(preset.rank if rank is None else rank, 1, MAX_RANK, "rank", integer=True)
    alpha = float(_number(preset.alpha if alpha is None else alpha, 1e-6, 1e6, "alpha"))
    dropout = float(_number(preset.dropout if dropout is None else dropout, 0.0, 0.99, "dropout"))
    targets = tuple(preset.targets if targets is None else ([targets] if isinstance(targets, str) else targets))
    if not targets:
        raise WorkbenchError("an adapter needs at least one target module")
    _check_targets(denoiser, targets)
    if name in (getattr(denoiser, "peft_config", None) or {}):
        raise WorkbenchError(f"the {type(denoiser).__name__} already holds an adapter named {name!r}")
    config = adapter_config(kind, rank, alpha, dropout, targets)
    denoiser.add_adapter(config, adapter_name=name)
    return config
