"""A model spec from weights alone: the architecture of a checkpoint that does not say what it is.

mosaicml/diffusion's Composer checkpoints hold diffusers-format ``unet.*``, ``vae.*`` and ``text_encoder.*``
weights and nothing else. A known architecture (``models.checkpoints.architectures``: SD2-base, tiny) is recognised
when every weight's name and shape match it, and then its configs are used whole. Otherwise the configs
are read off the shapes, which fix everything but three settings the weights cannot show; those follow the
SD2 family: 64-channel attention heads, GroupNorm of 32 groups, OpenCLIP's GELU text tower.
"""
from __future__ import annotations

import re

import torch

from .architectures import ARCHITECTURES
from ..errors import CheckpointError
from .spec import SPEC_FORMAT, plain_data

HEAD_CHANNELS = 64  # SD2's attention heads (diffusers' attention_head_dim lists head counts: 320/5 = 64)
NORM_GROUPS = 32
SD_LATENT_SCALE = 0.18215  # SD1/SD2's VAE scaling factor; mosaicml/diffusion's default latent_std is its inverse


def _part(weights: dict, prefix: str) -> dict[str, tuple]:
    return {k[len(prefix):]: tuple(v.shape) for k, v in weights.items() if k.startswith(prefix)}


def _indices(shapes: dict, prefix: str) -> list[int]:
    found = {int(m.group(1)) for k in shapes if (m := re.match(re.escape(prefix) + r"(\d+)\.", k))}
    return sorted(found)


def _meta_shapes(module_cls, config: dict) -> dict[str, tuple]:
    with torch.device("meta"):
        module = module_cls(config) if not isinstance(config, dict) else module_cls(**config)
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def unet_config_from_shapes(shapes: dict) -> dict:
    down, up = _indices(shapes, "down_blocks."), _indices(shapes, "up_blocks.")
    channels = [shapes[f"down_blocks.{i}.resnets.0.conv1.weight"][0] for i in down]
    attn = lambda side, i: any(k.startswith(f"{side}.{i}.attentions.") for k in shapes)  # noqa: E731
    to_k = next(v for k, v in shapes.items() if k.endswith("attn2.to_k.weight"))
    proj_in = next(v for k, v in shapes.items() if k.endswith("proj_in.weight"))
    return dict(sample_size=64, in_channels=shapes["conv_in.weight"][1], out_channels=shapes["conv_out.weight"][0],
                down_block_types=["CrossAttnDownBlock2D" if attn("down_blocks", i) else "DownBlock2D" for i in down],
                up_block_types=["CrossAttnUpBlock2D" if attn("up_blocks", i) else "UpBlock2D" for i in up],
                block_out_channels=channels, layers_per_block=len(_indices(shapes, "down_blocks.0.resnets.")),
                cross_attention_dim=to_k[1], attention_head_dim=[c // HEAD_CHANNELS or 1 for c in channels],
                use_linear_projection=len(proj_in) == 2, norm_num_groups=NORM_GROUPS)


def vae_config_from_shapes(shapes: dict) -> dict:
    down = _indices(shapes, "encoder.down_blocks.")
    return dict(in_channels=shapes["encoder.conv_in.weight"][1], out_channels=shapes["decoder.conv_out.weight"][0],
                latent_channels=shapes["quant_conv.weight"][0] // 2, sample_size=512,
                block_out_channels=[shapes[f"encoder.down_blocks.{i}.resnets.0.conv1.weight"][0] for i in down],
                layers_per_block=len(_indices(shapes, "encoder.down_blocks.0.resnets.")),
                down_block_types=["DownEncoderBlock2D"] * len(down), up_block_types=["UpDecoderBlock2D"] * len(down),
                norm_num_groups=NORM_GROUPS, scaling_factor=SD_LATENT_SCALE)


def text_encoder_config_from_shapes(shapes: dict) -> dict:
    vocab, hidden = shapes["text_model.embeddings.token_embedding.weight"]
    return dict(vocab_size=vocab, hidden_size=hidden, num_attention_heads=max(hidden // HEAD_CHANNELS, 1),
                intermediate_size=shapes["text_model.encoder.layers.0.mlp.fc1.weight"][0],
                num_hidden_layers=len(_indices(shapes, "text_model.encoder.layers.")),
                max_position_embeddings=shapes["text_model.embeddings.position_embedding.weight"][0],
                hidden_act="gelu", projection_dim=512)


def _known(shapes: dict[str, dict]) -> str | None:
    """The known architecture whose every weight name and shape match, if any."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    for name, arch in ARCHITECTURES.items():
        if "vocab_size" not in arch["text_encoder"] or "unet" not in arch:
            continue  # a tokenizer fitted per run (stored in the checkpoint: a spec-less file cannot use it), or a
            # transformer (mosaicml/diffusion's spec-less files are its StableDiffusion UNets)
        expected = {"unet": _meta_shapes(UNet2DConditionModel, arch["unet"]),
                    "vae": _meta_shapes(AutoencoderKL, arch["vae"]),
                    "text_encoder": _meta_shapes(CLIPTextModel, CLIPTextConfig(**arch["text_encoder"]))}
        if all(expected[p] == {k: v for k, v in shapes[p].items() if k in expected[p]} and
               set(expected[p]) <= set(shapes[p]) for p in expected):
            return name
    return None


def spec_from_weights(weights: dict, where: str, prediction_type: str = "epsilon") -> dict:
    """A ``spec`` dict for a spec-less checkpoint (its tokenizer: the SD CLIP BPE one, shipped)."""
    shapes = {p: _part(weights, p + ".") for p in ("unet", "vae", "text_encoder")}
    name = _known(shapes)
    try:
        if name is not None:
            arch = ARCHITECTURES[name]
            unet, vae, text = dict(arch["unet"]), dict(arch["vae"]), dict(arch["text_encoder"])
        else:
            unet, vae = unet_config_from_shapes(shapes["unet"]), vae_config_from_shapes(shapes["vae"])
            text = text_encoder_config_from_shapes(shapes["text_encoder"])
    except (KeyError, StopIteration, IndexError) as e:
        raise CheckpointError(f"{where}: cannot tell its architecture from the weights (no {e})") from None
    from .clip_bpe import VOCAB_SIZE

    if text["vocab_size"] != VOCAB_SIZE:
        raise CheckpointError(f"{where}: its text encoder has {text['vocab_size']} tokens, not the CLIP tokenizer's "
                              f"{VOCAB_SIZE}; the checkpoint does not say which tokenizer it was trained with")
    resolution = unet["sample_size"] * 2 ** (len(vae["block_out_channels"]) - 1)
    return {"format": SPEC_FORMAT, "architecture": name or "inferred", "prediction_type": prediction_type,
            "resolution": resolution, "unet": plain_data(unet), "vae": plain_data(vae), "text_encoder": plain_data(text),
            "tokenizer": sd2_tokenizer_files()}


def sd2_tokenizer_files() -> dict[str, str]:
    """SD2's tokenizer (OpenAI's CLIP BPE, padded with "!"), built from the vocabulary shipped in the package."""
    import tempfile
    from pathlib import Path

    from .clip_bpe import write_clip_tokenizer

    with tempfile.TemporaryDirectory(prefix="dwb-tokenizer-") as tmp:
        write_clip_tokenizer(tmp, pad_token="!")
        return {p.name: p.read_text() for p in Path(tmp).iterdir() if p.is_file()}


# ---------------------------------------------------------------------------------------------
# What the weights cannot show: the prediction type and the latent scale

PREDICTION_TYPES = ("epsilon", "v_prediction")
FLAGS = {"prediction_type": "--prediction-type", "latent_scale": "--latent-scale"}
# Where a Composer checkpoint holds weights or optimizer state: never searched for settings.
WEIGHT_SECTIONS = ("model", "optimizers", "algorithms", "schedulers", "scaler", "rng")
SEARCH_DEPTH = 6


def _settings_in(node, depth: int = SEARCH_DEPTH) -> dict:
    """``prediction_type`` and the latent scale from any mapping in ``node``: mosaicml/diffusion's
    ``StableDiffusion`` takes ``prediction_type`` and ``latent_std`` (latents are divided by it, so the
    scale is its inverse); a run's config kept in the checkpoint holds them under those names."""
    found = {}
    if depth == 0:
        return found
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, (list, tuple)) else ()
    for key, value in items:
        if key == "prediction_type" and value in PREDICTION_TYPES:
            found.setdefault("prediction_type", value)
        elif key == "latent_std" and isinstance(value, (int, float)) and value > 0:
            found.setdefault("latent_scale", 1.0 / float(value))
        elif isinstance(value, (dict, list, tuple)):
            for name, setting in _settings_in(value, depth - 1).items():
                found.setdefault(name, setting)
    return found


def recorded_settings(state: dict) -> dict:
    """The prediction type and latent scale a spec-less Composer checkpoint records, where it records them:
    in the plain data Composer keeps besides the weights (callbacks' states, integrations, metadata)."""
    return _settings_in({k: v for k, v in state.items() if k not in WEIGHT_SECTIONS})


def _differs(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return abs(float(a) - float(b)) > 1e-6 * max(abs(float(a)), abs(float(b)))
    return a != b


def settle_spec(spec: dict, said: dict, flags: dict, where: str) -> tuple[dict, list[str]]:
    """The spec with the prediction type and latent scale settled: what the file says (``said``), else the
    command's flag, else the SD2 default with a note saying which flag to pass. A flag that contradicts
    the file is refused."""
    spec = {**spec, "vae": dict(spec["vae"])}
    current = {"prediction_type": spec["prediction_type"], "latent_scale": spec["vae"].get("scaling_factor")}
    notes = []
    for name, flag in FLAGS.items():
        given, known = flags.get(name), said.get(name)
        if given is not None and known is not None and _differs(given, known):
            raise CheckpointError(f"{where} records {name} {known}; {flag} {given} contradicts it")
        value = known if known is not None else given
        if value is None:
            notes.append(f"{where} does not record its {name.replace('_', ' ')}: read as {current[name]} "
                         f"(pass {flag} if it was trained otherwise)")
            continue
        if name == "prediction_type":
            spec["prediction_type"] = value
        else:
            spec["vae"]["scaling_factor"] = float(value)
    return spec, notes
