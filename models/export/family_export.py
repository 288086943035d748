"""`dwb export OUT.safetensors` for the newer families: each in the single-file layout its authors publish, as
AUTOMATIC1111, ComfyUI and Forge load it, and as diffusers' ``from_single_file`` reads it back.

- SDXL (Stability's sgm): the UNet under ``model.diffusion_model.``, the VAE under ``first_stage_model.``, CLIP
  ViT-L under ``conditioner.embedders.0.transformer.`` (transformers' names) and OpenCLIP bigG under
  ``conditioner.embedders.1.model.`` (OpenCLIP's: fused q/k/v, the projection as width x projection);
- SD3/3.5 (``sd3.5_*.safetensors`` with encoders): the MMDiT under ``model.diffusion_model.`` in ``mmditx``'s
  names, the VAE under ``first_stage_model.``, CLIP-L, CLIP-G and T5-XXL under ``text_encoders.clip_l.``,
  ``clip_g.`` and ``t5xxl.`` (``transformer.`` then transformers' names); a pipeline without all three (our
  MMDiT, trained without T5) as ``sd3_medium.safetensors`` is published: the MMDiT and the VAE alone;
- Flux.1 (``flux1-dev.safetensors``): the transformer alone in Black Forest Labs' names, no prefix.

Every key map is the inverse of the converter diffusers reads the layout with (``diffusers.loaders.
single_file_utils``: ``convert_ldm_unet_checkpoint`` with its ``DIFFUSERS_TO_LDM_MAPPING``,
``convert_ldm_vae_checkpoint``, ``convert_ldm_clip_checkpoint``, ``convert_open_clip_checkpoint``,
``convert_sd3_transformer_checkpoint_to_diffusers``, ``convert_sd3_t5_checkpoint_to_diffusers``,
``convert_flux_transformer_checkpoint_to_diffusers``), taken one tensor at a time, and every weight of the model
must find its place (a weight left over is a one-line refusal, before anything is written).

Beside the file, ``NAME.config/``: a diffusers folder of the same pipeline, configs and tokenizers always, and the
weights of the parts the file does not hold (Flux.1's VAE and text encoders, the text encoders of an SD3 file without them). It is what diffusers'
``from_single_file(NAME, config=NAME.config)`` and `dwb` read: SD3's and Flux.1's T5 tokenizer cannot be built
offline, and a model whose configs are not its family's published ones (a tiny one) cannot be read without it.
An SDXL model at the published configs needs none (`dwb` and diffusers build SDXL base's configs offline).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ..errors import CheckpointError
from ..families import Family, SingleFile
from ..checkpoints import DROPPED_SUFFIXES, UNET, plain_data
from .original_layout import Entry, unet_entries, vae_entries

SDXL_CLIP_L = "conditioner.embedders.0.transformer."  # diffusers' LDM_CLIP_PREFIX_TO_REMOVE
SDXL_OPENCLIP = "conditioner.embedders.1.model."  # the prefix convert_open_clip_checkpoint is given for SDXL
SD3_TEXT = {"text_encoder": "text_encoders.clip_l.transformer.", "text_encoder_2": "text_encoders.clip_g.transformer.",
            "text_encoder_3": "text_encoders.t5xxl.transformer."}
T5_TIED = ("encoder.embed_tokens.weight", "shared.weight")  # T5's input embedding, tied to ``shared``: the converter
#                                                            reads ``shared.weight`` only


class _Weights:
    """A part's tensors in diffusers' names; each one taken is marked, so what no name took can be refused."""

    def __init__(self, part: str, module: torch.nn.Module):
        self.part = part
        self.tensors = {k: v for k, v in module.state_dict().items() if not k.endswith(DROPPED_SUFFIXES)}
        self.taken: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def take(self, key: str) -> torch.Tensor:
        self.taken.add(key)
        return self.tensors[key]

    def check_all_taken(self, layout: str) -> None:
        left = [k for k in self.tensors if k not in self.taken]
        if left:
            raise CheckpointError(f"{self.part}.{left[0]}: no place for it in the published {layout} layout "
                                  f"({len(left)} weights without one); export it as a diffusers folder")


def _same(name: str, tensor: torch.Tensor) -> Entry:
    return Entry(name, tuple(tensor.shape), tensor.dtype, lambda: tensor)


def _fused(name: str, tensors: list[torch.Tensor]) -> Entry:
    """Tensors stacked along their first axis: what the converters split with ``chunk``/``split``."""
    if len(tensors) == 1:
        return _same(name, tensors[0])
    shape = (sum(t.shape[0] for t in tensors), *tensors[0].shape[1:])
    return Entry(name, shape, tensors[0].dtype, lambda: torch.cat(tensors))


def _halves_swapped(name: str, tensor: torch.Tensor) -> Entry:
    """The original modulation's (shift, scale) from diffusers' (scale, shift): the converters' ``swap_scale_shift``
    swaps the two halves, and swapping them again undoes it."""
    return Entry(name, tuple(tensor.shape), tensor.dtype, lambda: torch.cat(tensor.chunk(2)[::-1]))


def _transposed(name: str, tensor: torch.Tensor) -> Entry:
    return Entry(name, tuple(tensor.shape[::-1]), tensor.dtype, lambda: tensor.T.contiguous())


# How each original tensor is made from diffusers' ones: taken as it is, stacked, or its halves swapped.
MAKERS: dict[str, Callable] = {"same": lambda name, ts: _same(name, ts[0]), "fused": _fused,
                               "swapped": lambda name, ts: _halves_swapped(name, ts[0])}


def _table_entries(weights: _Weights, prefix: str, source: str, table) -> list[Entry]:
    """``table``'s rows (original name, diffusers names, how): a name without a ``.weight``/``.scale`` ending is a
    layer, written as its ``weight`` and (where it has one) ``bias``; rows whose tensors the model lacks are
    skipped (the converter reads them only where they are: SD3's last block's context stream, Flux.1-dev's
    guidance, an MMDiT-X's second attention)."""
    entries = []
    for original, names, how in table:
        names = [names] if isinstance(names, str) else names
        leaves = [("", "")] if original.endswith((".weight", ".scale", "pos_embed")) else [(".weight",) * 2,
                                                                                            (".bias",) * 2]
        for ours, theirs in leaves:
            keys = [source + n + theirs for n in names]
            if all(k in weights for k in keys):
                entries.append(MAKERS[how](prefix + original + ours, [weights.take(k) for k in keys]))
    return entries


def _with_text_model(weights: dict) -> dict:
    """transformers' CLIP names as the published files hold them (``text_model.`` before all but the projection):
    newer transformers keep a CLIPTextModel's names without it."""
    return {(k if k.startswith(("text_model.", "text_projection.")) else "text_model." + k): v
            for k, v in weights.items()}


# ---- SDXL ------------------------------------------------------------------------------------------------------


def _sdxl_unet(unet) -> list[Entry]:
    """``convert_ldm_unet_checkpoint`` inverted: SD's openaimodel layout (``original_layout``), and the pooled text
    and size embedding as ``label_emb`` by diffusers' own ``addition_embed_type`` map."""
    from diffusers.loaders.single_file_utils import DIFFUSERS_TO_LDM_MAPPING

    weights = _Weights("unet", unet)
    added = DIFFUSERS_TO_LDM_MAPPING["unet"]["addition_embed_type"] if unet.config.addition_embed_type == "text_time" \
        else {}
    entries = [_same(UNET + ldm, weights.take(ours)) for ours, ldm in added.items() if ours in weights]
    rest = {k: weights.take(k) for k in weights.tensors if k not in weights.taken}
    return entries + unet_entries(rest, dict(unet.config))


def _vae(vae) -> list[Entry]:
    """``convert_ldm_vae_checkpoint`` inverted (``original_layout``): the same for every family's VAE."""
    return vae_entries(_Weights("vae", vae).tensors, dict(vae.config))


def _openclip_name(key: str) -> str:
    """A diffusers CLIP block weight's OpenCLIP name: ``convert_open_clip_checkpoint``'s replacements
    (``DIFFUSERS_TO_LDM_MAPPING["openclip"]["transformer"]``, OpenCLIP's name -> ours) undone in reverse order."""
    from diffusers.loaders.single_file_utils import DIFFUSERS_TO_LDM_MAPPING

    for ours, openclip in reversed(DIFFUSERS_TO_LDM_MAPPING["openclip"]["transformer"].items()):
        key = key.replace(ours, openclip)
    return key


def _openclip(encoder, prefix: str) -> list[Entry]:
    """``convert_open_clip_checkpoint`` inverted: its ``layers`` map (the projection transposed: it reads
    ``text_projection.T``), then each block under ``transformer.`` with q, k and v stacked as ``in_proj``."""
    from diffusers.loaders.single_file_utils import DIFFUSERS_TO_LDM_MAPPING

    weights = _Weights("text_encoder_2", encoder)
    weights.tensors = _with_text_model(weights.tensors)
    entries = []
    for ours, openclip in DIFFUSERS_TO_LDM_MAPPING["openclip"]["layers"].items():
        if ours in weights:
            make = _transposed if openclip == "text_projection" else _same
            entries.append(make(prefix + openclip, weights.take(ours)))
    for key in list(weights.tensors):
        if key in weights.taken:
            continue
        for kind in ("weight", "bias"):
            if key.endswith(f".q_proj.{kind}"):
                stem = key[:-len(f".q_proj.{kind}")]
                fused = [weights.take(f"{stem}.{q}_proj.{kind}") for q in "qkv"]
                entries.append(_fused(f"{prefix}transformer.{_openclip_name(stem)}.in_proj_{kind}", fused))
        if key not in weights.taken and not key.endswith((".k_proj.weight", ".k_proj.bias", ".v_proj.weight",
                                                          ".v_proj.bias")):
            entries.append(_same(f"{prefix}transformer.{_openclip_name(key)}", weights.take(key)))
    weights.check_all_taken("OpenCLIP bigG")
    return entries


def _clip(encoder, part: str, prefix: str, projection: bool = True) -> list[Entry]:
    """``convert_ldm_clip_checkpoint`` inverted: transformers' names under ``prefix``; without ``projection``
    where the layout has none (SD3's CLIP-L: the converter sets it to the identity)."""
    weights = _with_text_model({k: v for k, v in encoder.state_dict().items() if not k.endswith(DROPPED_SUFFIXES)})
    if not projection and "text_projection.weight" in weights:
        matrix = weights.pop("text_projection.weight")
        identity = torch.eye(matrix.shape[0], dtype=matrix.dtype)
        if matrix.shape[0] != matrix.shape[1] or not torch.equal(matrix, identity):
            raise CheckpointError(f"{part}.text_projection.weight is not the identity, which the published layout "
                                  "takes it to be (diffusers' reader sets it so): export it as a diffusers folder")
    return [_same(prefix + k, v) for k, v in weights.items()]


def sdxl_entries(pipe) -> list[Entry]:
    return [*_sdxl_unet(pipe.unet), *_vae(pipe.vae), *_clip(pipe.text_encoder, "text_encoder", SDXL_CLIP_L),
            *_openclip(pipe.text_encoder_2, SDXL_OPENCLIP)]


# ---- SD3 / 3.5 -------------------------------------------------------------------------------------------------

# ``convert_sd3_transformer_checkpoint_to_diffusers``, each line read the other way: (original, ours, how).
MMDIT = [("pos_embed", "pos_embed.pos_embed", "same"), ("x_embedder.proj", "pos_embed.proj", "same"),
         ("t_embedder.mlp.0", "time_text_embed.timestep_embedder.linear_1", "same"),
         ("t_embedder.mlp.2", "time_text_embed.timestep_embedder.linear_2", "same"),
         ("context_embedder", "context_embedder", "same"),
         ("y_embedder.mlp.0", "time_text_embed.text_embedder.linear_1", "same"),
         ("y_embedder.mlp.2", "time_text_embed.text_embedder.linear_2", "same"),
         ("final_layer.linear", "proj_out", "same"), ("final_layer.adaLN_modulation.1", "norm_out.linear", "swapped")]
MMDIT_BLOCK = [
    ("x_block.attn.qkv", ["attn.to_q", "attn.to_k", "attn.to_v"], "fused"),
    ("context_block.attn.qkv", ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"], "fused"),
    ("x_block.attn.ln_q.weight", "attn.norm_q.weight", "same"),
    ("x_block.attn.ln_k.weight", "attn.norm_k.weight", "same"),
    ("context_block.attn.ln_q.weight", "attn.norm_added_q.weight", "same"),
    ("context_block.attn.ln_k.weight", "attn.norm_added_k.weight", "same"),
    ("x_block.attn.proj", "attn.to_out.0", "same"), ("context_block.attn.proj", "attn.to_add_out", "same"),
    ("x_block.attn2.qkv", ["attn2.to_q", "attn2.to_k", "attn2.to_v"], "fused"),
    ("x_block.attn2.ln_q.weight", "attn2.norm_q.weight", "same"),
    ("x_block.attn2.ln_k.weight", "attn2.norm_k.weight", "same"), ("x_block.attn2.proj", "attn2.to_out.0", "same"),
    ("x_block.adaLN_modulation.1", "norm1.linear", "same"),
    ("x_block.mlp.fc1", "ff.net.0.proj", "same"), ("x_block.mlp.fc2", "ff.net.2", "same"),
    ("context_block.mlp.fc1", "ff_context.net.0.proj", "same"), ("context_block.mlp.fc2", "ff_context.net.2", "same")]


def mmdit_tables(config) -> list[tuple[str, str, list]]:
    """(the original prefix, diffusers' prefix, the rows) of each part of an MMDiT of ``config``: its outer layers,
    then each joint block."""
    last = config.num_layers - 1
    # the last block's context modulation is (shift, scale) in the original, as the final layer's is
    context = ("context_block.adaLN_modulation.1", "norm1_context.linear")
    return [("", "", MMDIT)] + [(f"joint_blocks.{i}.", f"transformer_blocks.{i}.",
                                 MMDIT_BLOCK + [(*context, "swapped" if i == last else "same")])
                                for i in range(last + 1)]


def _mmdit(transformer) -> list[Entry]:
    weights, entries = _Weights("transformer", transformer), []
    for original, ours, rows in mmdit_tables(transformer.config):
        entries += _table_entries(weights, UNET + original, ours, rows)
    weights.check_all_taken("SD3 MMDiT")
    return entries


def _t5(encoder, prefix: str) -> list[Entry]:
    """``convert_sd3_t5_checkpoint_to_diffusers`` inverted: transformers' names under ``prefix``, the input
    embedding once (as ``shared``) where it is tied to it."""
    weights = {k: v for k, v in encoder.state_dict().items() if not k.endswith(DROPPED_SUFFIXES)}
    tied, shared = T5_TIED
    if tied in weights and shared in weights and torch.equal(weights[tied], weights[shared]):
        del weights[tied]
    return [_same(prefix + k, v) for k, v in weights.items()]


def sd3_core_entries(pipe) -> list[Entry]:
    """SD3's file without its text encoders (``sd3_medium.safetensors``): the MMDiT and the VAE."""
    return [*_mmdit(pipe.transformer), *_vae(pipe.vae)]


def sd3_entries(pipe) -> list[Entry]:
    return [*sd3_core_entries(pipe),
            *_clip(pipe.text_encoder, "text_encoder", SD3_TEXT["text_encoder"], projection=False),
            *_clip(pipe.text_encoder_2, "text_encoder_2", SD3_TEXT["text_encoder_2"]),
            *_t5(pipe.text_encoder_3, SD3_TEXT["text_encoder_3"])]


# ---- Flux.1 ----------------------------------------------------------------------------------------------------

# ``convert_flux_transformer_checkpoint_to_diffusers``, each line read the other way: (original, ours, how).
FLUX = [("time_in.in_layer", "time_text_embed.timestep_embedder.linear_1", "same"),
        ("time_in.out_layer", "time_text_embed.timestep_embedder.linear_2", "same"),
        ("vector_in.in_layer", "time_text_embed.text_embedder.linear_1", "same"),
        ("vector_in.out_layer", "time_text_embed.text_embedder.linear_2", "same"),
        ("guidance_in.in_layer", "time_text_embed.guidance_embedder.linear_1", "same"),
        ("guidance_in.out_layer", "time_text_embed.guidance_embedder.linear_2", "same"),
        ("txt_in", "context_embedder", "same"), ("img_in", "x_embedder", "same"),
        ("final_layer.linear", "proj_out", "same"), ("final_layer.adaLN_modulation.1", "norm_out.linear", "swapped")]
FLUX_DOUBLE = [
    ("img_mod.lin", "norm1.linear", "same"), ("txt_mod.lin", "norm1_context.linear", "same"),
    ("img_attn.qkv", ["attn.to_q", "attn.to_k", "attn.to_v"], "fused"),
    ("txt_attn.qkv", ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"], "fused"),
    ("img_attn.norm.query_norm.scale", "attn.norm_q.weight", "same"),
    ("img_attn.norm.key_norm.scale", "attn.norm_k.weight", "same"),
    ("txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight", "same"),
    ("txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight", "same"),
    ("img_mlp.0", "ff.net.0.proj", "same"), ("img_mlp.2", "ff.net.2", "same"),
    ("txt_mlp.0", "ff_context.net.0.proj", "same"), ("txt_mlp.2", "ff_context.net.2", "same"),
    ("img_attn.proj", "attn.to_out.0", "same"), ("txt_attn.proj", "attn.to_add_out", "same")]
FLUX_SINGLE = [
    ("modulation.lin", "norm.linear", "same"),
    ("linear1", ["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"], "fused"),
    ("norm.query_norm.scale", "attn.norm_q.weight", "same"), ("norm.key_norm.scale", "attn.norm_k.weight", "same"),
    ("linear2", "proj_out", "same")]


def flux_tables(config) -> list[tuple[str, str, list]]:
    """(the original prefix, diffusers' prefix, the rows) of each part of a Flux.1 transformer of ``config``: its
    outer layers, each double block, each single block."""
    return [("", "", FLUX),
            *((f"double_blocks.{i}.", f"transformer_blocks.{i}.", FLUX_DOUBLE) for i in range(config.num_layers)),
            *((f"single_blocks.{i}.", f"single_transformer_blocks.{i}.", FLUX_SINGLE)
              for i in range(config.num_single_layers))]


def flux_entries(pipe) -> list[Entry]:
    weights, entries = _Weights("transformer", pipe.transformer), []
    for original, ours, rows in flux_tables(pipe.transformer.config):
        entries += _table_entries(weights, original, ours, rows)
    weights.check_all_taken("Flux.1")
    return entries


# ---- the families' layouts -------------------------------------------------------------------------------------


# The tensors of each published layout, by the name a family's entry gives its file (``SingleFile.key_map``)
KEY_MAPS: dict[str, Callable[[object], list[Entry]]] = {
    "sdxl-sgm": sdxl_entries, "sd3.5": sd3_entries, "sd3-medium": sd3_core_entries, "flux-bfl": flux_entries}


def layout_of(family: Family) -> SingleFile:
    layout = family.single_file
    if layout is None or layout.key_map not in KEY_MAPS:
        raise CheckpointError(f"a {family.label} checkpoint: `dwb export` writes it as a diffusers folder (an OUT "
                              "without .safetensors); its single-file layout is not written")
    return layout


def layout_for(pipe, family: Family) -> SingleFile:
    """The family's layout for this pipeline: without its text encoders where the pipeline lacks one of them and the
    family publishes such a file."""
    layout = layout_of(family)
    if layout.without_text is not None and any(getattr(pipe, name, None) is None for name in layout.in_file):
        return layout.without_text
    return layout


def family_entries(pipe, family: Family) -> list[Entry]:
    """Every tensor of the family's published single file, from its pipeline (a one-line refusal for a part the
    layout needs and the pipeline lacks, or a weight it has no place for)."""
    layout = layout_for(pipe, family)
    missing = [name for name in layout.in_file if getattr(pipe, name, None) is None]
    if missing:
        raise CheckpointError(f"the {family.label} single file holds {', '.join(layout.in_file)}; this pipeline has "
                              f"no {', '.join(missing)}: export it as a diffusers folder")
    return KEY_MAPS[layout.key_map](pipe)


def _config_of(module) -> dict:
    config = module.config
    return plain_data(config.to_dict() if hasattr(config, "to_dict") else dict(config))


def at_published_configs(pipe, family: Family) -> bool:
    """Whether every part of the pipeline has its family's published config (the first variant's, on the keys that
    config sets), so that the configs diffusers and `dwb` write offline for the family fit the file."""
    for name, part in family.variants[0].parts.items():
        module = getattr(pipe, name, None)
        if module is None:
            return False
        config = _config_of(module)
        if any(config.get(key) != value for key, value in plain_data(part.config).items()):
            return False
    return True


def needs_config_folder(pipe, family: Family) -> bool:
    layout = layout_for(pipe, family)
    return not (layout.reads_published_alone and at_published_configs(pipe, family))


def write_config_folder(folder: Path, pipe, family: Family, half: bool) -> Path:
    """``NAME.config/``: the pipeline as a diffusers folder, every part's config and the tokenizers and scheduler,
    and the weights of the parts the file does not hold (float16 with ``half``)."""
    in_file = layout_for(pipe, family).in_file
    folder.mkdir(parents=True)
    pipe.save_config(folder)  # model_index.json
    for name, component in pipe.components.items():
        if component is None:
            continue
        if not isinstance(component, torch.nn.Module):
            component.save_pretrained(folder / name)  # tokenizers, the scheduler
        elif name not in in_file:
            (component.to(torch.float16) if half else component).save_pretrained(folder / name)
        elif hasattr(component, "save_config"):  # a diffusers model: config.json alone
            component.save_config(folder / name)
        else:  # a transformers model
            component.config.architectures = [type(component).__name__]
            component.config.save_pretrained(folder / name)
    return folder
