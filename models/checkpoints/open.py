"""Opening a found checkpoint: a ready ``StableDiffusionPipeline``, a description without the weights, an export.

Nothing here writes outside a private temporary folder or runs code from the file: Composer files are
read with ``weights_only=True``, tokenizer files and a folder's ``model_index.json`` are checked before use
(``tokenizer_files``), diffusers and transformers read ``.bin`` weights with ``weights_only=True`` too, and
single files go through ``single_file`` (weights-only for ``.ckpt``).
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CheckpointError, WorkbenchError, first_line
from ..common import load_outside, whole_folder
from ..families import check_part_config, family_of_folder, family_or_ours
from ..generation import DEFAULT_WEIGHTS, drawn_native_side, native_size, weights_to_use
from .composer import has_ema, model_weights, read_checkpoint, read_summary
from .find import Checkpoint, find_checkpoint
from .memory import MemoryPlan, counted_part, folder_parts, part_sizes, plan_memory
from ..readers import check_pipeline_folder, tokenizer_from_files


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint is, read without loading its weights into models."""

    kind: str
    resolution: int | None  # the training resolution (Composer) or the UNet's native size
    has_ema: bool | None  # None where the file holds one set of weights (diffusers, single file, hub)
    architecture: str | None = None
    prediction_type: str | None = None
    family: str | None = None  # models.families' name, where it is known without loading the weights


FULL_SIZE_VAE_SCALE = 8  # every family's full-size VAE halves the side three times


def describe(ckpt: Checkpoint) -> CheckpointInfo:
    """What a checkpoint is, its recorded native size held to what its family's configs may give
    (``Family.recorded_side``): one line naming the checkpoint and the key otherwise."""
    if ckpt.kind in ("composer", "mosaicml"):
        data = read_summary(ckpt.path)  # the pickle alone: no weights are read
        spec = data["spec"]
        resolution = family_or_ours(spec.get("family")).recorded_side(spec.get("resolution"),
                                                                      f"{ckpt.label}: its spec's resolution")
        return CheckpointInfo(ckpt.kind, resolution, has_ema(data), spec.get("architecture"),
                              spec.get("prediction_type"), spec.get("family"))
    if ckpt.kind == "single-file":
        from .family_single_file import describe_file

        d = describe_file(ckpt.path, ckpt.parts)
        resolution = family_or_ours(d.get("family")).recorded_side(d.get("resolution"),
                                                                   f"{ckpt.label}: its recorded resolution")
        return CheckpointInfo(ckpt.kind, resolution, None, d.get("architecture"), d.get("prediction_type"),
                              d.get("family"))
    return _describe_folder(ckpt)


def _describe_folder(ckpt: Checkpoint) -> CheckpointInfo:
    """A diffusers folder described from its configs, their sizes held first (``models.families.check_part_config``):
    its native size is its denoiser's sample size (Flux.1's: the family's) times its VAE's scale."""
    family = family_of_folder(ckpt.path, ckpt.label)
    parts = family.variants[0].parts
    try:
        denoiser, vae, scheduler = (load_outside(ckpt.path / name, name) for name in (
            f"{family.denoiser}/config.json", "vae/config.json", "scheduler/scheduler_config.json"))
        for name, config in ((family.denoiser, denoiser), ("vae", vae)):
            check_part_config(parts[name].cls, config, f"{ckpt.label}: {name}/config.json")
        vae_scale = 2 ** (len(vae["block_out_channels"]) - 1)
        # Flux.1's transformer records no sample size: its pipeline draws at the family's native latent side
        resolution = int(denoiser.get("sample_size") or family.native_size // FULL_SIZE_VAE_SCALE) * vae_scale
        prediction_type = "flow" if family.schedule == "flow" else scheduler.get("prediction_type", "epsilon")
    except CheckpointError:
        raise
    except WorkbenchError as e:
        raise CheckpointError(f"{ckpt.label}: {e}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{ckpt.label}: unreadable {family.denoiser}/vae/scheduler config "
                              f"({type(e).__name__}: {e})") from None
    resolution = family.recorded_side(resolution, f"{ckpt.label}: the native size its {family.denoiser} and vae "
                                                  f"configs give")
    return CheckpointInfo(ckpt.kind, resolution, None, None, prediction_type, family.name)


def weights_of(ckpt: Checkpoint, choice: str = DEFAULT_WEIGHTS) -> str:
    """Which weights a choice among "auto", "ema", "raw" opens: "ema" or "raw" of a Composer checkpoint ("auto":
    EMA where it holds EMA weights), "stored" for the kinds that hold one set (``models.generation.weights_to_use``)."""
    return weights_to_use(choice, describe(ckpt).has_ema)


def native_size_of(ckpt: Checkpoint, pipe) -> int:
    """A checkpoint's native image side as a command draws at it: the resolution it was trained at where it records
    one (a Composer checkpoint's spec), else its UNet's sample size in pixels (``models.generation.native_size``);
    one line where it is no side `--size` takes (``models.generation.drawn_native_side``)."""
    return drawn_native_side(describe(ckpt).resolution or native_size(pipe), ckpt.label)


def _load_module(module: torch.nn.Module, weights: dict, prefix: str, where) -> None:
    """``module`` (built without weights: see ``pipeline_from_composer``) takes a copy of the checkpoint's tensors,
    floating ones as float32: memory of its own, not pages of the file, which training may replace or delete."""
    sub = {k[len(prefix):]: v.to(torch.float32 if v.is_floating_point() else v.dtype, copy=True)
           for k, v in weights.items() if k.startswith(prefix)}
    try:
        module.load_state_dict(sub, strict=True, assign=True)
    except RuntimeError as e:
        raise CheckpointError(f"{where}: the {prefix.rstrip('.')} weights do not match the model spec "
                              f"({state_dict_problem(e)})") from None


def state_dict_problem(e: RuntimeError, limit: int = 300) -> str:
    """What ``load_state_dict`` refused, keys included: its first line only says "Error(s) in loading
    state_dict for CLIPTextModel:", the keys follow on the next lines."""
    lines = [" ".join(line.split()) for line in str(e).strip().splitlines()[1:] if line.strip()]
    text = "; ".join(lines) or first_line(e)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def pipeline_from_composer(path: str | Path, ema: bool = False, settings: dict | None = None):
    """A Composer checkpoint (this project's, or mosaicml/diffusion's) rebuilt from its spec and weights;
    ``settings`` (``prediction_type``, ``latent_scale``) say what a mosaicml/diffusion file does not."""
    import transformers

    from .components import assemble_pipeline, with_max_length  # diffusers' classes: imported when one is opened

    ckpt = read_checkpoint(path, settings)
    spec = ckpt["spec"]
    _refuse_adapter_alone(spec, path)
    family = family_or_ours(spec.get("family"))
    weights = model_weights(ckpt, ema=ema)
    _spec_memory_plan(spec, family, weights, path)
    parts = _spec_built(lambda s: _spec_parts(s, family), spec, path)
    for name, module in parts.items():
        _load_module(module, weights, name + ".", path)
        module.eval()
    tokenizer = tokenizer_from_files(spec["tokenizer"], where=str(path))
    # the second tower's own tokenizer, as the run that trained it read it (its files in the spec, where it had one);
    # without, the second tower read the first tokenizer's ids (the tiny architectures) and one tokenizer fills both
    tokenizer_2 = tokenizer_from_files(spec.get("tokenizer_2") or {}, where=str(path),
                                       cls=getattr(transformers, family.second_tokenizer))
    tokenizer_2 = tokenizer if tokenizer_2 is None else tokenizer_2
    tokenizers = {"tokenizer": tokenizer, "tokenizer_2": tokenizer_2}
    if family.third_tokenizer and spec.get("tokenizer_3"):  # SD3's T5 tokenizer
        tokenizers["tokenizer_3"] = tokenizer_from_files(spec["tokenizer_3"], where=str(path),
                                                         cls=getattr(transformers, family.third_tokenizer))
    counted = family.text_length_tokenizer
    if spec.get("text_tokens") and counted in tokenizers:  # the T5 tokens it trained with, read off its tokenizer
        tokenizers[counted] = with_max_length(tokenizers[counted], int(spec["text_tokens"]))
    return _spec_built(lambda s: assemble_pipeline(family, parts, tokenizers, family.assembly.spec_settings(s)), spec,
                       path)


def _refuse_adapter_alone(spec: dict, path) -> None:
    """A run with an ``adapter:`` section saves the adapter alone, not a model to draw with: one line that says how
    its adapter is drawn (on the base it names, as a file) instead of a count of the weights it lacks."""
    adapter = spec.get("adapter")
    if isinstance(adapter, dict):
        raise CheckpointError(f"{Path(path).name} holds a {adapter.get('type', 'lora')} adapter alone, not a whole "
                              f"model: write it as a file with `dwb export {Path(path).name} ADAPTER.safetensors "
                              "--layout kohya|diffusers|peft` and draw it with --lora on the base its run started from "
                              "(model.init_from; docs/adapters.md)")


def _spec_memory_plan(spec: dict, family, weights: dict, path) -> MemoryPlan:
    """The parts a spec's configs build, counted on the meta device against the checkpoint's weights before any is
    built (``memory.counted_part``: sizes held, no weight made up), planned in float32 on this machine, where they
    are built and their buffers made."""
    sizes = {}
    for name, part in family.variants[0].parts.items():
        if name in spec:
            held = sum(v.numel() for k, v in weights.items() if k.startswith(name + ".") and hasattr(v, "numel"))
            sizes[name] = 4 * counted_part(part.cls, spec[name], held, f"{path}: its spec's {name} config",
                                           f"its {name}.* weights")
    return plan_memory(sizes, torch.device("cpu"), torch.float32, f"{path} ({family.label})")


def _spec_built(step, spec: dict, path):
    """One step of rebuilding from a spec (its parts, then the pipeline around them, which reads the scheduler's
    keys): a foreign spec that lacks or mistypes a key is one line, whichever step reads it."""
    try:  # the parts: parameters without storage, as a random initialisation the weights replace cost most of the open
        return step(spec)
    except Exception as e:  # noqa: BLE001 - a foreign spec's configs
        raise CheckpointError(f"{path}: its model spec does not build ({type(e).__name__}: {e})") from None


def _spec_parts(spec: dict, family) -> dict:
    """The parts a spec's configs give, each of its family's class (``Part``), without weights: parameters without
    storage, as a random initialisation the weights replace cost most of the open. A part the family's pipeline
    needs (``Assembly.needed``) and the spec lacks is a KeyError naming it."""
    import diffusers
    import transformers
    from accelerate import init_empty_weights

    declared = family.variants[0].parts
    for name in family.assembly.needed(declared):
        spec[name]  # noqa: B018 - a KeyError naming the part
    parts = {}
    with init_empty_weights(include_buffers=False):
        for name, part in declared.items():
            if name not in spec:
                continue
            if part.library == "diffusers":
                parts[name] = getattr(diffusers, part.cls).from_config(spec[name])
            else:
                cls = getattr(transformers, part.cls)
                parts[name] = cls(cls.config_class.from_dict(spec[name]))
    return parts


def _folder_variant(path: Path, family, where: str):
    """The family's variant a folder holds, from its denoiser's config."""
    try:
        config = load_outside(path / family.denoiser / "config.json", f"{family.denoiser}/config.json")
    except WorkbenchError as e:
        raise CheckpointError(f"{where}: {e}") from None
    return family.variant_of(config if isinstance(config, dict) else {})


def is_refiner(ckpt: Checkpoint) -> bool:
    """Whether the checkpoint is a second stage (SDXL's refiner: a diffusers folder or hub id whose denoiser's
    config says so), which opens only as a refiner (``load_pipeline(..., refiner=True)``)."""
    if ckpt.kind not in ("diffusers", "hub"):
        return False
    path = Path(ckpt.path)
    check_pipeline_folder(path, ckpt.label)
    return _folder_variant(path, family_of_folder(path, ckpt.label), ckpt.label).refiner


def absent_parts(folder: Path) -> dict:
    """The parts a folder's ``model_index.json`` lists as absent (``[null, null]``: an SD3 without T5), passed as
    None: diffusers' loader refuses a folder that leaves out a part it is not told is absent."""
    index = load_outside(folder / "model_index.json", "model_index.json")
    return {name: None for name, value in index.items()
            if not name.startswith("_") and isinstance(value, list) and value == [None, None]}


def pipeline_from_folder(path: Path, where: str, dtype: torch.dtype = torch.float32, refiner: bool = False):
    """A diffusers pipeline folder (a hub snapshot too) of any family, through the family's own diffusers
    pipeline (its refiner pipeline where ``refiner``: a one-line refusal where the folder is the other kind of
    model); ``fp16`` variant files when they are all it has."""
    import diffusers

    check_pipeline_folder(path, where)
    family = family_of_folder(path, where)
    pipeline = family.pipeline_for(_folder_variant(path, family, where), where, refiner)
    variant = None
    denoiser_files = {p.name for p in (path / family.denoiser).glob("diffusion_pytorch_model*")}
    if denoiser_files and all(".fp16." in name for name in denoiser_files):
        variant = "fp16"
    from .single_file import no_loading_bars

    try:
        with no_loading_bars():
            pipe = getattr(diffusers, pipeline).from_pretrained(path, variant=variant, torch_dtype=dtype,
                                                                local_files_only=True,
                                                                **{**absent_parts(path), **family.pipeline_options})
    except Exception as e:  # noqa: BLE001 - missing parts, unreadable weights
        first = first_line(e)
        raise CheckpointError(f"cannot load the pipeline in {where}: {first}") from None
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _memory_plan(ckpt: Checkpoint, device, dtype: torch.dtype) -> MemoryPlan:
    """What a folder's parts need at ``dtype`` as their configs build them, planned before any weight is read or
    any class built with memory (``memory.part_sizes``, ``memory.plan_memory``)."""
    check_pipeline_folder(ckpt.path, ckpt.label)  # what it names is safe to read before any config of it is
    family = family_of_folder(ckpt.path, ckpt.label)
    parts = folder_parts(ckpt.path, (family.denoiser, *family.text_encoders, "vae"), ckpt.label)
    return plan_memory(part_sizes(ckpt.path, parts, dtype, ckpt.label), torch.device(device), dtype,
                       f"{ckpt.label} ({family.label})")


def _offloaded(pipe, plan: MemoryPlan, device, dtype):
    """The pipeline in the machine's memory, its parts (or layers) moved to the GPU as they run."""
    if dtype is not None:
        pipe.to(dtype=dtype)
    gpu = torch.device(device)
    if plan.how == "model offload":
        pipe.enable_model_cpu_offload(gpu_id=gpu.index or 0)
    else:
        pipe.enable_sequential_cpu_offload(gpu_id=gpu.index or 0)
    return pipe


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def load_pipeline(ref: str | Path | Checkpoint, *, ema: bool = False, device: str | torch.device = "cpu",
                  dtype: torch.dtype | None = None, roots: list[Path] | None = None,
                  allow_download: bool | None = None, settings: dict | None = None,
                  say: Callable[[str], None] = _to_stderr, refiner: bool = False):
    """A ready diffusers pipeline of the checkpoint's family from any checkpoint reference (see ``find_checkpoint``).

    ``ema`` picks a Composer checkpoint's EMA weights (the other kinds hold one set of weights);
    ``settings`` give a Composer checkpoint's ``prediction_type`` and ``latent_scale`` where the file cannot.
    A folder too large for ``device`` at ``dtype`` is offloaded, with ``say`` telling so, or refused in one line
    before a weight is read (``memory.plan_memory``). ``refiner`` opens a second stage (SDXL's refiner, from a
    folder or hub id), which only a base's latents go into; without it a refiner is refused in one line.
    """
    ckpt = ref if isinstance(ref, Checkpoint) else find_checkpoint(ref, roots=roots, allow_download=allow_download)
    if refiner and ckpt.kind not in ("diffusers", "hub"):
        raise WorkbenchError(f"{ckpt.label}: a refiner opens from a diffusers folder or hub id (SDXL's refiner); "
                             f"this is a {ckpt.kind} checkpoint")
    if settings and ckpt.kind not in ("composer", "mosaicml"):
        raise WorkbenchError(f"{ckpt.label}: --prediction-type and --latent-scale are for Composer checkpoints, "
                             f"which may not record them; a {ckpt.kind} checkpoint's config says them")
    if ckpt.kind in ("composer", "mosaicml"):
        pipe = pipeline_from_composer(ckpt.path, ema=ema, settings=settings)
    elif ckpt.kind in ("diffusers", "hub"):
        plan = _memory_plan(ckpt, device, dtype or torch.float32)
        pipe = pipeline_from_folder(ckpt.path, ckpt.label, dtype or torch.float32, refiner)  # at its precision
        if plan.how != "whole":
            say(plan.note)
            return _offloaded(pipe, plan, device, dtype)
    elif ckpt.kind == "single-file":
        from .family_single_file import load_file

        pipe = load_file(ckpt.path, ckpt.parts)
    else:
        raise CheckpointError(f"{ckpt.label}: not a checkpoint of any kind this workbench opens")
    return pipe.to(device=device, dtype=dtype) if dtype is not None else pipe.to(device)


def export_pipeline(ref: str | Path | Checkpoint, out: str | Path, ema: bool = False, *, half: bool = False,
                    settings: dict | None = None, readme: str | None = None) -> Path:
    """`dwb export`: any checkpoint to a diffusers folder (safetensors) any diffusers user loads; ``half``
    writes float16 weights as diffusers' ``fp16`` variant, ``readme`` is the model card (``model_card``)."""
    out = Path(out)
    if out.is_symlink():  # dangling or not: the folder would not be renamed into its place
        raise WorkbenchError(f"export folder {out} is a link: remove it or choose another name")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise WorkbenchError(f"export folder {out} is not empty")
    ckpt = ref if isinstance(ref, Checkpoint) else find_checkpoint(ref)
    pipe = load_pipeline(ckpt, ema=ema, settings=settings, refiner=is_refiner(ckpt))  # a refiner exports as itself
    if half:  # part by part: a whole float16 pipeline on the CPU makes diffusers warn that it cannot run
        for part in pipe.components.values():
            if isinstance(part, torch.nn.Module):
                part.to(torch.float16)
    out.parent.mkdir(parents=True, exist_ok=True)
    with whole_folder(out) as partial:  # a full disk leaves no half export behind
        pipe.save_pretrained(partial, safe_serialization=True, variant="fp16" if half else None)
        if readme is not None:
            (partial / "README.md").write_text(readme)
    return out
