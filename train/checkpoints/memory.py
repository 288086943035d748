"""What a checkpoint needs in memory, known before its weights are read, and how it is then loaded: whole, with
its parts moved to the GPU one at a time (model offload), with its layers moved one at a time (sequential
offload), or refused in one line. Full-size SDXL needs 13 GiB in float32, SD3.5-large 51 GiB and Flux.1 63 GiB
(``train.families`` counts them): a machine that cannot hold one is told so instead of being killed for memory.

``DWB_MEMORY_MB`` caps the memory planned with (a machine shared with other work)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import WorkbenchError

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


def part_sizes(folder: Path, parts: tuple[str, ...], dtype: torch.dtype) -> dict[str, int]:
    """Each part's weights in bytes at ``dtype``, from the safetensors headers (element counts) or, for other
    weight files, their sizes on disk scaled by ``dtype`` against float32."""
    from .single_file import read_shapes

    scale = torch.empty((), dtype=dtype).element_size()
    sizes = {}
    for part in parts:
        total = 0
        for file in sorted((folder / part).glob("*.safetensors")):
            total += sum(_numel(shape) for shape in read_shapes(file).values()) * scale
        if not total:
            total = sum(f.stat().st_size for f in (folder / part).glob("*.bin")) * scale // 4
        sizes[part] = total
    return sizes


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


# Bytes per trained weight: float32 weights, gradients and AdamW's two moments (EMA adds a copy)
TRAINED_BYTES, EMA_BYTES, FROZEN_BYTES = 4 * 4, 4, 4


def check_training_memory(trained: int, frozen: int, *, ema: bool, shards: int, weights_sharded: bool,
                          processes: int, device: torch.device, what: str) -> int:
    """A one-line refusal, before anything is built, where a run cannot hold its model on ``device``: ``trained``
    weights with their gradients and AdamW state (and EMA copy), the state split over ``shards`` ranks by FSDP (the
    weights too where ``weights_sharded``: FULL_SHARD), the ``frozen`` parts whole, for each of the ``processes`` on
    this machine (one on a GPU). Activations come on top: it is a floor. Returns the bytes planned."""
    shards = max(shards, 1)
    state = trained * (TRAINED_BYTES - 4 + (EMA_BYTES if ema else 0)) // shards
    per_process = state + trained * 4 // (shards if weights_sharded else 1) + frozen * FROZEN_BYTES
    need = per_process * (processes if device.type != "cuda" else 1)
    available = available_memory(device)
    if need > available:
        where = "this GPU" if device.type == "cuda" else f"this machine for {processes} process{'es' * (processes > 1)}"
        raise WorkbenchError(f"{what} needs at least {_size(need)} on {where}: weights, gradients and AdamW state of "
                             f"{trained / 1e6:,.0f}M trained weights and {frozen / 1e6:,.0f}M frozen ones, before "
                             f"activations; {_size(available)} is free (DWB_MEMORY_MB caps it): train it on a GPU, or "
                             f"shard it with fsdp over more ranks")
    return need
