"""The processes of a launch, on ``torch.distributed`` alone: which one this is, joining their group, and the
object collectives the scoring side needs (a broadcast, a gather, a barrier).

`composer -n N` (and torchrun) set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``;
one process sets none and is rank 0 of 1, with no group. The group's backend follows the device: NCCL for
CUDA, whose object collectives move their bytes through the current CUDA device (set to the local rank's before
the group starts), gloo for a CPU.
"""
from __future__ import annotations

import datetime
import os

import torch


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def global_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def join_group(device: torch.device, timeout_s: float = 300.0) -> None:
    """Join the launch's process group (environment rendezvous); nothing for one process or a group joined."""
    import torch.distributed as dist

    if world_size() <= 1 or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(local_rank())
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=datetime.timedelta(seconds=timeout_s))


def barrier() -> None:
    if world_size() > 1:
        import torch.distributed as dist

        dist.barrier()


def broadcast_object(value, src: int = 0):
    """``value`` as rank ``src`` holds it, on every rank."""
    if world_size() <= 1:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(value) -> list:
    """Every rank's ``value``, in rank order, on every rank."""
    if world_size() <= 1:
        return [value]
    import torch.distributed as dist

    gathered = [None] * world_size()
    dist.all_gather_object(gathered, value)
    return gathered
