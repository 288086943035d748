"""Diffusers' internals that the checkpoint door corrects, written against diffusers 0.39.0. On the ground floor
because ``models.checkpoints`` uses it; it imports torch and, when applied, diffusers, never Composer.
`tests/train/test_compat.py` fingerprints the upstream function named below and fails, naming the patch, when it
changes.

**Diffusers' Flux.1 single-file converter at any width** (``flux_single_file_widths``). Diffusers 0.39.0's
``convert_flux_transformer_checkpoint_to_diffusers`` (``diffusers/loaders/single_file_utils.py``) splits each single
block's fused ``linear1`` (q, k, v and the MLP's input, stacked) at the published widths it writes down
(``inner_dim = 3072``, ``mlp_ratio = 4.0``), whatever the file holds: a Flux.1 transformer of another width failed
with ``split_with_sizes`` (a tiny one of width 32: 224 rows where it expects 21,504). The converter's entry in
diffusers' table of single-file loaders (``SINGLE_FILE_LOADABLE_CLASSES["FluxTransformer2DModel"]
["checkpoint_mapping_fn"]``, ``diffusers/loaders/single_file_model.py``, read at each load) is replaced by one that
reads the widths from the file itself (``img_in``'s rows are the width; the MLP takes the rest of ``linear1``),
lets the converter do every other name, and splits ``linear1`` there. At the published width the converter runs
as it is. No upstream issue found.
"""
from __future__ import annotations

import functools

import torch

# The version this module was written and tested against (`tests/train/test_compat.py` compares it).
WRITTEN_FOR = {"diffusers": "0.39.0"}
FLUX_PUBLISHED_WIDTH = 3072  # the width diffusers' Flux.1 converter writes down (see above)


def flux_single_file_widths() -> None:
    """Diffusers' Flux.1 transformer converter splits the fused single-block weights at the file's own widths
    (see above; idempotent)."""
    from diffusers.loaders import single_file_model

    entry = single_file_model.SINGLE_FILE_LOADABLE_CLASSES.get("FluxTransformer2DModel", {})
    original = entry.get("checkpoint_mapping_fn")
    if original is None:
        raise RuntimeError("diffusers has no Flux.1 single-file converter where it was: re-read "
                           "models/common/diffusers_patches.py")
    if getattr(original, "reads_widths", False):
        return

    @functools.wraps(original)
    def convert(checkpoint, **kwargs):
        prefix = "model.diffusion_model." if "model.diffusion_model.img_in.weight" in checkpoint else ""
        width = checkpoint[f"{prefix}img_in.weight"].shape[0]
        if width == FLUX_PUBLISHED_WIDTH:
            return original(checkpoint, **kwargs)
        fused = {key: checkpoint[key] for key in checkpoint
                 if key.startswith(f"{prefix}single_blocks.") and ".linear1." in key}
        published_rows = 3 * FLUX_PUBLISHED_WIDTH + 4 * FLUX_PUBLISHED_WIDTH
        for key, value in fused.items():  # the shape the converter splits, without memory: its parts are replaced
            checkpoint[key] = torch.empty((published_rows, *value.shape[1:]), device="meta")
        converted = original(checkpoint, **kwargs)
        for key, value in fused.items():
            block, kind = key[len(prefix):].split(".")[1], key.rsplit(".", 1)[1]
            mlp = value.shape[0] - 3 * width
            if mlp <= 0:
                raise ValueError(f"{key} has {value.shape[0]} rows, not q, k and v of width {width} and an MLP")
            names = [f"attn.to_{q}" for q in "qkv"] + ["proj_mlp"]
            for name, part in zip(names, torch.split(value, [width, width, width, mlp])):
                converted[f"single_transformer_blocks.{block}.{name}.{kind}"] = part.clone()  # own memory, as the converter's
        return converted

    convert.reads_widths = True
    entry["checkpoint_mapping_fn"] = convert
