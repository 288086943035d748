"""`dwb export` to one original-layout ``.safetensors`` file: what AUTOMATIC1111, ComfyUI and Forge load.

The file holds the UNet, VAE and text tower under the original names (``original_layout``), in float32 or
float16 (``half``), and in its metadata the model spec (``single_file.SPEC_KEY``: every config and the
tokenizer's files, so `dwb` reopens it exactly, the tiny model's too). Beside it, ``NAME.yaml`` is the
original config AUTOMATIC1111 reads for an SD 2.x file (sizes, ``parameterization: v``, the latent scale),
and ``NAME.config/`` the diffusers configs and tokenizer (no weights) that diffusers' single-file loader
takes as ``config=`` offline: an original config cannot say the tiny model's 8 GroupNorm groups or its
fitted tokenizer.

Written one tensor at a time (the safetensors layout: 8 bytes of header length, the JSON header, then
each tensor's bytes in order), so the export holds the checkpoint's memory-mapped weights and one
converted tensor, never a second copy of the model. Never a pickle: a ``.ckpt`` name is refused.

SDXL, SD3/3.5 and Flux.1 go to their own published layouts (``family_export``), with ``NAME.config/`` where the
file needs one and no ``NAME.yaml``, written by the same writer, all or nothing.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml

from ..common import disk_full_error, is_disk_full
from ..errors import WorkbenchError
from ..families import family_named
from ..checkpoints import (RECOMMENDED_KEY, SPEC_KEY, Checkpoint, describe, find_checkpoint, recommended_settings,
                           write_recommended)
from .original_layout import Entry, original_config, original_entries

FORMATS = ("diffusers", "single-file")
DTYPE_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
               torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}
ALIGN = 8  # the safetensors header is padded so the tensors start on an 8-byte boundary


def export_format(out: str | Path, fmt: str | None) -> str:
    """``single-file`` for a ``.safetensors`` name (or when asked), ``diffusers`` (a folder) otherwise."""
    suffix = Path(out).suffix.lower()
    if suffix in (".ckpt", ".pt", ".pth", ".bin"):
        raise WorkbenchError(f"{out}: exports are safetensors only (a {suffix} file is a pickle, which runs code "
                             "when loaded); name it .safetensors")
    if fmt is None:
        return "single-file" if suffix == ".safetensors" else "diffusers"
    if fmt == "single-file" and suffix != ".safetensors":
        raise WorkbenchError(f"{out}: a single-file export is named NAME.safetensors")
    if fmt == "diffusers" and suffix == ".safetensors":
        raise WorkbenchError(f"{out}: a diffusers export is a folder; a .safetensors name is a single file")
    return fmt


def spec_and_weights(ckpt: Checkpoint, ema: bool, settings: dict | None) -> tuple[dict, dict]:
    """The model spec and the ``unet.``/``vae.``/``text_encoder.`` weights in diffusers' names. A Composer
    checkpoint's come straight from the file (memory-mapped); other kinds are opened as a pipeline."""
    if ckpt.kind in ("composer", "mosaicml"):
        from ..checkpoints import model_weights, read_checkpoint

        data = read_checkpoint(ckpt.path, settings)
        return data["spec"], model_weights(data, ema=ema)
    from ..checkpoints import load_pipeline
    from ..checkpoints import make_spec

    info = describe(ckpt)
    pipe = load_pipeline(ckpt, ema=ema, settings=settings)
    model = SimpleNamespace(denoiser=pipe.unet, vae=pipe.vae, text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer,
                            prediction_type=pipe.scheduler.config.get("prediction_type", "epsilon"))
    spec = make_spec(model, info.architecture or ckpt.kind, info.resolution)
    weights = {f"{part}.{k}": v for part in ("unet", "vae", "text_encoder")
               for k, v in getattr(pipe, part).state_dict().items()}
    return spec, weights


def _out_dtype(tensor_dtype: torch.dtype, half: bool) -> torch.dtype:
    if not tensor_dtype.is_floating_point:
        return tensor_dtype
    return torch.float16 if half else torch.float32


def _header(entries: list[Entry], half: bool, metadata: dict[str, str]) -> bytes:
    header, offset = {"__metadata__": metadata}, 0
    for entry in entries:
        dtype = _out_dtype(entry.dtype, half)
        size = dtype.itemsize * int(torch.Size(entry.shape).numel())
        header[entry.name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(entry.shape),
                              "data_offsets": [offset, offset + size]}
        offset += size
    data = json.dumps(header, separators=(",", ":")).encode()
    return data + b" " * (-len(data) % ALIGN)


def write_safetensors(path: Path, entries: list[Entry], half: bool, metadata: dict[str, str]) -> None:
    """A safetensors file written tensor by tensor, each made, converted and written, then let go."""
    header = _header(entries, half, metadata)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for entry in entries:
            tensor = entry.make().detach().to("cpu", _out_dtype(entry.dtype, half)).contiguous()
            if tuple(tensor.shape) != entry.shape:
                raise WorkbenchError(f"{entry.name}: made with shape {tuple(tensor.shape)}, not {entry.shape}")
            f.write(tensor.reshape(-1).view(torch.uint8).numpy().data)


def config_folder(out: Path) -> Path:
    """``NAME.config/`` beside ``NAME.safetensors``: the diffusers configs and tokenizer, no weights."""
    return out.with_name(out.stem + ".config")


def export_single_file(ref: str | Path | Checkpoint, out: str | Path, *, ema: bool = False, half: bool = False,
                       settings: dict | None = None, recommended: dict | None = None) -> Path:
    """`dwb export CKPT OUT.safetensors`: the original layout, its spec in the metadata; beside it ``OUT.yaml``
    (the original config) and ``OUT.config/`` (what ``from_single_file(OUT, config=OUT.config)`` reads offline).
    All three are written, or none: each under a temporary name, renamed into place at the end. ``recommended``:
    the generation settings the spec carries (``recommended``), over the checkpoint's own."""
    from ..checkpoints import inference_scheduler
    from ..checkpoints import write_spec_folder

    out = Path(out)
    outputs = [out, out.with_suffix(".yaml"), config_folder(out)]
    refuse_taken(outputs)  # NAME.yaml too for every family: AUTOMATIC1111 would read the file with it
    ckpt = ref if isinstance(ref, Checkpoint) else find_checkpoint(ref)
    refuse_refiner_file(ckpt)
    carried = exported_settings(ckpt, recommended)
    family = family_of_checkpoint(ckpt)
    if family is not None and not family.original_sd_layout:
        return export_family_file(ckpt, family, out, ema=ema, half=half, settings=settings, recommended=carried)
    spec, weights = spec_and_weights(ckpt, ema, settings)
    spec = {**{k: v for k, v in spec.items() if k != "recommended"}, **({"recommended": carried} if carried else {})}
    entries = original_entries(weights, spec)
    metadata = {"format": "pt", SPEC_KEY: json.dumps(spec), "dwb.source": ckpt.label,
                "dwb.weights": exported_weights(ckpt, ema), "dwb.dtype": "float16" if half else "float32"}
    out.parent.mkdir(parents=True, exist_ok=True)
    with all_or_nothing(outputs) as (weights_file, yaml_file, folder):
        write_safetensors(weights_file, entries, half, metadata)
        yaml_file.write_text(yaml.safe_dump(original_config(spec), sort_keys=False))
        write_spec_folder(folder, spec, inference_scheduler(spec["prediction_type"]))
    return out


def exported_settings(ckpt: Checkpoint, recommended: dict | None) -> dict:
    """The generation settings an export carries, checked before anything is written: the size the checkpoint was
    trained at (where it records one a command draws at: a tiny Flux.1-style model's 32 px, which its family's
    pipeline would otherwise draw at 512), the checkpoint's own recommended settings over it, ``recommended``
    (`--settings`) over both."""
    from ..generation import side_problem

    trained = describe(ckpt).resolution
    size = {"size": trained} if trained is not None and side_problem(trained) is None else {}
    return {**size, **recommended_settings(ckpt), **(recommended or {})}


def refuse_refiner_file(ckpt: Checkpoint) -> None:
    """A refiner's single file is not written (nor opened) yet: one line naming the folder export that is."""
    from ..checkpoints import is_refiner

    if is_refiner(ckpt):
        raise WorkbenchError(f"{ckpt.label} is a refiner, whose single file is not written yet: export it as a "
                             "diffusers folder (dwb export REFINER FOLDER), which --refiner and the app open")


def exported_weights(ckpt: Checkpoint, ema: bool) -> str:
    """Which weights an export holds, as the images' records say it: "ema" or "raw" of a Composer checkpoint,
    "stored" (the one set) of the kinds that hold one (``models.generation.weights_to_use``)."""
    from ..generation import weights_to_use

    return weights_to_use("ema" if ema else "raw", describe(ckpt).has_ema)


def single_file_readers(out: Path) -> str:
    """Which tools load a single file `dwb export` wrote, and diffusers' call for it, as the command says them: a file
    of the denoiser alone (Flux.1's, as Black Forest Labs publish it) goes to ComfyUI's and Forge's diffusion-model
    loaders and to the denoiser class's ``from_single_file`` (AUTOMATIC1111 and the pipeline's ``from_single_file``
    read no such file; diffusers 0.39 splits Flux.1's fused weights at the published width, which `dwb` reads from
    the file: ``models.common.diffusers_patches``); any other to AUTOMATIC1111, ComfyUI, Forge and the pipeline's
    ``from_single_file``."""
    from ..readers import read_safetensors_head

    out, config = Path(out), config_folder(Path(out))
    name = read_safetensors_head(out, what=f"cannot read {out}").metadata.get("dwb.family")
    family = family_named(name) if name else None
    beside = f", config='{config}'" if config.exists() else ""
    if family is not None and family.single_file.in_file == (family.denoiser,):
        denoiser = family.variants[0].parts[family.denoiser].cls
        return (f"the {family.denoiser} alone: ComfyUI's and Forge's diffusion-model loaders, with its other parts "
                f"from {config.name}/; diffusers' {family.pipeline}.from_pretrained('{config}', {family.denoiser}="
                f"{denoiser}.from_single_file('{out}'{beside}, subfolder='{family.denoiser}')) at {family.label}'s "
                f"published width, dwb sample {out} at any)")
    pipeline = family.pipeline if family is not None else "StableDiffusionPipeline"
    return f"AUTOMATIC1111, ComfyUI, Forge; diffusers' {pipeline}.from_single_file('{out}'{beside})"


def family_of_checkpoint(ckpt: Checkpoint):
    """The checkpoint's family (``models.families``), or None where it names none (this workbench's own SD 2-like
    Composer checkpoints, mosaicml/diffusion's): read without loading any weights."""
    if ckpt.kind in ("composer", "mosaicml"):
        from ..checkpoints import read_summary

        name = read_summary(ckpt.path)["spec"].get("family")
    else:
        name = describe(ckpt).family
    return family_named(name) if name else None


def export_family_file(ckpt: Checkpoint, family, out: Path, *, ema: bool, half: bool, settings: dict | None,
                       recommended: dict) -> Path:
    """A newer family's published single file (``family_export``) and, where it needs one, ``NAME.config/`` beside
    it; both or neither. Every tensor's name is found before anything is written."""
    from .family_export import family_entries, layout_of, needs_config_folder, write_config_folder
    from ..checkpoints import load_pipeline

    layout_of(family)  # a family whose layout is not written is refused before its weights are read
    pipe = load_pipeline(ckpt, ema=ema, settings=settings)
    entries = family_entries(pipe, family)
    metadata = {"format": "pt", "dwb.source": ckpt.label, "dwb.family": family.name,
                "dwb.weights": exported_weights(ckpt, ema), "dwb.dtype": "float16" if half else "float32",
                **({RECOMMENDED_KEY: json.dumps(recommended, sort_keys=True)} if recommended else {})}
    outputs = [out, config_folder(out)] if needs_config_folder(pipe, family) else [out]
    out.parent.mkdir(parents=True, exist_ok=True)
    with all_or_nothing(outputs) as written:
        write_safetensors(written[0], entries, half, metadata)
        if len(written) > 1:
            write_config_folder(written[1], pipe, family, half)
    return out


def refuse_taken(paths: list[Path]) -> None:
    """A one-line WorkbenchError for the first path something is at: a file, a folder, or a link, dangling or not
    (a dangling ``NAME.config`` link passed an ``exists()`` check and left a half-written export behind)."""
    for path in paths:
        if os.path.lexists(path):
            what = "a link" if path.is_symlink() else "a folder" if path.is_dir() else "a file"
            raise WorkbenchError(f"{path} exists ({what}): remove it or choose another name")


@contextlib.contextmanager
def all_or_nothing(paths: list[Path]) -> Iterator[list[Path]]:
    """Temporary names beside ``paths`` to write to; at the end of the block each is renamed into its place, all of
    them or none: on any error (a full disk, a place taken meanwhile) what was written or renamed is removed."""
    temps = [p.with_name(f".{p.name}.{os.getpid()}.partial") for p in paths]
    placed: list[Path] = []
    try:
        yield temps
        refuse_taken(paths)  # again, just before: nothing is written over what appeared meanwhile
        for tmp, path in zip(temps, paths):
            os.rename(tmp, path)
            placed.append(path)
    except BaseException as e:
        for path in [*placed, *temps]:
            _remove(path)
        if is_disk_full(e):
            raise disk_full_error(paths[0].parent, ", ".join(p.name for p in paths), e) from None
        raise


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def card_spec(ckpt: Checkpoint, settings: dict | None) -> tuple[dict, dict | None]:
    """(spec, timestamp) for the model card: a Composer checkpoint's own (its training section too), the
    description of any other kind."""
    if ckpt.kind in ("composer", "mosaicml"):
        from ..checkpoints import read_checkpoint

        data = read_checkpoint(ckpt.path, settings)
        return data["spec"], data["timestamp"]
    from ..checkpoints import is_refiner

    info = describe(ckpt)
    return {"architecture": info.architecture or ckpt.kind, "prediction_type": info.prediction_type,
            "resolution": info.resolution, "vae": {}, "refiner": is_refiner(ckpt)}, None


def export_checkpoint(ref: str | Path, out: str | Path, *, fmt: str | None = None, ema: bool = False,
                      half: bool = False, settings: dict | None = None, results: list[Path] = (),
                      studies: list[Path] = (), recommended: dict | None = None) -> tuple[Path, str]:
    """`dwb export`: (what was written, its format). A folder gets a model card (``README.md``) with the scores
    of ``results`` (evaluate results stores) and ``studies`` (human-eval study folders) for this checkpoint.
    Both carry the checkpoint's recommended generation settings, ``recommended`` over them (``recommended``): a
    single file in its spec metadata, a folder in ``recommended_settings.json``."""
    from ..checkpoints import content_hash
    from .model_card import model_card_text
    from ..checkpoints import export_pipeline

    fmt = export_format(out, fmt)
    ckpt = find_checkpoint(ref)
    if fmt == "single-file":
        if results or studies:
            raise WorkbenchError("--results and --study go into a folder export's model card; a single file has none")
        return export_single_file(ckpt, out, ema=ema, half=half, settings=settings, recommended=recommended), fmt
    carried = exported_settings(ckpt, recommended)  # checked before the export is written
    spec, timestamp = card_spec(ckpt, settings)
    weights = {"ema": "EMA", "raw": "raw", "stored": "stored"}[exported_weights(ckpt, ema)]
    readme = model_card_text(spec, label=ckpt.label, checkpoint_hash=content_hash(ckpt), weights=weights,
                             timestamp=timestamp, results=list(results), studies=list(studies))
    folder = export_pipeline(ckpt, out, ema=ema, half=half, settings=settings, readme=readme)
    write_recommended(folder, carried)
    return folder, fmt
