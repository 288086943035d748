"""One adapter file of a denoiser's adapter, in the layout its reader takes (docs/adapters.md has the matrix):

- ``diffusers``: what diffusers' own ``save_lora_weights`` writes, written by it: ``unet.``/``transformer.`` and
  peft's names (a UNet's through ``convert_state_dict_to_diffusers``, as ``train_dreambooth_lora_sdxl.py`` saves
  them), the LoRA config in the ``lora_adapter_metadata`` entry; plain ``pipe.load_lora_weights(path)`` reads it.
  LoRA and DoRA (DoRA's magnitudes as ``lora_magnitude_vector``). Each layer's ``alpha / rank`` is folded into its
  up weight and the config says alpha = rank: readers that take no alpha from such a file (ComfyUI reads none from
  it, and scales by 1) draw what diffusers draws;
- ``kohya``: kohya's sd-scripts layout and ``ss_*`` metadata with AUTOMATIC1111's hashes (``kohya.py``): LoRA on
  SD 1.x, 2.x, SDXL and Flux.1;
- ``peft``: the same prefixes and peft's own names unfolded, the whole peft config as JSON in ``peft_config``:
  every kind, LoHa and LoKr too (which diffusers' ``load_lora_weights`` refuses, "all LoRA param names contain
  'lora'"); read back by peft itself (``add_adapter`` with the config, ``set_peft_model_state_dict``).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..common import write_bytes_whole, whole_file
from ..errors import WorkbenchError
from ..families import family_named
from .kohya import KOHYA_FAMILIES, KOHYA_TEXT_PREFIXES, kohya_hashes, kohya_metadata, kohya_tensors, kohya_text_tensors
from .presets import KINDS

LAYOUTS = ("diffusers", "kohya", "peft")
LAYOUT_KINDS = {"diffusers": ("lora", "dora"), "kohya": ("lora",), "peft": KINDS}
WHY_NOT = {"diffusers": "diffusers' load_lora_weights reads LoRA and DoRA only",
           "kohya": "diffusers' kohya reader drops DoRA's dora_scale and reads no LoHa or LoKr"}
PEFT_CONFIG_KEY = "peft_config"


def adapter_kind(config) -> str:
    """``lora``, ``dora``, ``loha`` or ``lokr``: what a peft config adds."""
    kind = {"LORA": "lora", "LOHA": "loha", "LOKR": "lokr"}.get(str(getattr(config.peft_type, "value", "")))
    if kind is None:
        raise WorkbenchError(f"a {type(config).__name__} adapter is none of the kinds {', '.join(KINDS)}")
    return "dora" if kind == "lora" and config.use_dora else kind


def _config_of(denoiser: torch.nn.Module, name: str):
    configs = getattr(denoiser, "peft_config", None) or {}
    if name not in configs:
        raise WorkbenchError(f"the {type(denoiser).__name__} holds no adapter named {name!r} "
                             f"(it holds: {', '.join(configs) or 'none'})")
    return configs[name]


def adapter_layers(denoiser: torch.nn.Module, name: str = "default") -> dict[str, torch.nn.Module]:
    """Module path -> the peft layer that holds adapter ``name`` there."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {path: m for path, m in denoiser.named_modules()
            if isinstance(m, BaseTunerLayer) and name in getattr(m, "scaling", {})}


def lora_weights(denoiser: torch.nn.Module, name: str = "default") -> dict:
    """Module path -> (down, up, scale) of the LoRA or DoRA ``name``: peft's ``lora_A`` and ``lora_B`` weights,
    detached, and ``alpha / rank``."""
    return {path: (m.lora_A[name].weight.detach(), m.lora_B[name].weight.detach(), float(m.scaling[name]))
            for path, m in adapter_layers(denoiser, name).items()}


def _folded(denoiser: torch.nn.Module, name: str) -> dict[str, torch.Tensor]:
    """peft's state dict of adapter ``name`` with each layer's scale multiplied into its ``lora_B``."""
    from peft.utils import get_peft_model_state_dict

    state = get_peft_model_state_dict(denoiser, adapter_name=name)
    for path, (_, up, scale) in lora_weights(denoiser, name).items():
        state[f"{path}.lora_B.weight"] = (up * scale).contiguous()
    return state


def _folded_metadata(config) -> dict:
    """The LoRA config diffusers' ``save_lora_weights`` records of a folded adapter: alpha = rank."""
    ranks = {k: v for k, v in config.rank_pattern.items()}
    return {"r": config.r, "lora_alpha": config.r, "rank_pattern": ranks, "alpha_pattern": ranks,
            "use_dora": config.use_dora, "lora_dropout": config.lora_dropout,
            "target_modules": sorted(config.target_modules)}


def _write_diffusers(denoiser, family, path: Path, name: str, text_encoders: dict) -> None:
    import diffusers
    from diffusers.utils import convert_state_dict_to_diffusers

    state = _folded(denoiser, name)
    if family.denoiser == "unet":
        state = convert_state_dict_to_diffusers(state)
    parts = {f"{family.denoiser}_lora_layers": state,
             f"{family.denoiser}_lora_adapter_metadata": _folded_metadata(_config_of(denoiser, name))}
    for part, tower in text_encoders.items():  # as diffusers' train_dreambooth_lora_sdxl.py saves its towers'
        parts[f"{part}_lora_layers"] = convert_state_dict_to_diffusers(_folded(tower, name))
        parts[f"{part}_lora_adapter_metadata"] = _folded_metadata(_config_of(tower, name))
    with whole_file(path) as tmp:
        getattr(diffusers, family.pipeline).save_lora_weights(tmp.parent, weight_name=tmp.name, **parts)


def _kohya_bytes(denoiser, family, path: Path, name: str, extra: dict[str, str], text_encoders: dict) -> bytes:
    from safetensors.torch import save

    config = _config_of(denoiser, name)
    if family.name not in KOHYA_FAMILIES:
        raise WorkbenchError(f"the kohya layout is written for {', '.join(KOHYA_FAMILIES)}, not {family.name}: "
                             "diffusers' kohya reader has no converter for it")
    modules = dict(denoiser.named_modules())
    tensors = kohya_tensors(lora_weights(denoiser, name), modules, family.name)
    for part, tower in text_encoders.items():  # sd-scripts' first name of the tower (lora_te_, lora_te1_, lora_te2_)
        tensors.update(kohya_text_tensors(lora_weights(tower, name), KOHYA_TEXT_PREFIXES[family.name][part][0]))
    metadata = {**extra, **kohya_metadata(family.name, config.r, config.lora_alpha, config.lora_dropout, path.stem)}
    model_hash, legacy_hash = kohya_hashes(save(tensors, {k: v for k, v in metadata.items() if k.startswith("ss_")}))
    return save(tensors, {**metadata, "sshs_model_hash": model_hash, "sshs_legacy_hash": legacy_hash})


def _peft_bytes(denoiser, family, name: str, extra: dict[str, str]) -> bytes:
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save

    config = _config_of(denoiser, name).to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    state = get_peft_model_state_dict(denoiser, adapter_name=name)
    tensors = {f"{family.denoiser}.{k}": v.contiguous() for k, v in state.items()}
    return save(tensors, {**extra, "format": "pt", PEFT_CONFIG_KEY: json.dumps(config, sort_keys=True, default=str)})


def write_adapter(denoiser: torch.nn.Module, family: str, path: str | Path, layout: str = "diffusers",
                  name: str = "default", metadata: dict[str, str] | None = None,
                  text_encoders: dict[str, torch.nn.Module] | None = None) -> Path:
    """Write adapter ``name`` of ``denoiser`` (a model of the family named ``family``) to the safetensors file
    ``path`` in ``layout`` (``diffusers``, ``kohya``, ``peft``), whole or not at all; ``metadata`` goes into the
    kohya and peft layouts' header beside their own. ``text_encoders`` (pipeline part name -> tower): towers that
    hold a LoRA named ``name`` too, written beside the denoiser's in the diffusers and kohya layouts. Returns
    ``path``."""
    path = Path(path)
    entry = family_named(family)
    if layout not in LAYOUTS:
        raise WorkbenchError(f"unknown adapter layout {layout!r}; the layouts are: {', '.join(LAYOUTS)}")
    if path.suffix != ".safetensors":
        raise WorkbenchError(f"{path}: an adapter file is written as .safetensors")
    kind = adapter_kind(_config_of(denoiser, name))
    if kind not in LAYOUT_KINDS[layout]:
        raise WorkbenchError(f"a {kind} adapter is not written in the {layout} layout ({WHY_NOT[layout]}); "
                             "write it in the peft layout")
    towers = text_encoders or {}
    for part, tower in towers.items():
        if layout == "peft" or adapter_kind(_config_of(tower, name)) != "lora":
            raise WorkbenchError(f"the {part}'s adapter is written as a LoRA in the diffusers or kohya layout, "
                                 f"not as a {adapter_kind(_config_of(tower, name))} in the {layout} layout")
    extra = {k: str(v) for k, v in (metadata or {}).items()}
    if layout == "diffusers":
        _write_diffusers(denoiser, entry, path, name, towers)
    elif layout == "kohya":
        write_bytes_whole(path, _kohya_bytes(denoiser, entry, path, name, extra, towers))
    else:
        write_bytes_whole(path, _peft_bytes(denoiser, entry, name, extra))
    return path
