"""The kohya layout: the one adapter file kohya's sd-scripts write, and AUTOMATIC1111, ComfyUI and diffusers' own
kohya converter read.

Keys: ``lora_unet_<module path, dots as underscores>`` with ``.lora_down.weight`` (peft's ``lora_A``),
``.lora_up.weight`` (``lora_B``) and ``.alpha`` (a scalar: the layer adds ``up @ down * alpha / rank``). The
UNets' module paths are diffusers' (kohya's SD 1/2 UNet has diffusers' names, and diffusers'
``convert_state_dict_to_kohya`` writes SDXL's so; every reader above also takes kohya's SDXL names,
``input_blocks_*``). Flux.1's are Black Forest Labs' (kohya's ``networks/lora_flux.py``): a block's query, key and
value are one layer there (``img_attn_qkv``; a single block's ``linear1`` also holds its MLP's input), so their
three LoRAs become one of three times the rank, the downs stacked and the ups block-diagonal, which diffusers'
converter splits back into the three (``_convert_kohya_flux_lora_to_diffusers``, its "sparse" case).

Metadata: kohya's ``ss_*`` (``networks/lora.py``, ``train_network.py``) and the two hashes it precomputes for
AUTOMATIC1111 (``library/train_util.py``, ``precalculate_safetensors_hashes``): ``sshs_model_hash``, the sha256 of
the file's bytes after its header (AUTOMATIC1111's ``addnet_hash_safetensors``), and ``sshs_legacy_hash``, the first
8 hex digits of the sha256 of the 64 KiB at 1 MiB; both over the file as written with the ``ss_*`` metadata alone.
The tensor bytes after the header do not change when metadata is added, so AUTOMATIC1111's hash of the final file
is ``sshs_model_hash``.
"""
from __future__ import annotations

import hashlib

import torch

from ..errors import WorkbenchError

# family -> (ss_base_model_version, ss_network_module), as kohya's trainers write them (model_util's
# get_model_version_str_for_sd1_sd2, sdxl_model_util.MODEL_VERSION_SDXL_BASE_V1_0, flux_utils.MODEL_VERSION_FLUX_V1)
KOHYA_FAMILIES = {"sd1": ("sd_v1", "networks.lora"), "sd2": ("sd_v2", "networks.lora"),
                  "sdxl": ("sdxl_base_v1-0", "networks.lora"), "flux": ("flux1", "networks.lora_flux")}
PREFIX = "lora_unet_"
# family -> {text encoder (its part name): the prefixes of kohya's keys of its layers}: kohya's networks/lora.py
# names a lone tower "lora_te" and SDXL's two "lora_te1", "lora_te2"; diffusers' convert_state_dict_to_kohya writes
# "lora_te1" for any first tower (its reader takes both for it); networks/lora_flux.py names Flux.1's CLIP-L
# "lora_te1" and its T5 "lora_te3". The rest of a key is the tower's module path with underscores for dots.
KOHYA_TEXT_PREFIXES = {"sd1": {"text_encoder": ("lora_te_", "lora_te1_")},
                       "sd2": {"text_encoder": ("lora_te_", "lora_te1_")},
                       "sdxl": {"text_encoder": ("lora_te1_",), "text_encoder_2": ("lora_te2_",)},
                       "flux": {"text_encoder": ("lora_te1_",), "text_encoder_2": ("lora_te3_",)}}

# Flux.1: diffusers' module inside a block -> (the BFL layer, the member's place in a fused layer or None)
FLUX_DOUBLE = {"attn.to_q": ("img_attn_qkv", 0), "attn.to_k": ("img_attn_qkv", 1), "attn.to_v": ("img_attn_qkv", 2),
               "attn.to_out.0": ("img_attn_proj", None), "ff.net.0.proj": ("img_mlp_0", None),
               "ff.net.2": ("img_mlp_2", None), "norm1.linear": ("img_mod_lin", None),
               "attn.add_q_proj": ("txt_attn_qkv", 0), "attn.add_k_proj": ("txt_attn_qkv", 1),
               "attn.add_v_proj": ("txt_attn_qkv", 2), "attn.to_add_out": ("txt_attn_proj", None),
               "ff_context.net.0.proj": ("txt_mlp_0", None), "ff_context.net.2": ("txt_mlp_2", None),
               "norm1_context.linear": ("txt_mod_lin", None)}
FLUX_SINGLE = {"attn.to_q": ("linear1", 0), "attn.to_k": ("linear1", 1), "attn.to_v": ("linear1", 2),
               "proj_mlp": ("linear1", 3), "proj_out": ("linear2", None), "norm.linear": ("modulation_lin", None)}
FLUX_BLOCKS = {"transformer_blocks": ("double_blocks", FLUX_DOUBLE),
               "single_transformer_blocks": ("single_blocks", FLUX_SINGLE)}


def flux_kohya_name(path: str) -> tuple[str, int | None] | None:
    """(kohya's layer name, the member's place in a fused layer) of a FluxTransformer2DModel module path, or None
    where kohya's layout names no such layer."""
    blocks, _, rest = path.partition(".")
    index, _, inner = rest.partition(".")
    if blocks not in FLUX_BLOCKS or not index.isdigit() or inner not in FLUX_BLOCKS[blocks][1]:
        return None
    kohya_blocks, table = FLUX_BLOCKS[blocks]
    layer, member = table[inner]
    return f"{PREFIX}{kohya_blocks}_{index}_{layer}", member


def flux_members(kohya_name: str) -> list[str] | None:
    """The module paths inside the block a fused kohya layer stands for, in order, or None if it is not fused."""
    body = kohya_name[len(PREFIX):]
    for blocks, (kohya_blocks, table) in FLUX_BLOCKS.items():
        head = f"{kohya_blocks}_"
        if body.startswith(head):
            index, _, layer = body[len(head):].partition("_")
            members = sorted((m, inner) for inner, (name, m) in table.items() if name == layer and m is not None)
            return [f"{blocks}.{index}.{inner}" for _, inner in members] or None
    return None


def fused_lora(name: str, members: list[str], loras: dict, modules: dict) -> dict[str, torch.Tensor]:
    """One fused layer (kohya's, ComfyUI's) for several LoRAs (``loras``: module path -> (down, up, scale)): downs
    stacked, ups block-diagonal, an absent member as zeros; alpha keeps each member's scale (``scale * fused
    rank``)."""
    present = [loras[m] for m in members if m in loras]
    ranks, scales = {d.shape[0] for d, _, _ in present}, {round(s, 12) for _, _, s in present}
    if len(ranks) != 1 or len(scales) != 1:
        raise WorkbenchError(f"the kohya layout's {name} joins LoRAs of one rank and scale; these have ranks "
                             f"{sorted(ranks)} and scales {sorted(scales)}")
    rank, scale, dtype = ranks.pop(), scales.pop(), present[0][0].dtype
    downs, ups = [], []
    for m in members:
        if m in loras:
            down, up, _ = loras[m]
        else:
            down = torch.zeros(rank, modules[m].in_features, dtype=dtype)
            up = torch.zeros(modules[m].out_features, rank, dtype=dtype)
        downs.append(down)
        ups.append(up)
    return {f"{name}.lora_down.weight": torch.cat(downs).contiguous(),
            f"{name}.lora_up.weight": torch.block_diag(*ups).contiguous(),
            f"{name}.alpha": torch.tensor(scale * rank * len(members))}


def kohya_tensors(loras: dict, modules: dict, family: str) -> dict[str, torch.Tensor]:
    """The kohya layout's tensors of LoRAs on a denoiser (``loras``: module path -> (down, up, scale);
    ``modules``: module path -> layer)."""
    out, fused = {}, {}
    for path, (down, up, scale) in loras.items():
        if family != "flux":
            name, member = PREFIX + path.replace(".", "_"), None
        else:
            found = flux_kohya_name(path)
            if found is None:
                raise WorkbenchError(f"the kohya layout of Flux.1 has no name for the transformer's {path}")
            name, member = found
        if member is not None:
            fused.setdefault(name, []).append(path)
            continue
        out[f"{name}.lora_down.weight"] = down.contiguous()
        out[f"{name}.lora_up.weight"] = up.contiguous()
        out[f"{name}.alpha"] = torch.tensor(scale * down.shape[0])
    for name in fused:
        out.update(fused_lora(name, flux_members(name), loras, modules))
    return out


def kohya_text_tensors(loras: dict, prefix: str) -> dict[str, torch.Tensor]:
    """The kohya layout's tensors of LoRAs on a text tower (``loras``: module path -> (down, up, scale)), under
    ``prefix`` (``KOHYA_TEXT_PREFIXES``) and the module path with underscores for dots."""
    out = {}
    for path, (down, up, scale) in loras.items():
        name = prefix + path.replace(".", "_")
        out[f"{name}.lora_down.weight"] = down.contiguous()
        out[f"{name}.lora_up.weight"] = up.contiguous()
        out[f"{name}.alpha"] = torch.tensor(scale * down.shape[0])
    return out


def kohya_metadata(family: str, rank: int, alpha: float, dropout: float, name: str) -> dict[str, str]:
    version, module = KOHYA_FAMILIES[family]
    return {"ss_network_module": module, "ss_network_dim": str(rank), "ss_network_alpha": str(float(alpha)),
            "ss_network_dropout": str(float(dropout)), "ss_base_model_version": version,
            "ss_v2": str(family == "sd2"), "ss_output_name": name}


def kohya_hashes(data: bytes) -> tuple[str, str]:
    """(``sshs_model_hash``, ``sshs_legacy_hash``) of a safetensors file's bytes, as kohya's
    ``addnet_hash_safetensors`` and ``addnet_hash_legacy`` compute them."""
    length = int.from_bytes(data[:8], "little")
    model = hashlib.sha256(memoryview(data)[8 + length:]).hexdigest()
    legacy = hashlib.sha256(data[0x100000:0x110000]).hexdigest()[:8]
    return model, legacy
