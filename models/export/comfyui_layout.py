"""ComfyUI's own layout of a LoRA on the transformer families (SD3/3.5, Flux.1): each layer under ``diffusion_model.``
and its name in the original model (Stability's ``mmditx``, Black Forest Labs' Flux.1), dots kept, with
``.lora_down.weight``, ``.lora_up.weight`` and ``.alpha``.

ComfyUI's ``comfy/lora.py`` (``model_lora_keys_unet``) maps ``diffusion_model.<path>`` to its model's weight
``diffusion_model.<path>.weight`` (its own model holds the original names), and its ``load_lora`` adds
``up @ down * alpha / rank`` to that weight. Where the original fuses layers (a block's query, key and value in one
``qkv``; a Flux.1 single block's ``linear1`` with its MLP's input), the members' LoRAs become one of their summed rank
(``models.adapters.fused_lora``: downs stacked, ups block-diagonal), as in kohya's Flux.1 layout; where the original
orders a modulation's halves the other way (SD3's last block's context modulation), the up weight's halves are
swapped. The names are those of the single-file layouts (``family_export``'s tables, each the inverse of the
converter diffusers reads those files with)."""
from __future__ import annotations

from pathlib import Path

import torch

from ..common import write_bytes_whole
from ..errors import WorkbenchError
from ..families import family_named
from .family_export import flux_tables, mmdit_tables

COMFYUI_PREFIX = "diffusion_model."
# the family's single-file layout (``SingleFile.key_map``) -> the tables of its original names
ORIGINAL_TABLES = {"sd3.5": mmdit_tables, "flux-bfl": flux_tables}
FULL_NAMES = (".weight", ".scale", "pos_embed")  # rows of one tensor, not of a layer


def original_layers(family_name: str, config) -> dict[str, tuple[str, list[str], str]]:
    """Module path in diffusers' transformer -> (its layer's original path, every diffusers member of that layer
    in order, how it is made: ``same``, ``fused`` or ``swapped``)."""
    family = family_named(family_name)
    key_map = family.single_file.key_map if family.single_file is not None else None
    if key_map not in ORIGINAL_TABLES:
        raise WorkbenchError(f"ComfyUI's layout is written for the transformer families (SD3, Flux.1), not "
                             f"{family.label}: ComfyUI reads its LoRAs in the kohya layout (--layout kohya)")
    layers = {}
    for original, ours, rows in ORIGINAL_TABLES[key_map](config):
        for name, members, how in rows:
            if name.endswith(FULL_NAMES):
                continue
            members = [members] if isinstance(members, str) else members
            for member in members:
                layers[ours + member] = (original + name, [ours + m for m in members], how)
    return layers


def comfyui_tensors(loras: dict, modules: dict, family_name: str, config) -> dict[str, torch.Tensor]:
    """ComfyUI's tensors of LoRAs on a transformer (``loras``: module path -> (down, up, scale); ``modules``: module
    path -> layer; ``config``: the transformer's)."""
    from ..adapters import fused_lora

    layers, out, fused = original_layers(family_name, config), {}, {}
    for path, (down, up, scale) in loras.items():
        if path not in layers:
            raise WorkbenchError(f"ComfyUI's layout of {family_named(family_name).label} has no name for the "
                                 f"transformer's {path}")
        original, members, how = layers[path]
        key = COMFYUI_PREFIX + original
        if how == "fused":
            fused[key] = members
            continue
        if how == "swapped":
            up = torch.cat(up.chunk(2)[::-1])
        out[f"{key}.lora_down.weight"] = down.contiguous()
        out[f"{key}.lora_up.weight"] = up.contiguous()
        out[f"{key}.alpha"] = torch.tensor(scale * down.shape[0])
    for key, members in fused.items():
        out.update(fused_lora(key, members, loras, modules))
    return out


def write_comfyui_adapter(denoiser: torch.nn.Module, family_name: str, path: str | Path, name: str = "default",
                          metadata: dict[str, str] | None = None) -> Path:
    """LoRA ``name`` of a transformer (SD3's, Flux.1's) written to ``path`` in ComfyUI's layout, whole or not at
    all; ``metadata`` in its header. A kind other than LoRA is refused in one line (ComfyUI reads DoRA only as
    LyCORIS' ``dora_scale``, which peft's DoRA is not)."""
    from safetensors.torch import save

    from ..adapters import adapter_kind, lora_weights

    path = Path(path)
    if path.suffix != ".safetensors":
        raise WorkbenchError(f"{path}: an adapter file is written as .safetensors")
    configs = getattr(denoiser, "peft_config", None) or {}
    if name not in configs:
        raise WorkbenchError(f"the {type(denoiser).__name__} holds no adapter named {name!r}")
    kind = adapter_kind(configs[name])
    if kind != "lora":
        raise WorkbenchError(f"a {kind} adapter is not written in ComfyUI's layout (it is written for LoRA); write "
                             "it in the peft layout")
    tensors = comfyui_tensors(lora_weights(denoiser, name), dict(denoiser.named_modules()), family_name,
                              denoiser.config)
    write_bytes_whole(path, save(tensors, {"format": "pt", **{k: str(v) for k, v in (metadata or {}).items()}}))
    return path
