"""The key maps from diffusers' names to the original Stable Diffusion layout, and the original config.

What ``single_file`` reads, written the other way: the UNet under ``model.diffusion_model.`` in
openaimodel's names, the VAE under ``first_stage_model.`` in ldm's (its mid-block attention as 1x1
convolutions), the text tower under ``cond_stage_model.``: transformers' own names for an OpenAI CLIP
tower (SD 1.x, ``quick_gelu``), OpenCLIP's for SD 2.x's (``gelu``: fused q/k/v, ``resblocks``).

Each original tensor is an ``Entry``: its name, shape and how to make it from the checkpoint's tensors,
so a writer can put down a header first and then make and write one tensor at a time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import CheckpointError
from ..checkpoints import DROPPED_SUFFIXES, SD1_TEXT, SD2_TEXT, SD_SCHEDULE, UNET, VAE

UNET_RESNET = (("norm1.", "in_layers.0."), ("conv1.", "in_layers.2."), ("time_emb_proj.", "emb_layers.1."),
               ("norm2.", "out_layers.0."), ("conv2.", "out_layers.3."), ("conv_shortcut.", "skip_connection."))
VAE_RESNET = (("conv_shortcut.", "nin_shortcut."),)
VAE_ATTENTION = (("group_norm.", "norm."), ("to_q.", "q."), ("to_k.", "k."), ("to_v.", "v."),
                 ("to_out.0.", "proj_out."))
OPENCLIP_BLOCK = (("layer_norm1.", "ln_1."), ("layer_norm2.", "ln_2."), ("self_attn.out_proj.", "attn.out_proj."),
                  ("mlp.fc1.", "mlp.c_fc."), ("mlp.fc2.", "mlp.c_proj."))


@dataclass(frozen=True)
class Entry:
    """One tensor of the original layout: ``make()`` builds it from the checkpoint's tensors when written."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]


def _same(name: str, tensor: torch.Tensor) -> Entry:
    return Entry(name, tuple(tensor.shape), tensor.dtype, lambda: tensor)


def family_of(spec: dict) -> str:
    """``sd2`` (OpenCLIP layout) for a GELU text tower, as SD 2.x's; ``sd1`` (OpenAI CLIP layout) otherwise."""
    return "sd2" if spec["text_encoder"].get("hidden_act") == "gelu" else "sd1"


def _renamed(rest: str, pairs) -> str:
    for new, old in pairs:
        if rest.startswith(new):
            return old + rest[len(new):]
    return rest


def _block_prefixes(pairs: list[tuple[str, str]], key: str) -> tuple[str, str] | None:
    return next(((new, old) for new, old in pairs if key.startswith(new)), None)


def unet_prefixes(config: dict) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(resnet, other) pairs of (diffusers prefix, openaimodel prefix): each level has ``layers_per_block``
    input blocks after a downsampling one, and one more output block, whose last holds the upsampler
    (after its attention, when the level has one)."""
    levels, per = len(config["block_out_channels"]), config["layers_per_block"]
    resnets = [("mid_block.resnets.0.", "middle_block.0."), ("mid_block.resnets.1.", "middle_block.2.")]
    other = [("time_embedding.linear_1.", "time_embed.0."), ("time_embedding.linear_2.", "time_embed.2."),
             ("conv_in.", "input_blocks.0.0."), ("conv_norm_out.", "out.0."), ("conv_out.", "out.2."),
             ("mid_block.attentions.0.", "middle_block.1.")]
    for level in range(levels):
        for j in range(per):
            block = 1 + level * (per + 1) + j
            resnets.append((f"down_blocks.{level}.resnets.{j}.", f"input_blocks.{block}.0."))
            other.append((f"down_blocks.{level}.attentions.{j}.", f"input_blocks.{block}.1."))
        for j in range(per + 1):
            block = level * (per + 1) + j
            resnets.append((f"up_blocks.{level}.resnets.{j}.", f"output_blocks.{block}.0."))
            other.append((f"up_blocks.{level}.attentions.{j}.", f"output_blocks.{block}.1."))
        if level < levels - 1:
            other.append((f"down_blocks.{level}.downsamplers.0.conv.", f"input_blocks.{(level + 1) * (per + 1)}.0.op."))
            after = 2 if config["up_block_types"][level].startswith("CrossAttn") else 1
            last = level * (per + 1) + per
            other.append((f"up_blocks.{level}.upsamplers.0.conv.", f"output_blocks.{last}.{after}.conv."))
    return resnets, other


def vae_prefixes(config: dict) -> tuple[list, list, list]:
    """(resnet, attention, other) prefix pairs: ldm numbers the decoder's levels from the top, diffusers from
    the deepest."""
    levels, per = len(config["block_out_channels"]), config["layers_per_block"]
    resnets, attention = [], []
    other = [("quant_conv.", "quant_conv."), ("post_quant_conv.", "post_quant_conv.")]
    for part in ("encoder", "decoder"):
        resnets += [(f"{part}.mid_block.resnets.0.", f"{part}.mid.block_1."),
                    (f"{part}.mid_block.resnets.1.", f"{part}.mid.block_2.")]
        attention.append((f"{part}.mid_block.attentions.0.", f"{part}.mid.attn_1."))
        other += [(f"{part}.conv_in.", f"{part}.conv_in."), (f"{part}.conv_out.", f"{part}.conv_out."),
                  (f"{part}.conv_norm_out.", f"{part}.norm_out.")]
    for level in range(levels):
        up = levels - 1 - level
        resnets += [(f"encoder.down_blocks.{level}.resnets.{j}.", f"encoder.down.{level}.block.{j}.")
                    for j in range(per)]
        resnets += [(f"decoder.up_blocks.{level}.resnets.{j}.", f"decoder.up.{up}.block.{j}.") for j in range(per + 1)]
        other += [(f"encoder.down_blocks.{level}.downsamplers.0.conv.", f"encoder.down.{level}.downsample.conv."),
                  (f"decoder.up_blocks.{level}.upsamplers.0.conv.", f"decoder.up.{up}.upsample.conv.")]
    return resnets, attention, other


def unet_entries(weights: dict, config: dict) -> list[Entry]:
    resnets, other = unet_prefixes(config)
    entries = []
    for key, tensor in weights.items():
        if (pair := _block_prefixes(resnets, key)) is not None:
            name = pair[1] + _renamed(key[len(pair[0]):], UNET_RESNET)
        elif (pair := _block_prefixes(other, key)) is not None:
            name = pair[1] + key[len(pair[0]):]
        else:
            raise CheckpointError(f"unet.{key}: no place for it in the original UNet layout")
        entries.append(_same(UNET + name, tensor))
    return entries


def _as_conv1x1(name: str, tensor: torch.Tensor) -> Entry:
    return Entry(name, (*tensor.shape, 1, 1), tensor.dtype, lambda: tensor[:, :, None, None])


def vae_entries(weights: dict, config: dict) -> list[Entry]:
    resnets, attention, other = vae_prefixes(config)
    entries = []
    for key, tensor in weights.items():
        if (pair := _block_prefixes(attention, key)) is not None:
            name = VAE + pair[1] + _renamed(key[len(pair[0]):], VAE_ATTENTION)
            entries.append(_as_conv1x1(name, tensor) if tensor.ndim == 2 else _same(name, tensor))
            continue
        if (pair := _block_prefixes(resnets, key)) is not None:
            name = pair[1] + _renamed(key[len(pair[0]):], VAE_RESNET)
        elif (pair := _block_prefixes(other, key)) is not None:
            name = pair[1] + key[len(pair[0]):]
        else:
            raise CheckpointError(f"vae.{key}: no place for it in the original VAE layout")
        entries.append(_same(VAE + name, tensor))
    return entries


def clip_entries(weights: dict) -> list[Entry]:
    """SD 1.x: transformers' CLIPTextModel names under ``cond_stage_model.transformer.``."""
    return [_same(SD1_TEXT[:-len("text_model.")] + key, tensor) for key, tensor in weights.items()]


def _fused(name: str, parts: list[torch.Tensor]) -> Entry:
    if len(parts) == 1:
        return _same(name, parts[0])
    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
    return Entry(name, shape, parts[0].dtype, lambda: torch.cat(parts))


def _zeros(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Entry:
    return Entry(name, shape, dtype, lambda: torch.zeros(shape, dtype=dtype))


def openclip_entries(weights: dict, config: dict) -> list[Entry]:
    """SD 2.x: OpenCLIP's text tower. SD 2.x conditions on the penultimate block, so a diffusers text encoder
    has one block fewer than the OpenCLIP tower it came from; the file gets that last block back as zeros
    (a block of zeros leaves its input unchanged, and SD 2.x never runs it), so it has the 24 blocks of
    ViT-H/14 that the original config, AUTOMATIC1111 and diffusers count on."""
    sd = {k.removeprefix("text_model."): v for k, v in weights.items()}
    entries = [_same(SD2_TEXT + "token_embedding.weight", sd["embeddings.token_embedding.weight"]),
               _same(SD2_TEXT + "positional_embedding", sd["embeddings.position_embedding.weight"]),
               _same(SD2_TEXT + "ln_final.weight", sd["final_layer_norm.weight"]),
               _same(SD2_TEXT + "ln_final.bias", sd["final_layer_norm.bias"])]
    layers = config["num_hidden_layers"]
    for i in range(layers + 1):
        block, source = f"{SD2_TEXT}transformer.resblocks.{i}.", f"encoder.layers.{min(i, layers - 1)}."
        for kind in ("weight", "bias"):
            pairs = [(f"attn.in_proj_{kind}", [sd[f"{source}self_attn.{q}_proj.{kind}"] for q in "qkv"])]
            pairs += [(old + kind, [sd[source + new + kind]]) for new, old in OPENCLIP_BLOCK]
            for name, tensors in pairs:
                entry = _fused(block + name, tensors)
                entries.append(_zeros(entry.name, entry.shape, entry.dtype) if i == layers else entry)
    return entries


def original_entries(weights: dict, spec: dict) -> list[Entry]:
    """Every tensor of the original layout from a checkpoint's ``unet.``/``vae.``/``text_encoder.`` weights
    (diffusers' names), in the spec's architecture."""
    parts: dict[str, dict] = {"unet": {}, "vae": {}, "text_encoder": {}}
    for key, tensor in weights.items():
        part, _, rest = key.partition(".")
        if part not in parts:
            raise CheckpointError(f"{key}: a weight of no part of Stable Diffusion (unet, vae, text_encoder)")
        if not rest.endswith(DROPPED_SUFFIXES):
            parts[part][rest] = tensor
    text = (openclip_entries(parts["text_encoder"], spec["text_encoder"]) if family_of(spec) == "sd2"
            else clip_entries(parts["text_encoder"]))
    return [*unet_entries(parts["unet"], spec["unet"]), *vae_entries(parts["vae"], spec["vae"]), *text]


def _heads(unet: dict) -> dict:
    """openaimodel counts heads per level (``num_heads``) or fixes their width (``num_head_channels``);
    diffusers' ``attention_head_dim`` is the head count (SD 2.x: 5, 10, 20 = 64-channel heads)."""
    heads = unet["attention_head_dim"]
    heads = heads if isinstance(heads, int) else heads[0]
    if unet.get("use_linear_projection"):
        return {"num_head_channels": unet["block_out_channels"][0] // heads}
    return {"num_heads": heads}


def original_config(spec: dict) -> dict:
    """The original (ldm) config of the spec's model: what AUTOMATIC1111 reads from ``NAME.yaml`` beside the file,
    and what ``single_file`` reads back (sizes, prediction type, latent scale, text tower)."""
    unet, vae = spec["unet"], spec["vae"]
    base = unet["block_out_channels"][0]
    attention = [2 ** i for i, t in enumerate(unet["down_block_types"]) if t.startswith("CrossAttn")]
    sd2 = family_of(spec) == "sd2"
    params = {
        **SD_SCHEDULE, "image_size": unet["sample_size"], "channels": unet["in_channels"],
        "conditioning_key": "crossattn", "scale_factor": vae.get("scaling_factor", 0.18215),
        "unet_config": {"target": "ldm.modules.diffusionmodules.openaimodel.UNetModel", "params": {
            "image_size": unet["sample_size"], "in_channels": unet["in_channels"],
            "out_channels": unet["out_channels"], "model_channels": base,
            "channel_mult": [c // base for c in unet["block_out_channels"]],
            "num_res_blocks": unet["layers_per_block"], "attention_resolutions": attention, **_heads(unet),
            "use_spatial_transformer": True, "use_linear_in_transformer": bool(unet.get("use_linear_projection")),
            "transformer_depth": 1, "context_dim": unet["cross_attention_dim"], "legacy": False}},
        "first_stage_config": {"target": "ldm.models.autoencoder.AutoencoderKL", "params": {
            "embed_dim": vae["latent_channels"], "ddconfig": {
                "double_z": True, "z_channels": vae["latent_channels"], "resolution": spec["resolution"],
                "in_channels": vae["in_channels"], "out_ch": vae["out_channels"], "ch": vae["block_out_channels"][0],
                "ch_mult": [c // vae["block_out_channels"][0] for c in vae["block_out_channels"]],
                "num_res_blocks": vae["layers_per_block"], "attn_resolutions": [], "dropout": 0.0},
            "lossconfig": {"target": "torch.nn.Identity"}}},
        "cond_stage_config": ({"target": "ldm.modules.encoders.modules.FrozenOpenCLIPEmbedder",
                               "params": {"freeze": True, "layer": "penultimate"}} if sd2 else
                              {"target": "ldm.modules.encoders.modules.FrozenCLIPEmbedder"}),
    }
    if spec["prediction_type"] == "v_prediction":
        params = {"parameterization": "v", **params}
    return {"model": {"base_learning_rate": 1.0e-4, "target": "ldm.models.diffusion.ddpm.LatentDiffusion",
                      "params": params}}
