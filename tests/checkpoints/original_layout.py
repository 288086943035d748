"""Writing a diffusers StableDiffusionPipeline as a single-file checkpoint in the original SD layout.

The key mapping is written out here, independently of the loader's (diffusers'), so a test that
round-trips through both checks the loader against the layout community tools save:
``model.diffusion_model.*`` (openaimodel UNet), ``first_stage_model.*`` (ldm AutoencoderKL, 1x1
convolutions in its attention), ``cond_stage_model.transformer.text_model.*`` (SD 1.x, OpenAI CLIP)
or ``cond_stage_model.model.*`` (SD 2.x, OpenCLIP: fused q/k/v, one more block than is used).
"""
from __future__ import annotations

from pathlib import Path

import torch
import yaml

UNET_RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "time_emb_proj": "emb_layers.1",
               "norm2": "out_layers.0", "conv2": "out_layers.3", "conv_shortcut": "skip_connection"}
VAE_RESNET = {"conv_shortcut": "nin_shortcut"}
VAE_ATTENTION = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
OPENCLIP_BLOCK = {"layer_norm1": "ln_1", "layer_norm2": "ln_2", "self_attn.out_proj": "attn.out_proj",
                  "mlp.fc1": "mlp.c_fc", "mlp.fc2": "mlp.c_proj"}


def _rename(key: str, prefixes: list[tuple[str, str]], inner: dict[str, str]) -> str | None:
    for new, old in prefixes:
        if key.startswith(new):
            rest = key[len(new):]
            for a, b in inner.items():
                if rest.startswith(a + "."):
                    rest = b + rest[len(a):]
            return old + rest
    return None


def unet_prefixes(config) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(resnet, other) pairs of (diffusers prefix, openaimodel prefix) for a UNet2DConditionModel config."""
    n, per = len(config.block_out_channels), config.layers_per_block
    resnets = [("mid_block.resnets.0.", "middle_block.0."), ("mid_block.resnets.1.", "middle_block.2.")]
    other = [("time_embedding.linear_1.", "time_embed.0."), ("time_embedding.linear_2.", "time_embed.2."),
             ("conv_in.", "input_blocks.0.0."), ("conv_norm_out.", "out.0."), ("conv_out.", "out.2."),
             ("mid_block.attentions.0.", "middle_block.1.")]
    if getattr(config, "addition_embed_type", None) == "text_time":  # SDXL: pooled text and sizes, sgm's label_emb
        other += [("add_embedding.linear_1.", "label_emb.0.0."), ("add_embedding.linear_2.", "label_emb.0.2.")]
    for i in range(n):
        for j in range(per):
            k = 1 + i * (per + 1) + j
            resnets.append((f"down_blocks.{i}.resnets.{j}.", f"input_blocks.{k}.0."))
            other.append((f"down_blocks.{i}.attentions.{j}.", f"input_blocks.{k}.1."))
        for j in range(per + 1):
            resnets.append((f"up_blocks.{i}.resnets.{j}.", f"output_blocks.{i * (per + 1) + j}.0."))
            other.append((f"up_blocks.{i}.attentions.{j}.", f"output_blocks.{i * (per + 1) + j}.1."))
        if i < n - 1:
            other.append((f"down_blocks.{i}.downsamplers.0.conv.", f"input_blocks.{(i + 1) * (per + 1)}.0.op."))
            upsample = 2 if "CrossAttn" in config.up_block_types[i] else 1  # after the attention, if any
            other.append((f"up_blocks.{i}.upsamplers.0.conv.", f"output_blocks.{i * (per + 1) + per}.{upsample}.conv."))
    return resnets, other


def unet_to_original(unet) -> dict[str, torch.Tensor]:
    resnets, other = unet_prefixes(unet.config)
    out = {}
    for key, value in unet.state_dict().items():
        name = _rename(key, resnets, UNET_RESNET) or _rename(key, other, {})
        assert name is not None, f"no original name for UNet weight {key}"
        out["model.diffusion_model." + name] = value
    return out


def vae_to_original(vae) -> dict[str, torch.Tensor]:
    n = len(vae.config.block_out_channels)
    resnets, other = [], [("quant_conv.", "quant_conv."), ("post_quant_conv.", "post_quant_conv.")]
    for part in ("encoder", "decoder"):
        resnets += [(f"{part}.mid_block.resnets.0.", f"{part}.mid.block_1."),
                    (f"{part}.mid_block.resnets.1.", f"{part}.mid.block_2.")]
        other += [(f"{part}.conv_in.", f"{part}.conv_in."), (f"{part}.conv_out.", f"{part}.conv_out."),
                  (f"{part}.conv_norm_out.", f"{part}.norm_out.")]
    per = vae.config.layers_per_block
    for i in range(n):
        up = n - 1 - i  # the decoder's up blocks run from the deepest level in diffusers, from the top in ldm
        resnets += [(f"encoder.down_blocks.{i}.resnets.{j}.", f"encoder.down.{i}.block.{j}.") for j in range(per)]
        resnets += [(f"decoder.up_blocks.{i}.resnets.{j}.", f"decoder.up.{up}.block.{j}.") for j in range(per + 1)]
        other += [(f"encoder.down_blocks.{i}.downsamplers.0.conv.", f"encoder.down.{i}.downsample.conv."),
                  (f"decoder.up_blocks.{i}.upsamplers.0.conv.", f"decoder.up.{up}.upsample.conv.")]
    attention = [(f"{part}.mid_block.attentions.0.", f"{part}.mid.attn_1.") for part in ("encoder", "decoder")]
    out = {}
    for key, value in vae.state_dict().items():
        name = _rename(key, attention, VAE_ATTENTION)
        if name is not None and value.ndim == 2:
            value = value[:, :, None, None]  # ldm's attention projections are 1x1 convolutions
        name = name or _rename(key, resnets, VAE_RESNET) or _rename(key, other, {})
        assert name is not None, f"no original name for VAE weight {key}"
        out["first_stage_model." + name] = value
    return out


def clip_to_original(text_encoder) -> dict[str, torch.Tensor]:
    """SD 1.x: transformers' CLIPTextModel keys under ``cond_stage_model.transformer.``."""
    return {"cond_stage_model.transformer." + k: v for k, v in text_encoder.state_dict().items()
            if not k.endswith("position_ids")}


def openclip_to_original(text_encoder, seed: int = 0) -> dict[str, torch.Tensor]:
    """SD 2.x: OpenCLIP's text tower, plus the last block SD 2.x does not use (random) and the projection."""
    p, out = "cond_stage_model.model.", {}
    sd = {k.removeprefix("text_model."): v for k, v in text_encoder.state_dict().items()}
    out[p + "token_embedding.weight"] = sd["embeddings.token_embedding.weight"]
    out[p + "positional_embedding"] = sd["embeddings.position_embedding.weight"]
    out[p + "ln_final.weight"], out[p + "ln_final.bias"] = sd["final_layer_norm.weight"], sd["final_layer_norm.bias"]
    layers = text_encoder.config.num_hidden_layers
    for i in range(layers):
        block, src = f"{p}transformer.resblocks.{i}.", f"encoder.layers.{i}."
        for kind in ("weight", "bias"):
            out[block + f"attn.in_proj_{kind}"] = torch.cat([sd[src + f"self_attn.{q}_proj.{kind}"] for q in "qkv"])
            for new, old in OPENCLIP_BLOCK.items():
                out[block + f"{old}.{kind}"] = sd[src + f"{new}.{kind}"]
    gen = torch.Generator().manual_seed(seed)
    last = {k.replace(f"resblocks.{layers - 1}.", f"resblocks.{layers}."): v for k, v in out.items()
            if f"resblocks.{layers - 1}." in k}
    out.update({k: torch.randn(v.shape, generator=gen) * 0.02 for k, v in last.items()})
    width = text_encoder.config.hidden_size
    out[p + "text_projection"] = torch.randn(width, text_encoder.config.projection_dim, generator=gen) * 0.02
    out[p + "logit_scale"] = torch.tensor(4.6052)
    return out


def original_config(pipe, family: str, prediction_type: str) -> dict:
    """The original (ldm) config describing the pipeline's sizes: the sidecar ``NAME.yaml``."""
    unet, vae = pipe.unet.config, pipe.vae.config
    heads = unet.attention_head_dim if isinstance(unet.attention_head_dim, int) else unet.attention_head_dim[0]
    head_size = ({"num_head_channels": unet.block_out_channels[0] // heads} if unet.use_linear_projection
                 else {"num_heads": heads})
    attention = [2 ** i for i, t in enumerate(unet.down_block_types) if t.startswith("CrossAttn")]
    params = {
        "linear_start": 0.00085, "linear_end": 0.012, "timesteps": 1000,
        "image_size": unet.sample_size, "channels": 4, "conditioning_key": "crossattn",
        "scale_factor": vae.scaling_factor,
        "unet_config": {"target": "ldm.modules.diffusionmodules.openaimodel.UNetModel", "params": {
            "in_channels": unet.in_channels, "out_channels": unet.out_channels,
            "model_channels": unet.block_out_channels[0],
            "channel_mult": [c // unet.block_out_channels[0] for c in unet.block_out_channels],
            "num_res_blocks": unet.layers_per_block, "attention_resolutions": attention, **head_size,
            "use_spatial_transformer": True, "use_linear_in_transformer": unet.use_linear_projection,
            "transformer_depth": 1, "context_dim": unet.cross_attention_dim, "legacy": False}},
        "first_stage_config": {"target": "ldm.models.autoencoder.AutoencoderKL", "params": {
            "embed_dim": vae.latent_channels, "ddconfig": {
                "double_z": True, "z_channels": vae.latent_channels, "resolution": vae.sample_size,
                "in_channels": 3, "out_ch": 3, "ch": vae.block_out_channels[0],
                "ch_mult": [c // vae.block_out_channels[0] for c in vae.block_out_channels],
                "num_res_blocks": vae.layers_per_block, "attn_resolutions": []}}},
        "cond_stage_config": ({"target": "ldm.modules.encoders.modules.FrozenCLIPEmbedder"} if family == "sd1" else
                              {"target": "ldm.modules.encoders.modules.FrozenOpenCLIPEmbedder",
                               "params": {"layer": "penultimate"}}),
    }
    if prediction_type == "v_prediction":
        params = {"parameterization": "v", **params}
    return {"model": {"target": "ldm.models.diffusion.ddpm.LatentDiffusion", "params": params}}


def original_state_dict(pipe, family: str) -> dict[str, torch.Tensor]:
    text = clip_to_original(pipe.text_encoder) if family == "sd1" else openclip_to_original(pipe.text_encoder)
    return {**unet_to_original(pipe.unet), **vae_to_original(pipe.vae), **text}


def write_single_file(pipe, path: Path, family: str, *, prediction_type: str | None = None,
                      dtype: torch.dtype = torch.float32) -> Path:
    """``path`` (.safetensors, or .ckpt as a Lightning-style ``{"state_dict": ...}``), and a sidecar
    ``path.yaml`` when ``prediction_type`` is given."""
    path = Path(path)
    weights = {k: v.detach().to(dtype).contiguous() for k, v in original_state_dict(pipe, family).items()}
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(weights, str(path))
    else:
        torch.save({"state_dict": weights, "global_step": 0}, path)
    if prediction_type is not None:
        path.with_suffix(".yaml").write_text(yaml.safe_dump(original_config(pipe, family, prediction_type)))
    return path


def openclip_bigg_to_original(text_encoder, prefix: str) -> dict[str, torch.Tensor]:
    """SDXL's second tower: OpenCLIP's names for every block (SDXL uses all of them and picks the penultimate
    states itself), the projection as OpenCLIP stores it (width x projection)."""
    sd = {k.removeprefix("text_model."): v for k, v in text_encoder.state_dict().items()}
    out = {prefix + "token_embedding.weight": sd["embeddings.token_embedding.weight"],
           prefix + "positional_embedding": sd["embeddings.position_embedding.weight"],
           prefix + "ln_final.weight": sd["final_layer_norm.weight"], prefix + "ln_final.bias": sd["final_layer_norm.bias"],
           prefix + "text_projection": sd["text_projection.weight"].T.contiguous(), prefix + "logit_scale": torch.tensor(4.6052)}
    for i in range(text_encoder.config.num_hidden_layers):
        block, src = f"{prefix}transformer.resblocks.{i}.", f"encoder.layers.{i}."
        for kind in ("weight", "bias"):
            out[block + f"attn.in_proj_{kind}"] = torch.cat([sd[src + f"self_attn.{q}_proj.{kind}"] for q in "qkv"])
            for new, old in OPENCLIP_BLOCK.items():
                out[block + f"{old}.{kind}"] = sd[src + f"{new}.{kind}"]
    return out


def write_sdxl_single_file(pipe, path: Path) -> Path:
    """An SDXL pipeline in the layout Stability's sgm code saves (and A1111, ComfyUI and Forge load): the UNet
    under ``model.diffusion_model.``, the VAE under ``first_stage_model.``, CLIP ViT-L under
    ``conditioner.embedders.0.transformer.`` and OpenCLIP bigG under ``conditioner.embedders.1.model.``."""
    from safetensors.torch import save_file

    clip_l = {"conditioner.embedders.0.transformer." + k: v for k, v in pipe.text_encoder.state_dict().items()
              if not k.endswith("position_ids")}
    weights = {**unet_to_original(pipe.unet), **vae_to_original(pipe.vae), **clip_l,
               **openclip_bigg_to_original(pipe.text_encoder_2, "conditioner.embedders.1.model.")}
    save_file({k: v.detach().contiguous() for k, v in weights.items()}, str(path))
    return Path(path)


def _fused(sd: dict, names: list[str]) -> torch.Tensor:
    return torch.cat([sd[n] for n in names])


def flux_to_original(transformer) -> dict[str, torch.Tensor]:
    """A Flux.1 transformer in Black Forest Labs' own names (their reference ``flux/model.py``, the file they
    publish and ComfyUI and Forge load): fused q/k/v (and, in single blocks, the MLP's input), RMS norms'
    ``scale``, and the final modulation as (shift, scale) where diffusers keeps (scale, shift)."""
    sd, out = transformer.state_dict(), {}
    pairs = {"x_embedder": "img_in", "context_embedder": "txt_in",
             "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
             "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
             "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
             "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
             "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
             "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer", "proj_out": "final_layer.linear"}
    for ours, theirs in pairs.items():
        for kind in ("weight", "bias"):
            if f"{ours}.{kind}" in sd:
                out[f"{theirs}.{kind}"] = sd[f"{ours}.{kind}"]
    for kind in ("weight", "bias"):
        scale, shift = sd[f"norm_out.linear.{kind}"].chunk(2)
        out[f"final_layer.adaLN_modulation.1.{kind}"] = torch.cat([shift, scale])
    for i in range(len(transformer.transformer_blocks)):
        b, o = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for kind in ("weight", "bias"):
            out[o + f"img_mod.lin.{kind}"] = sd[b + f"norm1.linear.{kind}"]
            out[o + f"txt_mod.lin.{kind}"] = sd[b + f"norm1_context.linear.{kind}"]
            out[o + f"img_attn.qkv.{kind}"] = _fused(sd, [b + f"attn.to_{q}.{kind}" for q in "qkv"])
            out[o + f"txt_attn.qkv.{kind}"] = _fused(sd, [b + f"attn.add_{q}_proj.{kind}" for q in "qkv"])
            out[o + f"img_attn.proj.{kind}"] = sd[b + f"attn.to_out.0.{kind}"]
            out[o + f"txt_attn.proj.{kind}"] = sd[b + f"attn.to_add_out.{kind}"]
            for side, ff in (("img", "ff"), ("txt", "ff_context")):
                out[o + f"{side}_mlp.0.{kind}"] = sd[b + f"{ff}.net.0.proj.{kind}"]
                out[o + f"{side}_mlp.2.{kind}"] = sd[b + f"{ff}.net.2.{kind}"]
        for side, q, k in (("img", "norm_q", "norm_k"), ("txt", "norm_added_q", "norm_added_k")):
            out[o + f"{side}_attn.norm.query_norm.scale"] = sd[b + f"attn.{q}.weight"]
            out[o + f"{side}_attn.norm.key_norm.scale"] = sd[b + f"attn.{k}.weight"]
    for i in range(len(transformer.single_transformer_blocks)):
        b, o = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        for kind in ("weight", "bias"):
            out[o + f"linear1.{kind}"] = _fused(sd, [b + f"attn.to_{q}.{kind}" for q in "qkv"] + [b + f"proj_mlp.{kind}"])
            out[o + f"linear2.{kind}"] = sd[b + f"proj_out.{kind}"]
            out[o + f"modulation.lin.{kind}"] = sd[b + f"norm.linear.{kind}"]
        out[o + "norm.query_norm.scale"] = sd[b + "attn.norm_q.weight"]
        out[o + "norm.key_norm.scale"] = sd[b + "attn.norm_k.weight"]
    # every weight is written once: nothing of the model is left without an original name
    assert sum(v.numel() for v in out.values()) == sum(v.numel() for v in sd.values()), "a Flux weight has no name"
    return out


def mmdit_to_original(transformer) -> dict[str, torch.Tensor]:
    """An SD3/3.5 MMDiT in Stability's own names (their reference ``mmditx.py``, in the files they publish):
    ``joint_blocks.N.x_block`` / ``context_block`` with fused q/k/v, ``ln_q``/``ln_k``, and every final modulation
    as (shift, scale) where diffusers keeps (scale, shift): the model's and the last block's context one."""
    sd, out = transformer.state_dict(), {}

    def shift_scale(weight):
        scale, shift = weight.chunk(2)
        return torch.cat([shift, scale])

    pairs = {"pos_embed.proj": "x_embedder.proj", "time_text_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
             "time_text_embed.timestep_embedder.linear_2": "t_embedder.mlp.2",
             "time_text_embed.text_embedder.linear_1": "y_embedder.mlp.0",
             "time_text_embed.text_embedder.linear_2": "y_embedder.mlp.2", "context_embedder": "context_embedder",
             "proj_out": "final_layer.linear"}
    for ours, theirs in pairs.items():
        for kind in ("weight", "bias"):
            out[f"{theirs}.{kind}"] = sd[f"{ours}.{kind}"]
    out["pos_embed"] = sd["pos_embed.pos_embed"]
    for kind in ("weight", "bias"):
        out[f"final_layer.adaLN_modulation.1.{kind}"] = shift_scale(sd[f"norm_out.linear.{kind}"])
    last = len(transformer.transformer_blocks) - 1
    for i in range(last + 1):
        b, o = f"transformer_blocks.{i}.", f"joint_blocks.{i}."
        for kind in ("weight", "bias"):
            out[o + f"x_block.adaLN_modulation.1.{kind}"] = sd[b + f"norm1.linear.{kind}"]
            context = sd[b + f"norm1_context.linear.{kind}"]
            out[o + f"context_block.adaLN_modulation.1.{kind}"] = shift_scale(context) if i == last else context
            out[o + f"x_block.attn.qkv.{kind}"] = _fused(sd, [b + f"attn.to_{q}.{kind}" for q in "qkv"])
            out[o + f"context_block.attn.qkv.{kind}"] = _fused(sd, [b + f"attn.add_{q}_proj.{kind}" for q in "qkv"])
            out[o + f"x_block.attn.proj.{kind}"] = sd[b + f"attn.to_out.0.{kind}"]
            out[o + f"x_block.mlp.fc1.{kind}"] = sd[b + f"ff.net.0.proj.{kind}"]
            out[o + f"x_block.mlp.fc2.{kind}"] = sd[b + f"ff.net.2.{kind}"]
            if i < last:  # the last block's context stream ends at its attention
                out[o + f"context_block.attn.proj.{kind}"] = sd[b + f"attn.to_add_out.{kind}"]
                out[o + f"context_block.mlp.fc1.{kind}"] = sd[b + f"ff_context.net.0.proj.{kind}"]
                out[o + f"context_block.mlp.fc2.{kind}"] = sd[b + f"ff_context.net.2.{kind}"]
        for stream, q, k in (("x_block", "norm_q", "norm_k"), ("context_block", "norm_added_q", "norm_added_k")):
            if b + f"attn.{q}.weight" in sd:
                out[o + f"{stream}.attn.ln_q.weight"] = sd[b + f"attn.{q}.weight"]
                out[o + f"{stream}.attn.ln_k.weight"] = sd[b + f"attn.{k}.weight"]
    assert sum(v.numel() for v in out.values()) == sum(v.numel() for v in sd.values()), "an MMDiT weight has no name"
    return out


def write_sd3_single_file(pipe, path: Path, text_encoders: bool = True) -> Path:
    """SD3.5 as Stability publishes it: the MMDiT under ``model.diffusion_model.``, the VAE under
    ``first_stage_model.`` and, with ``text_encoders``, CLIP-L, CLIP-G and T5 under ``text_encoders.clip_l``,
    ``clip_g`` and ``t5xxl`` (``.transformer.`` then transformers' own names)."""
    from safetensors.torch import save_file

    weights = {"model.diffusion_model." + k: v for k, v in mmdit_to_original(pipe.transformer).items()}
    weights.update(vae_to_original(pipe.vae))
    if text_encoders:  # CLIP-L's projection is not in the published files (it is the identity there)
        for name, encoder in (("clip_l", pipe.text_encoder), ("clip_g", pipe.text_encoder_2),
                              ("t5xxl", pipe.text_encoder_3)):
            weights.update({f"text_encoders.{name}.transformer.{k}": v for k, v in encoder.state_dict().items()
                            if not k.endswith("position_ids") and not (name == "clip_l" and k.startswith("text_proj"))
                            and k != "encoder.embed_tokens.weight"})  # T5 keeps its tied embedding as "shared"
    save_file({k: v.detach().contiguous() for k, v in weights.items()}, str(path))
    return Path(path)
