"""A VAE a user holds, opened through the door to replace a checkpoint's own (AUTOMATIC1111's SD VAE setting): a
diffusers ``AutoencoderKL`` folder (``config.json`` and ``diffusion_pytorch_model.safetensors``), or a single
``.safetensors`` file in diffusers' key names or the original layout (``encoder.down.0.block...``, with or without
``first_stage_model.``), as VAEs are published for AUTOMATIC1111.

Everything is judged before a tensor is read, each refusal one line naming the VAE (never a server path), by the
steps every model held beside a checkpoint takes (``model_files``):

- a pickle (``.pt``, ``.ckpt``, ``.bin``) is never opened: unpickling runs whatever code the file names;
- a file over ``MAX_VAE_BYTES``, and a safetensors head out of bounds (``models.readers.read_safetensors_head``);
- a folder's ``config.json`` read as JSON from elsewhere (bounded), an ``AutoencoderKL``'s, every size in it held to
  what the families' VAEs may ask for (``models.families.check_part_config``);
- a VAE of another family: its latent channels, how often it halves the image and its latent scaling (and shift)
  must be the checkpoint's own VAE's, whose latents the denoiser draws (SD 1/2's 0.18215 and SDXL's 0.13025 VAEs
  have one architecture; Flux.1's and SD3's make 16 channels). A single file holds no scaling: it is taken to be
  the family's, and its config is the checkpoint's VAE's;
- its tensors must be exactly those of the model its config builds (names, shapes, float dtypes), counted on the
  meta device: a file can make the loader allocate no more than that model's weights.

With ``roots`` (the app), a path is taken only under them, nothing it reads leading outside (``find``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import WorkbenchError, first_line
from .model_files import CONFIG, built_on_meta, check_tensors, folder_config, judged_head, loaded, model_files

# SDXL's VAE is 335 MB in float32 (SD's the same); four times that is the most a file may hold
MAX_VAE_BYTES = 4 * 335 << 20
MATCHED = ("latent_channels", "scaling_factor", "shift_factor")  # what a VAE must share with the checkpoint's own
A1111_HASH = 10  # hex digits of the file's SHA-256 AUTOMATIC1111 writes as "VAE hash"
_hashes: dict = {}  # (path, size, mtime) -> its A1111 hash
_opened: dict = {}  # the last VAE opened, by its weights' version, dtype and device (the app draws many times)


@dataclass(frozen=True)
class OpenedVae:
    model: object = None  # diffusers' AutoencoderKL, on the pipeline's device and dtype
    name: str = ""  # as AUTOMATIC1111 records it: the file's name, or the folder's
    hash: str = ""  # AUTOMATIC1111's "VAE hash": the first 10 hex digits of the weights file's SHA-256


def open_vae(ref, pipe, *, roots: list[Path] | None = None) -> OpenedVae:
    """The VAE ``ref`` names, judged against ``pipe``'s own VAE, then read (``OpenedVae``); a one-line WorkbenchError
    for a file it does not take or a VAE of another family."""
    from ..families import family_of_pipeline

    family = family_of_pipeline(pipe)
    name, folder, weights = find_vae(ref, roots=roots)
    own = pipe.vae
    st = weights.stat()
    key = (str(weights), st.st_size, st.st_mtime_ns, own.dtype, str(own.device), id(own.config))
    if key not in _opened:
        _opened.clear()
        _opened[key] = _read_vae(name, folder, weights, family, own)
    return OpenedVae(_opened[key], Path(name).name or "vae", a1111_vae_hash(weights))


def a1111_vae_hash(path: Path) -> str:
    """AUTOMATIC1111's "VAE hash": the SHA-256 of the whole file (at most MAX_VAE_BYTES, read once), 10 digits."""
    from ..common import sha256_of

    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _hashes:
        _hashes[key] = sha256_of(path)[:A1111_HASH]
    return _hashes[key]


def find_vae(ref, *, roots: list[Path] | None = None) -> tuple[str, Path | None, Path]:
    """(its name, its folder or None for a single file, its weights file) of a local VAE: a folder or a
    ``.safetensors`` file (under ``roots`` where given, nothing it reads leading outside); one line otherwise."""
    from .find import _under_roots, check_reads_inside, label_under

    raw = str(ref or "").strip()
    if not raw or "\x00" in raw:
        raise WorkbenchError("no VAE given" if not raw else "not a valid VAE reference")
    if roots is not None:
        local = _under_roots(raw, roots)
        if local is None:
            raise WorkbenchError(f"VAE not found: {raw[:200]}")
        name = label_under(local, roots)
        check_reads_inside(local, roots, f"VAE {name}")
    else:
        local, name = Path(raw), raw
        if not os.path.lexists(raw):
            raise WorkbenchError(f"VAE not found: {raw[:200]}")
    if local.is_dir() and (local / "vae" / CONFIG).is_file():  # a pipeline folder: its VAE
        local = local / "vae"
    return (name, *model_files(local, f"VAE {name}", "AutoencoderKL"))


def _read_vae(name: str, folder: Path | None, weights: Path, family, own):
    """The VAE built from its config and weights once both are judged (see the module's note)."""
    from safetensors.torch import load_file

    what = f"VAE {name}"
    head = judged_head(weights, what, MAX_VAE_BYTES)
    config = _folder_config(folder, what) if folder is not None else _file_config(dict(own.config), head, name)
    check_vae_fits(config, dict(own.config), family, name)
    model = built_on_meta("AutoencoderKL", config, what)
    shapes = _diffusers_names({k: t.shape for k, t in head.tensors.items()}, config, name, meta=True)
    check_tensors(model, shapes, what)
    return loaded(model, _diffusers_names(load_file(weights), config, name), own)


def _folder_config(folder: Path, what: str) -> dict:
    """A folder's ``config.json``, an AutoencoderKL's, every size in it held to what the families' VAEs may ask for."""
    from ..families import check_part_config

    config = folder_config(folder, what, "AutoencoderKL")
    check_part_config("AutoencoderKL", {k: v for k, v in config.items() if not k.startswith("_")},
                      f"{what}'s {CONFIG}")
    return config


def _file_config(own: dict, head, name: str) -> dict:
    """A single file's config: the checkpoint's VAE's, with the latent channels its encoder's last convolution makes
    (twice them: a mean and a variance each), so a file of another family is named as one."""
    out = next((t.shape for k, t in head.tensors.items() if k.endswith("encoder.conv_out.weight")
                and not k.endswith("decoder.conv_out.weight")), None)
    if out is None or len(out) != 4:
        raise WorkbenchError(f"VAE {name} is not a VAE: it has no encoder.conv_out")
    return {**own, "latent_channels": out[0] // 2}


def check_vae_fits(config: dict, own: dict, family, name: str) -> None:
    """A one-line WorkbenchError unless the VAE ``config`` makes the latents the checkpoint's own VAE (``own``) makes:
    as many channels, the image halved as often, the same scaling and shift."""
    levels = len(config.get("block_out_channels") or ()), len(own.get("block_out_channels") or ())
    for key in MATCHED:
        mine, theirs = config.get(key), own.get(key)
        if mine != theirs:
            raise WorkbenchError(f"VAE {name} has {key} {str(mine)[:20]}; this {family.label} model's latents have "
                                 f"{theirs}: a VAE of another family")
    if levels[0] != levels[1]:
        raise WorkbenchError(f"VAE {name} makes its latents {2 ** max(levels[0] - 1, 0)} times smaller than the "
                             f"image; this {family.label} model's are {2 ** (levels[1] - 1)} times: a VAE of another "
                             "family")


def _diffusers_names(tensors: dict, config: dict, name: str, meta: bool = False) -> dict:
    """The tensors under diffusers' names: as they are where they have them, converted from the original layout
    (``encoder.down.0.block...``, under ``first_stage_model.`` or not) by diffusers' own converter otherwise. With
    ``meta``, ``tensors`` are shapes, converted as empty tensors on the meta device."""
    import torch

    if meta:
        tensors = {k: torch.empty(tuple(shape), device="meta") for k, shape in tensors.items()}
    if any(k.startswith("encoder.down_blocks.") for k in tensors):
        converted = tensors
    else:
        from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

        try:
            converted = convert_ldm_vae_checkpoint(tensors, config)
        except Exception as e:  # noqa: BLE001 - names from elsewhere: the converter's own check of them
            raise WorkbenchError(f"VAE {name} is in neither diffusers' layout nor the original one "
                                 f"({first_line(e)})") from None
    return {k: tuple(v.shape) for k, v in converted.items()} if meta else converted

