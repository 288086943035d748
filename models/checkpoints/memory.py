"""What a checkpoint needs in memory, known before its weights are read, and how it is then loaded: whole, with
its parts moved to the GPU one at a time (model offload), with its layers moved one at a time (sequential
offload), or refused in one line. Full-size SDXL needs 13 GiB in float32, SD3.5-large 51 GiB and Flux.1 63 GiB
(``models.families`` counts them): a machine that cannot hold one is told so instead of being killed for memory.

What a part needs is what its config builds (counted on the meta device, its sizes held first) or what its weight
files hold, whichever is more; a config that builds weights its files lack is refused: an SDXL ``text_encoder_2``
config 4,096 wide beside a file of one value had transformers make up 19 GiB of weights.

``DWB_MEMORY_MB`` caps the memory planned with (a machine shared with other work)."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..common import load_outside
from ..errors import CheckpointError, WorkbenchError

# Room beyond the weights for activations, the sampler's latents and the VAE's decode at native size: a full-size
# SD 2 at 512 px peaked at 1.15x its float32 weights on a CPU (bench/app_overhead.py's memory figure).
HEADROOM = 1.25
GIB = 2**30


@dataclass(frozen=True)
class MemoryPlan:
    how: str  # "whole", "model offload" or "sequential offload"
    need: int  # bytes of the whole model at the chosen precision, with headroom
    available: int  # bytes on the device it runs on
    note: str  # what a command prints about it ("" when it fits whole)


def available_memory(device: torch.device) -> int:
    """Free bytes on ``device`` (the GPU's free memory, or the machine's available memory), under DWB_MEMORY_MB."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        import psutil

        free = psutil.virtual_memory().available
    cap = os.environ.get("DWB_MEMORY_MB")
    return min(free, int(float(cap) * 2**20)) if cap else free


def _size(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.0f} MiB"


def weight_values(part: Path) -> tuple[int, int]:
    """(the most values a part's weight files can hold, the values to plan it with): the element counts its
    safetensors headers declare (both), or for ``.bin`` weights their bytes (a value takes at least one) and the
    float32 values those bytes hold."""
    from .single_file import read_shapes

    declared = sum(_numel(shape) for file in sorted(part.glob("*.safetensors")) for shape in read_shapes(file).values())
    if declared:
        return declared, declared
    nbytes = sum(f.stat().st_size for f in part.glob("*.bin"))
    return nbytes, nbytes // 4


def counted_part(cls: str, config, held: int, where: str, holder: str) -> int:
    """The values a part is planned with: what ``config`` builds (its parameters and buffers, counted on the meta
    device: ``models.families.built_on_meta``, which holds its sizes first) or ``held``, whichever is more. A config
    that builds more parameters than ``holder`` holds (``held``) is refused in one line before any class is built with
    memory: a library would make the missing weights up (transformers draws them at random) instead of reading them."""
    from ..families import built_on_meta

    parameters, buffers = built_on_meta(cls, config, where)
    if parameters > held:
        raise CheckpointError(f"{where} builds a {cls} of {parameters:,} weights and {holder} hold {held:,} "
                              f"value{'s' * (held != 1)}: a part its weights lack is refused, not made up")
    return max(parameters + buffers, held)


def part_sizes(folder: Path, parts: dict[str, str], dtype: torch.dtype, where: str) -> dict[str, int]:
    """Each part's bytes at ``dtype`` (``parts``: its class, as ``model_index.json`` names it): what its
    ``config.json`` builds or what its weight files hold, whichever is more (``counted_part``); a part without a
    config, what its files hold (diffusers refuses it where it needs one)."""
    scale = torch.empty((), dtype=dtype).element_size()
    sizes = {}
    for part, cls in parts.items():
        most, values = weight_values(folder / part)
        config = _part_config(folder, part, where)
        if config is not None:
            values = counted_part(cls, config, most, f"{where}: {part}/config.json", f"the weight files in {part}/")
        sizes[part] = values * scale
    return sizes


def held_configs(folder: Path, names: tuple[str, ...], where: str) -> None:
    """A one-line refusal unless every config of ``names`` a folder holds is of a class the families build, its sizes
    held (``models.families.check_part_config``): for a folder whose weights are elsewhere (a single file's parts)."""
    from ..families import check_part_config

    for part, cls in folder_parts(folder, names, where).items():
        config = _part_config(folder, part, where)
        if config is not None:
            check_part_config(cls, config, f"{where}: {part}/config.json")


def _part_config(folder: Path, part: str, where: str):
    """``part/config.json`` of a folder, read bounded (``load_outside``); None where there is none."""
    path = folder / part / "config.json"
    if not path.is_file():
        return None
    try:
        return load_outside(path, f"{part}/config.json")
    except WorkbenchError as e:
        raise CheckpointError(f"{where}: {e}") from None


def folder_parts(folder: Path, names: tuple[str, ...], where: str) -> dict[str, str]:
    """The class ``model_index.json`` names for each of ``names`` a folder holds (parts it lists as absent, or not
    at all, are not loaded and not planned); a one-line refusal for a class no family builds."""
    from ..families import size_limits

    try:
        index = load_outside(folder / "model_index.json", "model_index.json")
    except WorkbenchError as e:
        raise CheckpointError(f"{where}: {e}") from None
    classes = {}
    for name in names:
        entry = index.get(name) if isinstance(index, dict) else None
        if not isinstance(entry, list) or len(entry) != 2 or entry[1] is None:
            continue
        if not isinstance(entry[1], str) or entry[1] not in size_limits():
            raise CheckpointError(f"{where}: model_index.json names {entry[1]!r} for '{name}'; the workbench builds "
                                  f"{', '.join(sorted(size_limits()))}")
        classes[name] = entry[1]
    return classes


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def plan_memory(sizes: dict[str, int], device: torch.device, dtype: torch.dtype, what: str,
                available: int | None = None) -> MemoryPlan:
    """How a model of these part sizes loads on ``device``: whole where it fits with headroom; on a GPU, a part at
    a time where the largest part fits, a layer at a time where it does not (the machine's memory holds the rest);
    otherwise a one-line refusal naming what it needs and what there is."""
    available = available_memory(device) if available is None else available
    need = int(sum(sizes.values()) * HEADROOM)
    if need <= available:
        return MemoryPlan("whole", need, available, "")
    where = "this GPU" if device.type == "cuda" else "this machine"
    if device.type == "cuda" and need <= available_memory(torch.device("cpu")):
        how = "model offload" if max(sizes.values()) * HEADROOM <= available else "sequential offload"
        unit = "part" if how == "model offload" else "layer"
        return MemoryPlan(how, need, available, f"{what} needs {_size(need)} and {where} has "
                          f"{_size(available)} free: its parts stay in the machine's memory and move to the "
                          f"GPU a {unit} at a time ({how}; slower)")
    precision = str(dtype).removeprefix("torch.")
    raise WorkbenchError(f"{what} needs {_size(need)} in {precision} and {where} has {_size(available)} "
                         f"free; use a machine with more memory" + ("" if device.type == "cuda" else " or a GPU"))


# The bytes of a trained weight: float32, as are its gradient, AdamW's two moments and its EMA
WEIGHT_BYTES = 4
FSDP_STRATEGIES = ("SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD")


@dataclass(frozen=True)
class RankPlan:
    """What one rank holds while it trains, in bytes: the trained weights, their gradients, AdamW's two moments,
    the EMA, the frozen parts and the full copy of the denoiser previews are drawn with."""
    weights: int
    gradients: int
    optimizer: int
    ema: int
    frozen: int
    preview: int

    @property
    def total(self) -> int:
        return sum(dataclasses.astuple(self))

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def rank_plan(trained: int, frozen_bytes: int, *, layout: str, shards: int, ema: bool, preview_bytes: int = 0,
              ) -> RankPlan:
    """What a rank holds (``RankPlan``) training ``trained`` float32 weights beside ``frozen_bytes`` of frozen parts.
    ``layout``: "one process", "DDP" or an FSDP strategy (``FSDP_STRATEGIES``), sharding over ``shards`` ranks (all of
    them, a node's with HYBRID_SHARD). Under FSDP the gradients, AdamW's moments and the EMA are a rank's shard, and
    the weights too but with SHARD_GRAD_OP, which holds them whole through each step; DDP keeps buckets as large as the
    gradients beside them (``train.patches.fsdp.ddp_bucket_bytes``). ``preview_bytes``: the full copy of the denoiser
    this rank draws previews with (rank 0 under FSDP). Activations come on top: it is a floor."""
    whole = trained * WEIGHT_BYTES
    part = -(-whole // max(shards, 1)) if layout in FSDP_STRATEGIES else whole
    return RankPlan(weights=whole if layout == "SHARD_GRAD_OP" else part,
                    gradients=2 * whole if layout == "DDP" else part, optimizer=2 * part, ema=part if ema else 0,
                    frozen=frozen_bytes, preview=preview_bytes)


def module_size(module: torch.nn.Module) -> tuple[int, int]:
    """(values, bytes) of a module's parameters and buffers, at their dtypes (counted on the meta device as well)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)


def pretrained_part_values(ref: str, parts: tuple[str, ...]) -> int | None:
    """The values of the pretrained ``parts`` of ``ref`` (a diffusers folder, a hub id or a single file), from their
    weight files without reading a weight: what their safetensors headers declare (a ``.bin``'s bytes over 4). A
    single file's VAE and text tower are read from its safetensors header (a ``.ckpt``'s are not: reading them loads
    the file). None for a hub id not in the local cache: nothing is downloaded to be planned."""
    from .components import is_part_folder, names_a_single_file
    from .hub import is_hub_id, resolve_hub
    from .single_file import TEXT, VAE, read_shapes

    if names_a_single_file(ref):
        if Path(ref).suffix != ".safetensors":
            return 0
        return sum(_numel(shape) for key, shape in read_shapes(Path(ref)).items() if key.startswith((VAE, TEXT)))
    if is_part_folder(Path(ref)):
        return weight_values(Path(ref))[1]
    try:
        root = resolve_hub(ref, allow_download=False) if is_hub_id(ref) else Path(ref)
    except CheckpointError:
        return None
    return sum(weight_values(root / part)[1] for part in parts)


def check_training_memory(plans: list[RankPlan], trained: int, frozen: int, *, device: torch.device,
                          what: str) -> int:
    """A one-line refusal, before anything is built, where ``device`` cannot hold what the ranks it serves hold
    (``plans``: this rank's on a GPU, every local process's on a CPU), naming the ``trained`` and ``frozen`` values.
    Returns the bytes planned."""
    need = sum(plan.total for plan in plans)
    available = available_memory(device)
    if need > available:
        processes = len(plans)
        where = "this GPU" if device.type == "cuda" else f"this machine for {processes} process{'es' * (processes > 1)}"
        raise WorkbenchError(f"{what} needs at least {_size(need)} on {where}: weights, gradients, AdamW state and EMA "
                             f"of {trained / 1e6:,.0f}M trained weights and {frozen / 1e6:,.0f}M frozen ones, before "
                             f"activations; {_size(available)} is free (DWB_MEMORY_MB caps it): train it on a GPU, or "
                             f"shard it with fsdp over more ranks")
    return need
