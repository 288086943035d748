"""`dwb export ADAPTER_CHECKPOINT OUT.safetensors --layout diffusers|kohya|peft`: the adapter a run trained on a base
it holds (``adapter:`` in the training config), out as the one file each reader takes (``models.adapters``).

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


def adapted_denoiser(data: dict, ema: bool) -> tuple[torch.nn.Module, str]:
    """(the checkpoint's denoiser on the meta device with its adapter's weights in place, its family's name)."""
    import diffusers
    from accelerate import init_empty_weights
    from peft import PeftConfig

    from ..adapters import is_adapter_key

    spec = data["spec"]
    family = family_named(spec["family"])
    part = family.variants[0].parts[family.denoiser]
    with init_empty_weights(include_buffers=False):
        denoiser = getattr(diffusers, part.cls).from_config(spec[family.denoiser])
    config = PeftConfig.from_peft_type(**{k: v for k, v in spec["adapter"]["peft_config"].items()
                                          if k not in ("peft_version",)})
    denoiser.add_adapter(config)
    prefix = family.denoiser + "."
    weights = {k[len(prefix):]: v.to(torch.float32) for k, v in model_weights(data, ema=ema).items()
               if k.startswith(prefix)}
    wanted = {k for k, _ in denoiser.named_parameters() if is_adapter_key(k)}
    if wanted != set(weights):
        odd = sorted(wanted ^ set(weights))[0]
        raise WorkbenchError(f"the checkpoint's adapter weights do not match its adapter config: {odd} is "
                             f"{'missing' if odd in wanted else 'not in it'}")
    denoiser.load_state_dict(weights, strict=False, assign=True)
    return denoiser, family.name


def export_adapter(ref: str | Path, out: str | Path, layout: str = "diffusers", ema: bool = False) -> Path:
    """The adapter of the adapter checkpoint ``ref`` written to ``out`` (``.safetensors``) in ``layout``; the base's
    reference and content hash in the kohya and peft layouts' metadata."""
    from ..adapters import write_adapter

    ckpt = find_checkpoint(ref)
    if adapter_of(ckpt) is None:
        raise WorkbenchError(f"{ckpt.label} holds no adapter: --layout exports an adapter checkpoint (a run with an "
                             f"adapter: section); export a whole model without --layout")
    data = read_checkpoint(ckpt.path)
    denoiser, family = adapted_denoiser(data, ema)
    base = data["spec"]["adapter"].get("base") or {}
    metadata = {"dwb_base": str(base.get("init_from")), "dwb_base_hash": str(base.get("content_hash"))}
    return write_adapter(denoiser, family, out, layout=layout, metadata=metadata)
