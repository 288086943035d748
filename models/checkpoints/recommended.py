"""The generation settings a checkpoint recommends (guidance, steps, sampler, size): read from any kind, written
into exports.

Where they live: a Composer checkpoint's spec (``spec["recommended"]``, from `dwb train`'s ``previews`` section);
a single file `dwb export` wrote, the spec in its metadata (a newer family's file, ``RECOMMENDED_KEY`` there); a
diffusers folder, ``recommended_settings.json`` in its root (``models.generation.RECOMMENDED_FILE``), a file
diffusers' loaders never read. A checkpoint from elsewhere
recommends what its family's published model is sampled at (SDXL, SD3.5, Flux.1), or nothing. Values are checked
as a user's would be (``models.generation.check_recommended``): a checkpoint may come from anyone.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..common import load_outside, write_text_whole
from ..errors import CheckpointError, WorkbenchError
from ..generation import RECOMMENDED_FILE, check_recommended
from .names import Checkpoint

MAX_FILE_BYTES = 64 * 1024  # four short values; a file larger than this is not one we wrote


def recommended_settings(ckpt: Checkpoint) -> dict:
    """The checked recommended settings of a found checkpoint ({} where it records none); a one-line
    CheckpointError naming the checkpoint for a value no command takes, or a file too large, too deep or not JSON."""
    where = f"{ckpt.label}'s recommended settings"
    if ckpt.kind in ("composer", "mosaicml"):
        from .composer import read_summary

        stored = read_summary(ckpt.path)["spec"].get("recommended")
    elif ckpt.kind == "single-file":
        from .single_file import embedded_spec, exported_recommended

        stored = (embedded_spec(Path(ckpt.path)) or {}).get("recommended")
        if stored is None:  # a newer family's file keeps them beside its published layout, not in a spec
            stored = exported_recommended(Path(ckpt.path))
    elif Path(ckpt.path).is_dir() and (Path(ckpt.path) / RECOMMENDED_FILE).is_file():
        try:
            stored = load_outside(Path(ckpt.path) / RECOMMENDED_FILE, where, max_bytes=MAX_FILE_BYTES)
        except WorkbenchError as e:
            raise CheckpointError(str(e)) from None
    else:
        stored = None
    if stored is None:
        stored = published_settings(ckpt) or None
    try:
        return {} if stored is None else check_recommended(stored, where)
    except WorkbenchError as e:  # the checkpoint's own problem, as a damaged file's is
        raise CheckpointError(str(e)) from None


def published_settings(ckpt: Checkpoint) -> dict:
    """What a checkpoint of a newer family (SDXL, SD3.5, Flux.1) that records nothing is published to be sampled
    at: its variant's steps and guidance (``models.families``); {} for the others."""
    from ..families import family_of_folder
    from .single_file import newer_family

    path = Path(ckpt.path)
    if path.is_dir() and (path / "model_index.json").is_file():
        family = family_of_folder(path, ckpt.label)
        try:
            config = load_outside(path / family.denoiser / "config.json", f"{family.denoiser}/config.json")
            variant = family.variant_of(config if isinstance(config, dict) else {})
        except WorkbenchError:
            variant = family.variants[0]
        return family.recommended(variant)
    family = newer_family(path) if ckpt.kind == "single-file" else None
    return family.recommended(family.variants[0]) if family is not None else {}


def write_recommended(folder: Path, settings: dict) -> None:
    """``RECOMMENDED_FILE`` in an exported diffusers folder (nothing where there are no settings)."""
    if settings:
        write_text_whole(Path(folder) / RECOMMENDED_FILE, json.dumps(settings, indent=2, sort_keys=True) + "\n")
