"""Single-file checkpoints in the original Stable Diffusion layout (``.safetensors``, ``.ckpt``), SD 1.x and 2.x.

The file holds the three models under their original prefixes: ``model.diffusion_model.*`` (UNet),
``first_stage_model.*`` (VAE) and ``cond_stage_model.*`` (text tower: OpenAI CLIP ViT-L/14 in the
transformers layout for 1.x, OpenCLIP ViT-H/14 for 2.x). The file does not say which 2.x model it is:
it is read as 2.x base (512 px, epsilon) unless an original config sits beside it as ``NAME.yaml``
(AUTOMATIC1111's convention), which then gives the architecture, prediction type and sizes.

``load_single_file`` hands the file to diffusers' own single-file loader with a config folder written
in a private temporary folder from that original config (converted by diffusers' own functions),
the text tower sized from the weights and the CLIP tokenizer built from the vocabulary shipped in
the package: nothing is downloaded. ``.ckpt`` files are only ever read with
``torch.load(weights_only=True)``, which refuses any Python object but tensors and plain data.
"""
from __future__ import annotations

import contextlib
import functools
import json
import re
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import yaml

from ..common import loads_outside
from ..errors import CheckpointError, WorkbenchError, first_line
from ..readers import MAX_HEADER, read_safetensors_head
from .clip_bpe import END, VOCAB_SIZE, write_clip_tokenizer

if TYPE_CHECKING:
    from diffusers import StableDiffusionPipeline

SUFFIXES = (".safetensors", ".ckpt")
SPEC_KEY = "dwb.spec"  # the metadata entry holding the model spec of a file `dwb export` wrote
# Where a newer family's file `dwb export` wrote (no spec: its layout is the family's published one) keeps the
# generation settings it recommends, its trained size among them, as JSON
RECOMMENDED_KEY = "dwb.recommended"
UNET, VAE, TEXT = "model.diffusion_model.", "first_stage_model.", "cond_stage_model."
# A UNet's input channels: 4 latent ones (text to image), or the inpainting model's 9 (the latents, the masked
# image's latents and the mask; sd-v1-5-inpainting, 512-inpainting-ema), which the family's inpainting pipeline draws
UNET_INPUTS = (4, 9)
SD1_TEXT = "cond_stage_model.transformer.text_model."  # OpenAI CLIP, transformers' CLIPTextModel keys
SD2_TEXT = "cond_stage_model.model."  # OpenCLIP
CONFIGS = Path(__file__).parent / "configs"
DEFAULT_CONFIG = {"sd1": CONFIGS / "sd1.yaml", "sd2": CONFIGS / "sd2-base.yaml"}  # 2.x without a sidecar: base
# The text towers differ in more than sizes: activation, what pads a prompt, which layer conditions.
TEXT_TOWER = {"sd1": {"hidden_act": "quick_gelu", "pad_token": END, "embedder": "FrozenCLIPEmbedder"},
              "sd2": {"hidden_act": "gelu", "pad_token": "!", "embedder": "FrozenOpenCLIPEmbedder"}}
# The SD noise schedule (DDPM, scaled-linear betas): the one the workbench's samplers are built on.
SD_SCHEDULE = {"linear_start": 0.00085, "linear_end": 0.012, "timesteps": 1000}


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    blocked = re.search(r"unsupported GLOBAL \S+", text)  # a weights-only load naming the object it refused
    return blocked.group(0) if blocked else first_line(e)


def _ckpt_state_dict(path: Path) -> dict:
    """The weights of a ``.ckpt``, read with ``torch.load(weights_only=True)`` (no code in the file runs)."""
    from ..readers import check_inflation

    check_inflation(path)  # PyTorch's reader allocates what a member declares, before inflating it
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception as e:
        raise CheckpointError(f"cannot read {path} as plain weights (a .ckpt is opened only with a weights-only "
                              f"load): {_first_line(e)}") from None
    while isinstance(ckpt, dict) and isinstance(ckpt.get("state_dict"), dict):
        ckpt = ckpt["state_dict"]  # Lightning checkpoints nest the weights
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} holds a {type(ckpt).__name__}, not a dict of weights")
    return ckpt


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The header alone (``readers.read_safetensors_head``: each tensor's dtype, shape and byte range, checked
    against the file). Read directly: the library's ``safe_open`` and a ``get_slice`` per tensor took most of the
    door's time on a full-size single file (bench/door_cost.py)."""
    head = read_safetensors_head(path, what=f"cannot read {path}")
    return {name: tensor.shape for name, tensor in head.tensors.items()}


@functools.lru_cache(maxsize=16)
def _cached_shapes(path: str, size: int, mtime_ns: int) -> dict[str, tuple[int, ...]]:
    """One read of a header per file version: finding a checkpoint and describing it both need the keys."""
    try:
        return _safetensors_shapes(Path(path))
    except WorkbenchError as e:
        raise CheckpointError(str(e)) from None
    except (OSError, ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise CheckpointError(f"cannot read {path}: truncated or not a safetensors file ({_first_line(e)})") from None


def read_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape: the safetensors header only, or a weights-only load of a ``.ckpt``."""
    path = Path(path)
    if path.suffix == ".safetensors":
        try:
            st = path.stat()
        except OSError as e:
            raise CheckpointError(f"cannot read {path}: {_first_line(e)}") from None
        return dict(_cached_shapes(str(path), st.st_size, st.st_mtime_ns))
    return {k: tuple(v.shape) for k, v in _ckpt_state_dict(path).items() if isinstance(v, torch.Tensor)}


def _family(shapes: dict, path: Path) -> str:
    """``sd1`` or ``sd2`` from the keys, or a one-line refusal naming what the file is instead."""
    if any(k.startswith("conditioner.embedders.") for k in shapes):
        raise CheckpointError(f"{path} is an SDXL checkpoint: single files of SD 1.x and 2.x only")
    if not any(k.startswith(UNET) for k in shapes) or not any(k.startswith(VAE) for k in shapes):
        raise CheckpointError(f"{path} is not a single-file Stable Diffusion checkpoint (no {UNET}* and "
                              f"{VAE}* weights)")
    conv_in = shapes.get(UNET + "input_blocks.0.0.weight")
    if conv_in is None or conv_in[1] not in UNET_INPUTS:
        channels = "no" if conv_in is None else conv_in[1]
        raise CheckpointError(f"{path}: unknown architecture (UNet with {channels} input channels; SD 1.x/2.x have 4, "
                              "their inpainting models 9: other variants are not supported)")
    if SD1_TEXT + "embeddings.token_embedding.weight" in shapes:
        return "sd1"
    if SD2_TEXT + "token_embedding.weight" in shapes:
        return "sd2"
    raise CheckpointError(f"{path}: unknown architecture (no OpenAI CLIP or OpenCLIP text tower under {TEXT})")


def _original_config(path: Path, family: str) -> tuple[dict, Path]:
    """The original config beside the file (``NAME.yaml``), else the shipped one for the family."""
    sidecar = path.with_suffix(".yaml")
    source = sidecar if sidecar.is_file() else DEFAULT_CONFIG[family]
    try:
        # libyaml's safe loader when built with it: the same documents, a tenth of the time
        config = yaml.load(source.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        params = config["model"]["params"]
        for part, keys in (("unet_config", ("params", "model_channels")),
                           ("first_stage_config", ("params", "ddconfig", "ch")), ("cond_stage_config", ("target",))):
            functools.reduce(lambda node, key: node[key], keys, params[part])
    except (yaml.YAMLError, TypeError, KeyError, OSError) as e:
        raise CheckpointError(f"{source} is not an original Stable Diffusion config (model.params: "
                              f"{type(e).__name__} {_first_line(e)})") from None
    embedder = str(params["cond_stage_config"]["target"]).rsplit(".", 1)[-1]
    if embedder != TEXT_TOWER[family]["embedder"]:
        raise CheckpointError(f"{source} describes a {embedder} text tower but {path.name} holds "
                              f"{TEXT_TOWER[family]['embedder']}'s weights (SD {family[-1]}.x)")
    schedule = {k: params.get(k, v) for k, v in SD_SCHEDULE.items()}
    if schedule != SD_SCHEDULE:
        raise CheckpointError(f"{source}: noise schedule {schedule} is not Stable Diffusion's {SD_SCHEDULE}")
    return config, source


def _resolution(family: str, params: dict) -> int:
    """Pixels: the config's latent ``image_size`` times the VAE's downsampling.

    The released 2.x v configs say 64 latents for their 768 px models (SD 2.0-v, 2.1), so a 2.x v
    config saying 512 px at the full VAE's factor 8 is read as 768 px.
    """
    factor = 2 ** (len(params["first_stage_config"]["params"]["ddconfig"]["ch_mult"]) - 1)
    pixels = int(params.get("image_size", 64)) * factor
    if family == "sd2" and params.get("parameterization") == "v" and (pixels, factor) == (512, 8):
        return 768
    return pixels


def _about(family: str, config: dict, source: Path) -> dict:
    params = config["model"]["params"]
    v = params.get("parameterization") == "v"
    architecture = "sd1" if family == "sd1" else ("sd2-v" if v else "sd2-base")
    return {"architecture": architecture, "resolution": _resolution(family, params),
            "prediction_type": "v_prediction" if v else "epsilon", "original_config": str(source)}


def is_single_file(path: Path) -> bool:
    """A ``.safetensors``/``.ckpt`` file whose weights are in the original SD layout, or a family's own (a Flux.1
    transformer alone, without the ``model.diffusion_model.`` prefix): reads only the keys."""
    from ..families import family_of_keys

    path = Path(path)
    if path.suffix not in SUFFIXES or not path.is_file():
        return False
    try:
        shapes = read_shapes(path)
    except CheckpointError:
        return False
    return any(k.startswith(UNET) for k in shapes) or family_of_keys(shapes) is not None


def embedded_spec(path: Path) -> dict | None:
    """The model spec ``dwb export`` keeps in a ``.safetensors`` file's metadata (``SPEC_KEY``), if any: every
    config exactly (GroupNorm groups and a run's own tokenizer too, which an original config cannot say)."""
    if path.suffix != ".safetensors":
        return None
    try:
        metadata = read_safetensors_head(path, what=f"cannot read {path}'s metadata").metadata
    except WorkbenchError as e:
        raise CheckpointError(str(e)) from None
    if SPEC_KEY not in metadata:
        return None
    try:
        spec = loads_outside(metadata[SPEC_KEY], f"its {SPEC_KEY} metadata", max_bytes=MAX_HEADER)
    except (OSError, ValueError, UnicodeDecodeError, TypeError, AttributeError, WorkbenchError) as e:
        raise CheckpointError(f"cannot read {path}'s metadata: {_first_line(e)}") from None
    from .spec import SPEC_FORMAT  # with the tokenizer files it reads: imported only for a file that has a spec

    if not (isinstance(spec, dict) and spec.get("format") == SPEC_FORMAT):
        raise CheckpointError(f"{path}: its {SPEC_KEY} metadata is not a {SPEC_FORMAT} model spec")
    return spec


def exported_recommended(path: Path):
    """The recommended settings a newer family's exported file keeps in its metadata (``RECOMMENDED_KEY``), as
    read (None where it keeps none): checked by the caller as any checkpoint's are."""
    if path.suffix != ".safetensors":
        return None
    try:
        metadata = read_safetensors_head(path, what=f"cannot read {path}'s metadata").metadata
        text = metadata.get(RECOMMENDED_KEY)
        return None if text is None else loads_outside(text, f"its {RECOMMENDED_KEY} metadata", max_bytes=MAX_HEADER)
    except WorkbenchError as e:
        raise CheckpointError(str(e)) from None


def _inspect(path: Path) -> tuple[dict, str, dict | None, dict]:
    """(tensor shapes, family, original config, description) of a single file, or a one-line refusal. A file
    ``dwb export`` wrote is described by the spec in its metadata (the description's ``spec``)."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    shapes = read_shapes(path)
    family = _family(shapes, path)
    spec = embedded_spec(path)
    if spec is not None:
        return shapes, family, None, {"architecture": spec["architecture"], "resolution": spec["resolution"],
                                      "prediction_type": spec["prediction_type"],
                                      "original_config": f"{path.name}'s {SPEC_KEY} metadata", "spec": spec}
    config, source = _original_config(path, family)
    return shapes, family, config, _about(family, config, source)


def newer_family(path: Path):
    """The family of a file whose weights show one this room's key maps do not read (SDXL, SD3, Flux.1), or None."""
    from ..families import family_of_keys

    family = family_of_keys(read_shapes(path)) if Path(path).is_file() else None
    return family if family is not None and not family.original_sd_layout else None


def describe_single_file(path: Path) -> dict:
    """``architecture`` (sd1, sd2-base, sd2-v, or an exported spec's), ``resolution``, ``prediction_type`` and the
    ``original_config`` it was read with, from the keys and the config alone (no model is built)."""
    return {k: v for k, v in _inspect(Path(path))[3].items() if k != "spec"}


def _count(shapes: dict, prefix: str) -> int:
    return len({k[len(prefix):].split(".")[0] for k in shapes if k.startswith(prefix)})


def text_tower_config(shapes: dict, family: str, config: dict) -> dict:
    """The ``CLIPTextConfig`` of the file's text tower, sized from its weights.

    Heads are 64 wide in both towers (ViT-L/14: 768 / 12, ViT-H/14: 1024 / 16). SD 2.x conditions on
    OpenCLIP's penultimate layer (``layer: penultimate``), so its last block is in the file but not used.
    """
    if family == "sd1":
        vocab, width = shapes[SD1_TEXT + "embeddings.token_embedding.weight"]
        positions = shapes[SD1_TEXT + "embeddings.position_embedding.weight"][0]
        layers = _count(shapes, SD1_TEXT + "encoder.layers.")
        mlp = shapes[SD1_TEXT + "encoder.layers.0.mlp.fc1.weight"][0]
    else:
        vocab, width = shapes[SD2_TEXT + "token_embedding.weight"]
        positions = shapes[SD2_TEXT + "positional_embedding"][0]
        layer = (config["model"]["params"]["cond_stage_config"].get("params") or {}).get("layer", "last")
        layers = _count(shapes, SD2_TEXT + "transformer.resblocks.") - (layer == "penultimate")
        mlp = shapes[SD2_TEXT + "transformer.resblocks.0.mlp.c_fc.weight"][0]
    if vocab != VOCAB_SIZE:
        raise CheckpointError(f"the text tower has {vocab} token embeddings; the CLIP vocabulary of SD 1.x/2.x "
                              f"has {VOCAB_SIZE}")
    return {"vocab_size": vocab, "hidden_size": width, "intermediate_size": mlp, "num_hidden_layers": layers,
            "num_attention_heads": max(1, width // 64), "max_position_embeddings": positions,
            "projection_dim": width, "hidden_act": TEXT_TOWER[family]["hidden_act"]}


def _write_json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def write_config_folder(folder: Path, shapes: dict, family: str, config: dict, about: dict, scheduler) -> Path:
    """A diffusers pipeline folder without weights, the ``config`` diffusers' single-file loader reads."""
    from diffusers.loaders.single_file_utils import (create_unet_diffusers_config_from_ldm,
                                                     create_vae_diffusers_config_from_ldm)
    from transformers import CLIPTextConfig

    resolution = about["resolution"]
    # diffusers' conversions guess the image size from the weights; the config's size is set after
    unet = create_unet_diffusers_config_from_ldm(config, {})
    vae = create_vae_diffusers_config_from_ldm(config, {})
    unet["sample_size"] = resolution // 2 ** (len(vae["block_out_channels"]) - 1)
    # the weights say what the UNet takes: an inpainting model's 9 channels where a config from elsewhere (or the
    # shipped one, without a sidecar) says 4
    conv_in = shapes.get(UNET + "input_blocks.0.0.weight")
    if conv_in is not None:
        unet["in_channels"] = conv_in[1]
    vae["sample_size"] = resolution
    _write_json(folder / "unet" / "config.json", {"_class_name": "UNet2DConditionModel", **unet})
    _write_json(folder / "vae" / "config.json", {"_class_name": "AutoencoderKL", **vae})
    text = CLIPTextConfig(**text_tower_config(shapes, family, config))
    text.architectures = ["CLIPTextModel"]
    text.save_pretrained(folder / "text_encoder")
    write_clip_tokenizer(folder / "tokenizer", pad_token=TEXT_TOWER[family]["pad_token"],
                         max_length=text.max_position_embeddings)
    _write_json(folder / "model_index.json", _model_index(scheduler))
    return folder


def write_spec_folder(folder: Path, spec: dict, scheduler) -> Path:
    """A diffusers pipeline folder without weights from a model spec: its configs and tokenizer files as they are."""
    from transformers import CLIPTextConfig

    _write_json(folder / "unet" / "config.json", {"_class_name": "UNet2DConditionModel", **spec["unet"]})
    _write_json(folder / "vae" / "config.json", {"_class_name": "AutoencoderKL", **spec["vae"]})
    text = CLIPTextConfig.from_dict(spec["text_encoder"])
    text.architectures = ["CLIPTextModel"]
    text.save_pretrained(folder / "text_encoder")
    (folder / "tokenizer").mkdir(parents=True, exist_ok=True)
    for name, content in spec["tokenizer"].items():
        (folder / "tokenizer" / Path(name).name).write_text(content)
    scheduler.save_pretrained(folder / "scheduler")
    _write_json(folder / "model_index.json", _model_index(scheduler))
    return folder


def _model_index(scheduler) -> dict:
    return {"_class_name": "StableDiffusionPipeline", "requires_safety_checker": False,
            "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"],
            "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
            "scheduler": ["diffusers", type(scheduler).__name__], "safety_checker": [None, None],
            "feature_extractor": [None, None]}


def _missing_weights(pipe) -> list[str]:
    """Parts with parameters the file did not fill (diffusers leaves them on the meta device)."""
    parts = {"UNet": pipe.unet, "VAE": pipe.vae, "text encoder": pipe.text_encoder}
    return [name for name, module in parts.items() if any(p.is_meta for p in module.parameters())]


@contextlib.contextmanager
def no_loading_bars():
    """No progress bar while diffusers loads a pipeline's parts (and transformers its text encoders' shards): every
    folder load printed diffusers' "Loading pipeline components" bar between a command's own lines. Each library's
    setting is put back as it was."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    on = [lib for lib in (diffusers_logging, transformers_logging) if lib.is_progress_bar_enabled()]
    for lib in on:
        lib.disable_progress_bar()
    try:
        yield
    finally:
        for lib in on:
            lib.enable_progress_bar()


@contextlib.contextmanager
def _quiet_diffusers():
    """No progress bar or notes from diffusers' loader: its note on unused keys (the OpenCLIP block SD 2.x
    does not use) is expected, and the caller reports what matters in one line."""
    from diffusers.utils import logging as diffusers_logging

    verbosity = diffusers_logging.get_verbosity()
    diffusers_logging.set_verbosity_error()
    try:
        with no_loading_bars():
            yield
    finally:
        diffusers_logging.set_verbosity(verbosity)


def load_single_file(path: Path) -> StableDiffusionPipeline:
    """A ``StableDiffusionPipeline`` (float32, CPU, no safety checker) from a single-file checkpoint.

    Sampler: the workbench's default over the SD noise schedule (``schedules.inference_scheduler``).
    """
    from diffusers import StableDiffusionPipeline

    from ..families import check_part_config
    from .schedules import inference_scheduler  # diffusers' schedulers: imported when a file is opened, not listed

    path = Path(path)
    shapes, family, config, about = _inspect(path)
    config_name = Path(about["original_config"]).name
    scheduler = inference_scheduler(about["prediction_type"])
    try:
        with tempfile.TemporaryDirectory(prefix="dwb-single-file-") as folder, _quiet_diffusers():
            if "spec" in about:
                write_spec_folder(Path(folder), about["spec"], scheduler)
                for name in ("unet", "vae", "text_encoder"):  # each number that sizes them held before any is built
                    check_part_config(_model_index(scheduler)[name][1], about["spec"][name],
                                      f"its dwb.spec metadata's {name} config")
            else:
                write_config_folder(Path(folder), shapes, family, config, about, scheduler)
            pipe = StableDiffusionPipeline.from_single_file(
                str(path), config=folder, local_files_only=True, torch_dtype=torch.float32, scheduler=scheduler,
                safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None
    except Exception as e:
        raise CheckpointError(f"cannot load {path} as a single-file {about['architecture']} checkpoint "
                              f"(config {config_name}): {_first_line(e)}") from None
    missing = _missing_weights(pipe)
    if missing:
        raise CheckpointError(f"{path}: the {', '.join(missing)} weights are missing or incomplete "
                              f"for the {about['architecture']} architecture of {config_name}")
    pipe.set_progress_bar_config(disable=True)
    return pipe
