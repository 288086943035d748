"""ControlNet models a user holds, opened through the door: a diffusers folder (``config.json`` and
``diffusion_pytorch_model.safetensors``), a single ``.safetensors`` file of diffusers' key names (as SDXL's ControlNets are mostly
published for AUTOMATIC1111) or of ControlNet 1.x's original layout (``control_model.input_blocks...``, SD 1.5's and
2.1's ControlNets as published in safetensors), or a hub id (a repository holding such a folder).

Everything is judged before a tensor is read, each refusal one line naming the ControlNet (never a server path), by
the steps every model held beside a checkpoint takes (``model_files``):

- a pickle (``.pth``, ``.ckpt``, ``.bin``) is never opened: unpickling runs whatever code the file names;
- a file over ``MAX_CONTROLNET_BYTES``, and a safetensors head out of bounds (``models.readers.read_safetensors_head``);
- a folder's ``config.json`` read as JSON from elsewhere (bounded), of the family's ControlNet class only, every
  size in it held to what the family's UNets may ask for (``models.families.check_part_config``);
- ControlNet 1.x's original layout (``control_model.`` keys, or the same bare) is renamed by diffusers' own
  converter, on the meta device first, and judged under diffusers' names like any other file;
- a ControlNet of another model: its text states' width (``cross_attention_dim``: SD 1.x 768, SD 2.x 1024, SDXL
  2048), its levels, widths and added conditioning must be the UNet's it steers, whose residuals it adds to;
- its tensors must be exactly the ones the model its config builds holds (names, shapes, float dtypes), counted on
  the meta device: a file can make the loader allocate no more than that model's weights.

With ``roots`` (the app), a path is taken only under them (nothing it reads leading outside) and a hub id only from
the local cache, as for checkpoints (``find``).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError, WorkbenchError, first_line
from .model_files import (CONFIG, WEIGHTS, built_on_meta, check_tensors, folder_config, judged_head, loaded,
                          model_files)

# SDXL's full ControlNet is 2.5 GB in float16, 5 GB in float32; twice that is the most a file may hold
MAX_CONTROLNET_BYTES = 10 << 30
ORIGINAL_PREFIX = "control_model."  # ControlNet 1.x's own files (diffusers' LDM_CONTROLNET_KEY)
# the UNet config keys a ControlNet shares with the UNet it steers (diffusers' ``ControlNetModel.from_unet``), of which
# those in FITS must be equal: its residuals are added to that UNet's levels
SHARED = ("in_channels", "flip_sin_to_cos", "freq_shift", "down_block_types", "only_cross_attention",
          "block_out_channels", "layers_per_block", "downsample_padding", "mid_block_scale_factor", "act_fn",
          "norm_num_groups", "norm_eps", "cross_attention_dim", "attention_head_dim", "num_attention_heads",
          "use_linear_projection", "class_embed_type", "num_class_embeds", "upcast_attention",
          "resnet_time_scale_shift", "projection_class_embeddings_input_dim", "mid_block_type", "encoder_hid_dim",
          "encoder_hid_dim_type", "addition_embed_type", "addition_time_embed_dim", "transformer_layers_per_block")
FITS = ("block_out_channels", "layers_per_block", "down_block_types", "addition_embed_type",
        "projection_class_embeddings_input_dim")
MAX_CONDITIONING_CHANNELS = 4  # an RGB(A) control image
log = logging.getLogger("checkpoints")
_opened: dict = {}  # the last ControlNet opened, by its weights' version, dtype and device (the app draws many times)


@dataclass(frozen=True)
class OpenedControlNet:
    model: object  # the family's ControlNet model (diffusers' ControlNetModel), on the pipeline's device and dtype
    name: str  # as AUTOMATIC1111 names it: the file's or folder's name, or the hub id
    hash: str  # its content hash (``hashing``), as a checkpoint's "Model hash"


def open_controlnet(ref, pipe, *, roots: list[Path] | None = None, allow_download: bool | None = None):
    """The ControlNet ``ref`` names, judged against ``pipe``'s family and UNet, then read (``OpenedControlNet``); a
    one-line WorkbenchError for a family without a ControlNet pipeline, a file it does not take, or a ControlNet of
    another model."""
    from ..families import family_of_pipeline

    family = family_of_pipeline(pipe)
    check_takes_controlnet(family)
    name, recorded, folder, weights = find_controlnet(ref, roots=roots, allow_download=allow_download)
    denoiser = getattr(pipe, family.denoiser)
    st = weights.stat()
    key = (str(weights), st.st_size, st.st_mtime_ns, denoiser.dtype, str(denoiser.device), id(denoiser.config))
    if key not in _opened:
        _opened.clear()
        _opened[key] = _read_controlnet(name, folder, weights, family, denoiser, pipe.vae_scale_factor)
    return OpenedControlNet(_opened[key], recorded, _hash_of(folder or weights))


def check_takes_controlnet(family) -> None:
    if family.controlnet_pipeline is None:
        from ..families import FAMILIES

        having = ", ".join(f.label for f in FAMILIES if f.controlnet_pipeline)
        raise WorkbenchError(f"{family.label} has no ControlNet pipeline here: ControlNets steer {having}")


def _record_name(name: str) -> str:
    """The name a record gives it (a file's stem, a folder's name, a hub id) without "," and ":", which would split
    AUTOMATIC1111's ControlNet unit text."""
    return name.replace(",", "").replace(":", "") or "controlnet"


def controlnet_hash(ref, *, roots: list[Path] | None = None) -> str:
    """The content hash of the ControlNet ``ref`` names locally (``find_controlnet``), as its records give it."""
    _, _, folder, weights = find_controlnet(ref, roots=roots, allow_download=False)
    return _hash_of(folder or weights)


def _hash_of(path: Path) -> str:
    from .hashing import SHORT, file_hash, folder_hash

    return (folder_hash(path) if path.is_dir() else file_hash(path))[:SHORT]


def find_controlnet(ref, *, roots: list[Path] | None = None, allow_download: bool | None = None):
    """(its name in messages, its name in records, its folder or None for a single file, its weights file) of a
    ControlNet reference: a local folder or ``.safetensors`` file (under ``roots`` where given), or a hub id; one line
    where it is none of them."""
    from .find import _under_roots, label_under
    from .hub import hub_offline, written_as_hub_id

    raw = str(ref or "").strip()
    if not raw or "\x00" in raw:
        raise WorkbenchError("no ControlNet given" if not raw else "not a valid ControlNet reference")
    if roots is not None:
        local = _under_roots(raw, roots)
        name = label_under(local, roots) if local is not None else raw
    else:
        local = Path(raw) if os.path.lexists(raw) else None
        name = raw
    if local is not None:
        stem = local.stem if local.suffix == ".safetensors" else local.name
        return (name, _record_name(stem), *model_files(local, f"ControlNet {name}", "ControlNetModel"))
    if not written_as_hub_id(raw):
        raise WorkbenchError(f"ControlNet not found: {raw[:200]}")
    offline = roots is not None and not allow_download or allow_download is False or hub_offline()
    try:
        folder = _hub_folder(raw, offline)
    except CheckpointError as e:
        if roots is None:
            raise
        log.warning("ControlNet hub id %s: %s", raw, e)  # a server's client is not told its cache's path
        where = "on the Hugging Face hub" if allow_download else "in the server's Hugging Face cache"
        raise CheckpointError(f"ControlNet not found: {raw} (not under the allowed folders, nor {where})") from None
    return (raw, _record_name(raw), *model_files(folder, f"ControlNet {raw}", "ControlNetModel"))


def _hub_folder(repo_ref: str, offline: bool) -> Path:
    """The local snapshot of a hub ControlNet's config and safetensors weights (only those are downloaded)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    from .hub import _missing_offline, _parse, hub_cache

    parsed = _parse(repo_ref)
    if parsed is None:
        raise WorkbenchError(f"ControlNet not found: {repo_ref}")
    repo, revision = parsed
    try:
        return Path(snapshot_download(repo, revision=revision, cache_dir=hub_cache(), local_files_only=offline,
                                      allow_patterns=[CONFIG, WEIGHTS]))
    except LocalEntryNotFoundError:
        raise CheckpointError(f"ControlNet {_missing_offline(repo, revision, hub_cache())}") from None
    except Exception as e:  # noqa: BLE001 - not on the hub, gated, no such revision, hub unreachable
        raise CheckpointError(f"cannot get ControlNet {repo_ref} from the Hugging Face hub: {first_line(e)}") from None


def _read_controlnet(name: str, folder: Path | None, weights: Path, family, denoiser, scale: int):
    """The ControlNet built from its config and weights once both are judged (see the module's note)."""
    from safetensors.torch import load_file

    what = f"ControlNet {name}"
    head = judged_head(weights, what, MAX_CONTROLNET_BYTES)
    shapes = {key: tuple(t.shape) for key, t in head.tensors.items()}
    original = folder is None and any(k.startswith((ORIGINAL_PREFIX, "input_hint_block.")) for k in shapes)
    if original:
        shapes = _renamed_shapes(shapes, denoiser.config.layers_per_block, what)
    config = folder_config(folder, what, family.controlnet_model) if folder is not None else \
        _file_config(dict(denoiser.config), shapes, name)
    check_fits(config, dict(denoiser.config), family, name, scale)
    model = built_on_meta(family.controlnet_model, config, what)
    check_tensors(model, shapes, what)
    state = load_file(weights)
    return loaded(model, _renamed(state, denoiser.config.layers_per_block) if original else state, denoiser)


def _renamed(state: dict, layers_per_block) -> dict:
    """ControlNet 1.x's original names (``control_model.`` or bare) as diffusers' (its own converter's renaming); the
    tensors it finds no place for are left out, for ``check_tensors`` to name."""
    from diffusers.loaders.single_file_utils import convert_controlnet_checkpoint

    renamed = convert_controlnet_checkpoint(dict(state), {"layers_per_block": layers_per_block})
    return {k: v for k, v in renamed.items() if v is not None}


def _renamed_shapes(shapes: dict, layers_per_block, what: str) -> dict:
    """The shapes of an original-layout file under diffusers' names, renamed on the meta device (nothing is read);
    one line for a control embedding other than ControlNet 1.x's, whose last convolution the renaming expects at
    ``input_hint_block.14`` (four widths: the image made 8 times smaller, as SD's VAE makes it)."""
    import torch

    bare = {k.removeprefix(ORIGINAL_PREFIX): s for k, s in shapes.items()}
    if isinstance(layers_per_block, bool) or not isinstance(layers_per_block, int):
        raise WorkbenchError(f"{what} is in ControlNet 1.x's original layout, which is read for a UNet of one "
                             "depth at every level alone: give its diffusers version")
    if "input_hint_block.14.weight" not in bare:
        raise WorkbenchError(f"{what} is in ControlNet 1.x's original layout, but its control image embedding is not "
                             "that layout's (no input_hint_block.14): give its diffusers version")
    renamed = _renamed({k: torch.empty(s, device="meta") for k, s in shapes.items()}, layers_per_block)
    return {k: tuple(v.shape) for k, v in renamed.items()}


def _file_config(unet_config: dict, shapes: dict, name: str) -> dict:
    """A single file's config: the UNet's shared settings (which it must fit anyway), its own sizes read from its
    tensors: the control image's channels and embedding widths, and each level's transformer depth."""
    config = {k: unet_config[k] for k in SHARED if k in unet_config}
    first = shapes.get("controlnet_cond_embedding.conv_in.weight")
    if first is None or len(first) != 4:
        raise WorkbenchError(f"ControlNet {name} is not a ControlNet: it has no controlnet_cond_embedding.conv_in")
    widths = [first[0]]
    for i in range(1, 64, 2):
        block = shapes.get(f"controlnet_cond_embedding.blocks.{i}.weight")
        if block is None:
            break
        widths.append(block[0])
    depths = []
    for b, kind in enumerate(unet_config.get("down_block_types") or ()):
        count = len({k.split(".")[5] for k in shapes if k.startswith(f"down_blocks.{b}.attentions.0.transformer_blocks.")})
        depths.append(count or 1)
    return {**config, "_class_name": "ControlNetModel", "conditioning_channels": first[1],
            "conditioning_embedding_out_channels": tuple(widths),
            **({"transformer_layers_per_block": tuple(depths)} if depths else {})}


def _family_of_width(width) -> str:
    from ..families import FAMILIES

    for family in FAMILIES:
        for variant in family.variants:
            unet = variant.parts.get("unet")
            if unet is not None and unet.config.get("cross_attention_dim") == width and not variant.refiner:
                return f" ({family.label}'s)"
    return ""


def check_fits(config: dict, unet_config: dict, family, name: str, scale: int) -> None:
    """A one-line WorkbenchError unless the ControlNet ``config`` fits the UNet it would steer: the same text states'
    width, levels, widths and added conditioning, 4 latent channels in, its control image embedding halving the image
    as often as the VAE (``scale``: the pipeline's ``vae_scale_factor``); and every size held as a UNet's is."""
    from ..families import check_part_config

    mine, theirs = config.get("cross_attention_dim"), unet_config.get("cross_attention_dim")
    if mine != theirs:
        raise WorkbenchError(f"ControlNet {name} conditions on {mine}-wide text states{_family_of_width(mine)}; this "
                             f"{family.label} model's UNet takes {theirs}-wide ones: a ControlNet of another family")
    latents = unet_config.get("out_channels") or family.latent_channels
    if config.get("in_channels", 4) != latents:
        raise WorkbenchError(f"ControlNet {name} takes {config.get('in_channels')} latent channels; this "
                             f"{family.label} model draws {latents}")
    for key in FITS:
        mine, theirs = _plain(config.get(key)), _plain(unet_config.get(key))
        if mine != theirs:
            raise WorkbenchError(f"ControlNet {name} does not fit this {family.label} model: its {key} is "
                                 f"{str(mine)[:80]}, the UNet's {str(theirs)[:80]}")
    check_part_config("UNet2DConditionModel", {k: v for k, v in config.items() if not k.startswith("_")},
                      f"ControlNet {name}'s config")
    channels, widths = config.get("conditioning_channels", 3), config.get("conditioning_embedding_out_channels", ())
    largest = 4 * max(unet_config.get("block_out_channels") or (1,))
    if (isinstance(channels, bool) or not isinstance(channels, int) or not 1 <= channels <= MAX_CONDITIONING_CHANNELS
            or not isinstance(widths, (list, tuple)) or not 1 <= len(widths) <= 8
            or any(isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= largest for w in widths)):
        raise WorkbenchError(f"ControlNet {name}: its control image embedding ({str(channels)[:20]} channels, widths "
                             f"{str(widths)[:60]}) is outside 1 to {MAX_CONDITIONING_CHANNELS} channels and up to 8 "
                             f"widths of at most {largest}")
    if 2 ** (len(widths) - 1) != scale:
        raise WorkbenchError(f"ControlNet {name} makes its control image {2 ** (len(widths) - 1)} times smaller; this "
                             f"model's latents are {scale} times smaller than its images")


def _plain(value):
    return list(value) if isinstance(value, (list, tuple)) else value
