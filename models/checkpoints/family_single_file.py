"""Single files of the newer families (SDXL, SD3/3.5, Flux.1), read by diffusers' own single-file loader.

SD 1.x and 2.x files are read and written by this room's key maps (``single_file``, ``original_layout``); the
other families' files go to the family's diffusers pipeline ``from_single_file`` with a config folder:

- the parts named with the checkpoint (``--parts FOLDER_OR_HUB_ID``, the app's Parts field: a diffusers folder
  of the same model or a hub id in the local cache, found by ``find_checkpoint`` like any checkpoint);
- else ``NAME.config/`` beside the file where there is one (a diffusers folder of the same model, as `dwb export`
  writes beside a single file);
- either gives its configs and tokenizers, and the weights of any part the file lacks, and is checked like any
  folder and refused in one line where it is another family's;
- otherwise one written in a private temporary folder from the family's full-size configs, with the CLIP
  tokenizers built from the vocabulary shipped in the package: nothing is downloaded. A family whose tokenizers
  cannot be built offline (T5's for SD3 and Flux.1) needs its parts named or beside it, and says so in one line.

The file itself is read as safetensors only (``.ckpt`` files of these families are refused: a pickle).
"""
from __future__ import annotations

import json
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from ..common import flux_single_file_widths, load_outside
from ..errors import CheckpointError, WorkbenchError, first_line
from ..families import Family, family_of_folder
from ..readers import check_pipeline_folder
from .clip_bpe import END, write_clip_tokenizer
from .memory import held_configs

# What pads a prompt for each CLIP tokenizer of SDXL: OpenAI CLIP pads with its end token, OpenCLIP with "!".
SDXL_PADS = {"tokenizer": END, "tokenizer_2": "!"}


def sidecar_folder(path: Path) -> Path:
    return path.with_name(path.stem + ".config")


def parts_folder(path: Path, parts: Path | None = None) -> Path | None:
    """Where a family file's other parts come from: the folder named with it, else ``NAME.config/`` beside it,
    else None (the family's published configs, where they can be written offline)."""
    if parts is not None:
        return parts
    sidecar = sidecar_folder(path)
    return sidecar if sidecar.is_dir() else None


def check_parts_folder(folder: Path, family: Family, where: str) -> None:
    """A parts folder is checked like any folder (``check_pipeline_folder``) and must be of the file's family."""
    check_pipeline_folder(folder, where)
    theirs = family_of_folder(folder, where)
    if theirs.name != family.name:
        raise CheckpointError(f"{where} holds {theirs.label} parts, not {family.label} ones: give a diffusers folder "
                              f"of the same model as the file")


def check_parts(path: Path, label: str, parts: Path, where: str) -> None:
    """Whether ``parts`` (called ``where``) can give the other parts of the single file ``path`` (called
    ``label``), one line where not: the file is a newer family's (SD 1.x/2.x files hold every part), the folder
    a pipeline of that family."""
    from .single_file import newer_family

    family = newer_family(Path(path))
    if family is None:
        raise CheckpointError(f"{label} holds every part it needs: parts are named for SDXL, SD3/3.5 and Flux.1 "
                              f"single files only")
    check_parts_folder(parts, family, where)


# The side a full-size VAE draws a latent side at: a Flux.1 transformer records no sample size, and its pipeline
# draws at the family's native latent side (as a Flux.1 folder is described).
FULL_SIZE_VAE_SCALE = 8


def _folder_resolution(folder: Path, family: Family) -> int | None:
    """The native side the parts folder's denoiser and VAE configs give, or None where they do not say."""
    try:
        denoiser = load_outside(folder / family.denoiser / "config.json", f"{family.denoiser}/config.json")
        vae = load_outside(folder / "vae" / "config.json", "vae/config.json")
        latent = denoiser.get("sample_size") or family.native_size // FULL_SIZE_VAE_SCALE
        return int(latent) * 2 ** (len(vae["block_out_channels"]) - 1)
    except (WorkbenchError, AttributeError, KeyError, TypeError, ValueError):
        return None


def describe_family_file(path: Path, family: Family, parts: Path | None = None) -> dict:
    """What the file is, without building a model: the family's first variant, at the size its parts folder's
    configs give (else the family's native size)."""
    variant, folder = family.variants[0], parts_folder(path, parts)
    resolution = _folder_resolution(folder, family) if folder is not None else None
    return {"architecture": f"{family.name}-{variant.name}", "resolution": resolution or family.native_size,
            "prediction_type": "flow" if family.schedule == "flow" else "epsilon", "family": family.name,
            "original_config": folder.name if folder is not None else f"{family.label} {variant.name}'s published configs"}


def _write_json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def write_family_config_folder(folder: Path, family: Family) -> Path:
    """A diffusers folder without weights from the family's first variant's full-size configs: what
    ``from_single_file(config=...)`` reads offline. Only where every tokenizer is a CLIP one (SDXL)."""
    from transformers import CLIPTextConfig

    variant = family.variants[0]
    if not all(variant.parts[name].cls.startswith("CLIPText") for name in family.text_encoders):
        raise CheckpointError(f"a {family.label} single file needs its configs and tokenizers beside it: a diffusers "
                              f"folder of the same model as NAME.config/, or named by --parts (the T5 tokenizer "
                              f"cannot be built offline)")
    scheduler = dict(family.assembly.scheduler, prediction_type="epsilon")  # the base model's: our samplers start there
    index = {"_class_name": family.pipeline, "scheduler": ["diffusers", scheduler["_class_name"]]}
    for name, part in variant.parts.items():
        index[name] = [part.library, part.cls]
        if part.library == "transformers":
            config = CLIPTextConfig(**part.config)
            config.architectures = [part.cls]
            config.save_pretrained(folder / name)
        else:
            _write_json(folder / name / "config.json", {"_class_name": part.cls, **part.config})
    for tokenizer, pad in SDXL_PADS.items():
        write_clip_tokenizer(folder / tokenizer, pad_token=pad)
        index[tokenizer] = ["transformers", "CLIPTokenizer"]
    _write_json(folder / "scheduler" / "scheduler_config.json", scheduler)
    _write_json(folder / "model_index.json", index)
    return folder


def _without_text_encoders(keys, family: Family) -> bool:
    """Whether a file of these tensor names holds none of its text encoders' weights (Flux.1's published files hold
    the denoiser alone, SD3's ``sd3_medium`` the denoiser and the VAE)."""
    return not any(k.startswith(mark) for k in keys for mark in family.single_file_text_marks)


def _from_file(path: Path, folder: Path, family: Family):
    """The pipeline from the file and the config folder: the whole pipeline from the file, or, where the file holds
    no text encoder (Flux.1's published files, SD3's ``sd3_medium``), the denoiser and any VAE from it and every
    other part from the folder."""
    import diffusers

    from .single_file import VAE, read_shapes

    held_configs(folder, (family.denoiser, *family.text_encoders, "vae"), str(folder))  # before any is built
    options = dict(local_files_only=True, torch_dtype=torch.float32)
    pipeline = getattr(diffusers, family.pipeline)
    keys = read_shapes(path)
    with _weights_the_converter_reads(keys, family):
        if not _without_text_encoders(keys, family):
            return pipeline.from_single_file(str(path), config=str(folder), **options, **family.pipeline_options)
        in_file = {family.denoiser: getattr(diffusers, family.variants[0].parts[family.denoiser].cls)}
        if any(k.startswith(VAE) for k in keys):
            in_file["vae"] = diffusers.AutoencoderKL
        loaded = {name: cls.from_single_file(str(path), config=str(folder), subfolder=name, **options)
                  for name, cls in in_file.items()}
    return pipeline.from_pretrained(folder, **absent_parts(folder), **loaded, **options, **family.pipeline_options)


@contextmanager
def _weights_the_converter_reads(keys, family: Family):
    """Diffusers' converters take each weight they need out of the file's by name: one the file lacks (a Flux.1 file
    without its biases) was a bare KeyError naming it in quotes. It is a one-line CheckpointError naming the weight."""
    try:
        yield
    except KeyError as e:
        name = e.args[0] if len(e.args) == 1 else None
        if not isinstance(name, str) or "." not in name or any(k.endswith(name) for k in keys):
            raise  # not a weight's name, or one the file holds
        raise CheckpointError(f"the weight {name} is missing: diffusers' {family.label} converter reads it, and the "
                              f"file holds no weight of that name") from None


def absent_parts(folder: Path) -> dict:
    """The parts the folder's ``model_index.json`` names as absent (``[null, null]``: our MMDiT's T5), as None: the
    pipeline's ``from_pretrained`` asks for every part it takes."""
    index = load_outside(folder / "model_index.json", "model_index.json")
    return {name: None for name, entry in (index.items() if isinstance(index, dict) else ())
            if not name.startswith("_") and isinstance(entry, list) and entry[:1] == [None]}


def load_family_file(path: Path, family: Family, parts: Path | None = None):
    """The family's pipeline (float32, CPU) from a single ``.safetensors`` file and its parts folder."""
    from .single_file import _quiet_diffusers

    if path.suffix != ".safetensors":
        raise CheckpointError(f"{path}: a {family.label} checkpoint is opened from .safetensors only")
    given = parts_folder(path, parts)
    flux_single_file_widths()  # the Flux.1 converter reads the widths from the file (models.common.diffusers_patches)
    try:
        with tempfile.TemporaryDirectory(prefix="dwb-single-file-") as tmp, _quiet_diffusers():
            if given is not None:
                check_parts_folder(given, family, str(given))
            folder = given or write_family_config_folder(Path(tmp), family)
            pipe = _from_file(path, folder, family)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a foreign file's weights
        raise CheckpointError(f"cannot load {path} as a single-file {family.label} checkpoint: {first_line(e)}") from None
    modules = {name: part for name, part in pipe.components.items() if isinstance(part, torch.nn.Module)}
    for part in modules.values():  # diffusers' single-file loader leaves a T5 it builds in training mode: its
        part.eval()                # dropout then changed every prompt's states (2.3 at most, in a tiny SD3.5)
    missing = [name for name, part in modules.items() if any(p.is_meta for p in part.parameters())]
    if missing:
        raise CheckpointError(f"{path}: the {', '.join(missing)} weights are missing or incomplete for "
                              f"{family.label}")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def describe_file(path: Path, parts: Path | None = None) -> dict:
    """Any single file, described without building a model: a newer family's here (with the parts folder named
    with it, if any), SD 1.x/2.x's by ``single_file``."""
    from .single_file import describe_single_file, newer_family

    family = newer_family(Path(path))
    return describe_family_file(Path(path), family, parts) if family is not None else describe_single_file(path)


def load_file(path: Path, parts: Path | None = None):
    """Any single file's pipeline: a newer family's through diffusers' loader (its other parts from ``parts``, else
    beside it), SD 1.x/2.x's by ``single_file``."""
    from .single_file import load_single_file, newer_family

    family = newer_family(Path(path))
    return load_family_file(Path(path), family, parts) if family is not None else load_single_file(path)
