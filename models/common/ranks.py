"""The processes of a launch, on ``torch.distributed`` alone: which one this is, joining their group, and every
collective the workbench runs (a sum or maximum of a tensor, a broadcast, a gather, a barrier): no other module
calls ``torch.distributed``'s or Composer's collectives (``tests/test_collectives.py`` reads the source for it).

`composer -n N` (and torchrun) set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
one process sets none and is rank 0 of 1, with no group. The group's backend follows the device: NCCL for
CUDA, whose object collectives move their bytes through the current CUDA device (set to the local rank's before
the group starts), gloo for a CPU. A tensor collective runs where the group's backend serves it
(``collective_device``): NCCL serves CUDA tensors only, and a CPU tensor handed to it stopped the run with "No
backend type associated with device type cpu".

Rank 0 sometimes works alone while the others wait: autoresume's checks, evaluate's reference statistics and
metrics, a precompute rank's last chunk. Those waits are ``patient``: they run in a gloo group of their own,
whose bound is ``PATIENT_S``, not the launch group's timeout (300 s by default, after which NCCL's watchdog
aborts the waiting ranks).
"""
from __future__ import annotations

import datetime
import os

import torch

from ..errors import WorkbenchError

# The longest work one rank does while the others wait: evaluate's reference statistics on rank 0, which decodes
# and resizes every reference image in one process (30 ms for a 1024-px JPEG here, so 25 minutes for 50,000), or
# autoresume's CRC over a 45 GB checkpoint (sdxl-base's: its parts, two AdamW moments and EMA) at a network disk's
# 100 MB/s (7.5 minutes). Two hours is four times the longest; a rank that dies closes its connections and the
# others stop at once, so the bound only ends a rank 0 that hangs without dying.
PATIENT_S = 2 * 3600.0

_patient_group = None  # the gloo group of the patient waits, made at the first (every rank makes it at once)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def global_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def join_group(device: torch.device, timeout_s: float = 300.0) -> None:
    """Join the launch's process group (environment rendezvous); nothing for one process or a group joined.
    ``timeout_s`` bounds each collective of the group (ranks doing the same work meet well within it; a wait for
    one rank's long work is ``patient``)."""
    import torch.distributed as dist

    if world_size() <= 1 or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(local_rank())
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=timeout_s))


def collective_device(backend: str, held: str = "cpu") -> str:
    """The device type a tensor held on ``held`` goes to for a group's collective, from the group's backend as
    ``torch.distributed.get_backend`` names it: one backend ("nccl", "gloo") serves the device types PyTorch lists
    for it, and "cpu:gloo,cuda:nccl" or "cuda:gloo" the device types named. The tensor stays where it is held when
    that is served (no copy: validation's sums are kept on the CPU, the guard's flag on the GPU); else the CPU where
    served, else the first served (CUDA for NCCL)."""
    from torch.distributed import Backend

    served = []
    for pair in backend.lower().split(","):
        device, _, name = pair.strip().rpartition(":")
        served += [device] if device else list(Backend.backend_capability.get(name, ()))
    if not served:
        raise WorkbenchError(f"the process group's backend {backend!r} serves no device this workbench knows")
    return held if held in served else "cpu" if "cpu" in served else served[0]


def _joined() -> bool:
    """Whether a collective runs: in a joined group (of any size, as Composer's one process joins one of one);
    more than one process without a group is left to torch.distributed to name."""
    import torch.distributed as dist

    return dist.is_initialized() or world_size() > 1


def all_reduce(tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``tensor`` summed (or its maximum taken) over every rank, in place, and returned. It travels to the device
    the group serves and back (float64 stays float64: NCCL sums it exactly as gloo does)."""
    if op not in ("sum", "max"):
        raise WorkbenchError(f"all_reduce takes op 'sum' or 'max', got {op!r}")
    if not _joined():
        return tensor
    import torch.distributed as dist

    kind = collective_device(str(dist.get_backend()), tensor.device.type)
    device = torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" else torch.device(kind)
    moved = tensor.to(device)
    dist.all_reduce(moved, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    if moved is not tensor:
        tensor.copy_(moved)
    return tensor


def _patient():
    """The gloo group of patient waits (CPU, served alongside NCCL), bounded by ``PATIENT_S``."""
    global _patient_group
    import torch.distributed as dist

    if _patient_group is None:
        _patient_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=PATIENT_S))
    return _patient_group


def _alone() -> bool:
    import torch.distributed as dist

    return not _joined() or (dist.is_initialized() and dist.get_world_size() == 1)


def barrier(patient: bool = False) -> None:
    """Every rank waits for the others; ``patient`` where one of them may still be at long work of its own."""
    if _alone():
        return
    if patient:
        broadcast_object(None, patient=True)
        return
    import torch.distributed as dist

    dist.barrier()


def broadcast_object(value, src: int = 0, patient: bool = False):
    """``value`` as rank ``src`` holds it, on every rank; ``patient`` where ``src`` may still be at long work of
    its own (the others wait up to ``PATIENT_S``, not the group's timeout)."""
    if _alone():
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=src, group=_patient() if patient else None)
    return box[0]


def gather_objects(value) -> list:
    """Every rank's ``value``, in rank order, on every rank."""
    if _alone():
        return [value]
    import torch.distributed as dist

    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered
