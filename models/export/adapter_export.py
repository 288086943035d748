"""`dwb export ADAPTER_CHECKPOINT OUT.safetensors --layout diffusers|kohya|peft|comfyui`: the adapter a run trained
on a base it holds (``adapter:`` in the training config), out as the one file each reader takes
(``models.adapters``; ComfyUI's own layout of SD3 and Flux.1: ``comfyui_layout``), the text towers' adapters beside
the denoiser's where the run trained them (``adapter.text_encoders``).

The checkpoint holds the adapter alone, its spec names the base (its reference and content hash), the adapter's peft
config and the denoiser's config: the denoiser is built on the meta device from that config (no base weight is read
or made), the adapter added to it as the run added it and its weights (EMA or raw) put in, then written. Read through
the door's Composer-free reader (``read_checkpoint``: weights only)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import WorkbenchError
from ..families import family_named
from ..checkpoints import Checkpoint, find_checkpoint, model_weights, read_checkpoint, read_summary


def adapter_of(ckpt: Checkpoint) -> dict | None:
    """The adapter section of a Composer checkpoint's spec (kind, rank, alpha, targets, peft's config, its base);
    None for every other checkpoint."""
    if ckpt.kind != "composer":
        return None
    return read_summary(ckpt.path)["spec"].get("adapter")


def _with_adapter(module: torch.nn.Module, peft_config: dict, prefix: str, weights: dict) -> torch.nn.Module:
    """``module`` (on the meta device) with the adapter of ``peft_config`` added and its weights, those of
    ``weights`` under ``prefix``, put in place; a weight missing or left over is one line."""
    from peft import PeftConfig

    from ..adapters import is_adapter_key

    module.add_adapter(PeftConfig.from_peft_type(**{k: v for k, v in peft_config.items() if k != "peft_version"}))
    mine = {k[len(prefix):]: v.to(torch.float32) for k, v in weights.items() if k.startswith(prefix)}
    wanted = {k for k, _ in module.named_parameters() if is_adapter_key(k)}
    if wanted != set(mine):
        odd = sorted(wanted ^ set(mine))[0]
        raise WorkbenchError(f"the checkpoint's adapter weights do not match its adapter config: {prefix}{odd} is "
                             f"{'missing' if odd in wanted else 'not in it'}")
    module.load_state_dict(mine, strict=False, assign=True)
    return module


def adapted_denoiser(data: dict, ema: bool) -> tuple[torch.nn.Module, str]:
    """(the checkpoint's denoiser on the meta device with its adapter's weights in place, its family's name)."""
    import diffusers
    from accelerate import init_empty_weights

    spec = data["spec"]
    family = family_named(spec["family"])
    part = family.variants[0].parts[family.denoiser]
    with init_empty_weights(include_buffers=False):
        denoiser = getattr(diffusers, part.cls).from_config(spec[family.denoiser])
    weights = model_weights(data, ema=ema)
    return _with_adapter(denoiser, spec["adapter"]["peft_config"], family.denoiser + ".", weights), family.name


def adapted_text_encoders(data: dict, ema: bool) -> dict[str, torch.nn.Module]:
    """Part name -> each text tower the run adapted (``adapter.text_encoders``), built on the meta device from the
    spec's config as the family's class of that part, its adapter's weights in place; empty where it adapted none."""
    import transformers
    from accelerate import init_empty_weights

    spec = data["spec"]
    towers = spec["adapter"].get("text_encoders") or {}
    family, weights, out = family_named(spec["family"]), model_weights(data, ema=ema), {}
    for name, peft_config in towers.items():
        config = dict(spec[name])
        config = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
        with init_empty_weights(include_buffers=False):
            tower = getattr(transformers, family.variants[0].parts[name].cls)(config)
        out[name] = _with_adapter(tower, peft_config, name + ".", weights)
    return out


def export_adapter(ref: str | Path, out: str | Path, layout: str = "diffusers", ema: bool = False) -> Path:
    """The adapter of the adapter checkpoint ``ref`` written to ``out`` (``.safetensors``) in ``layout`` (one of
    ``models.adapters.LAYOUTS``, or ``comfyui`` for the transformer families); the base's reference and content hash
    in the kohya, peft and ComfyUI layouts' metadata."""
    from ..adapters import write_adapter
    from .comfyui_layout import write_comfyui_adapter

    ckpt = find_checkpoint(ref)
    if adapter_of(ckpt) is None:
        raise WorkbenchError(f"{ckpt.label} holds no adapter: --layout exports an adapter checkpoint (a run with an "
                             f"adapter: section); export a whole model without --layout")
    data = read_checkpoint(ckpt.path)
    denoiser, family = adapted_denoiser(data, ema)
    towers = adapted_text_encoders(data, ema)
    base = data["spec"]["adapter"].get("base") or {}
    metadata = {"dwb_base": str(base.get("init_from")), "dwb_base_hash": str(base.get("content_hash"))}
    if layout == "comfyui":
        if towers:
            raise WorkbenchError(f"{ckpt.label} adapts the text towers too, which ComfyUI's layout is not written "
                                 "for here; export it in the diffusers or kohya layout")
        return write_comfyui_adapter(denoiser, family, out, metadata=metadata)
    return write_adapter(denoiser, family, out, layout=layout, metadata=metadata, text_encoders=towers)
