"""PyTorch FSDP's internals as training reads them on any device (GPU or CPU ranks), written against PyTorch 2.7.0
(FSDP1, ``torch.distributed.fsdp.FullyShardedDataParallel``), and DDP's, which Composer 0.32.1 wraps a model in
without FSDP. What only CPU ranks need is ``fsdp_cpu_ranks``.

**Each rank's shard of the trained weights** (``fsdp_flat_params``). The sharded EMA (``train.ema``) keeps, per FSDP
unit, a tensor of the size of the unit's flat parameter on this rank and updates it from that parameter in place,
with no gather. FSDP keeps no public handle on it: each unit's ``_handle`` (set in
``_init_param_handle_from_params``, ``torch/distributed/fsdp/_init_utils.py``) holds ``flat_param``. Between steps
it is this rank's padded shard, and the unit's original parameters (Composer's ``use_orig_params=True``) are views
of it (``FlatParamHandle._use_sharded_views``; without sharding, ``NO_SHARD`` or one rank, views of the whole flat
parameter), so what is written into it is what the unit's weights are.

**Gathered weights let go after a shard is written** (``fsdp_drop_gathered``). After a forward pass without
gradients FSDP keeps a unit's gathered weights: the root unit's always (``_post_forward_reshard`` frees them only for
non-root units, expecting a backward to follow), every unit's with SHARD_GRAD_OP; only a backward frees them. A
later forward finds them allocated (``FlatParamHandle.needs_unshard``) and computes with them without gathering
again. Where shards are written in place between two such passes (the EMA swapped in after validation's raw
pass), the second pass computed with the weights of the first: a 2-rank FULL_SHARD run's EMA validation loss at
batch 4 was its raw one, 1.0792, to the last digit (1.1053 with them let go). Each such unit is resharded with its
gathered weights freed (``FlatParamHandle.reshard``), as a backward would, so that the next forward gathers the
shards as they now are.

**Full weights, gathered** (``fsdp_full_params``). FSDP's public ``FullyShardedDataParallel.summon_full_params``
on the whole model, so every unit inside it, wherever it sits, holds its full weights: to read them on rank 0 for
a checkpoint (``rank0_only``: the other ranks free theirs at once, and on a GPU each unit's gathered weights move
to the CPU as they come, ``offload_to_cpu``, which FSDP refuses for an unsharded unit:
``FlatParamHandle.uses_sharded_strategy``), or to write weights a checkpoint holds whole into every rank's shard.

**Each rank's share of the weights** (``fsdp_weight_share``). FSDP keeps no public count of what a rank holds;
each unit's flat parameter does, privately: ``_shard_numel_padded`` (the padding of this rank's shard,
``FlatParamHandle._init_shard_metadata``) and ``_unpadded_unsharded_size`` (the whole,
``FlatParameter._init_metadata``) are read to print what a run's strategy shards.

**DDP's gradient buckets** (``ddp_bucket_bytes``). Composer's ``prepare_ddp_module``
(``composer/distributed/dist_strategy.py``) builds ``DistributedDataParallel`` with PyTorch's default
``gradient_as_bucket_view=False``: its reducer keeps buckets as large as all the gradients, which it copies them
into to all-reduce, on every rank for the whole run (a 2-rank tiny run: 4,310,288 bytes of buckets for
4,310,288 bytes of weights). Their sizes are in DDP's ``_get_ddp_logging_data`` (a prototype interface), which
the count of what a rank holds (``train.callbacks.memory``) reads. Nothing upstream is changed; a rename there
would make a count fail, not training.
"""
from __future__ import annotations

import contextlib

import torch

# The version this module was written and tested against (`tests/train/test_compat.py` compares it).
WRITTEN_FOR = {"torch": "2.7.0", "mosaicml": "0.32.1"}


def fsdp_flat_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The flat parameter of every FSDP unit inside ``model`` that trains: between steps, this rank's shard of the
    unit's weights, of which the unit's parameters are views (an empty list without FSDP)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    flats = []
    for unit in FullyShardedDataParallel.fsdp_modules(model):
        handle = getattr(unit, "_handle", None)
        if handle is not None and handle.flat_param.requires_grad:
            flats.append(handle.flat_param)
    return flats


def fsdp_drop_gathered(model: torch.nn.Module) -> None:
    """Free the gathered weights FSDP still holds for any unit inside ``model`` (see above): the next forward, or
    gather, of each unit reads its shards as they are now."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    for unit in FullyShardedDataParallel.fsdp_modules(model):
        handle = getattr(unit, "_handle", None)
        if handle is not None and handle.uses_sharded_strategy and not handle.needs_unshard():
            handle.reshard(True)


def fsdp_full_params(model: torch.nn.Module, *, rank0_only: bool = False):
    """A context in which every FSDP unit inside ``model`` holds its full weights: writes into them persist in
    every rank's shard, or with ``rank0_only`` rank 0 alone sees them (moved to the CPU a unit at a time where the
    units are sharded on a GPU) and the other ranks see their shards."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    handles = [unit._handle for unit in FullyShardedDataParallel.fsdp_modules(model) if unit._handle is not None]
    if not handles:
        return contextlib.nullcontext()
    offload = rank0_only and all(h.uses_sharded_strategy and h.flat_param.device.type == "cuda" for h in handles)
    return FullyShardedDataParallel.summon_full_params(model, writeback=not rank0_only, rank0_only=rank0_only,
                                                       offload_to_cpu=offload)


def fsdp_weight_share(module: torch.nn.Module) -> tuple[int, int]:
    """(weights this rank holds, weights in all) of the FSDP units inside ``module``, from each unit's flat
    parameter (padding counted out): how a run shows what its strategy shards."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    held = total = 0
    for unit in FullyShardedDataParallel.fsdp_modules(module):
        handle = getattr(unit, "_handle", None)
        if handle is None:
            continue
        flat = handle.flat_param
        held += flat.numel() - flat._shard_numel_padded
        total += flat._unpadded_unsharded_size.numel()
    return held, total


def ddp_bucket_bytes(model: torch.nn.Module) -> int:
    """Bytes of the gradient buckets a ``DistributedDataParallel`` model keeps beside its gradients (0 for any other
    model, or one whose buckets hold the gradients themselves)."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return 0
    data = model._get_ddp_logging_data()
    if data.get("gradient_as_bucket_view"):
        return 0
    sizes = str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or "")
    return sum(int(size) for size in sizes.replace(",", " ").split())
