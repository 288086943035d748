"""PyTorch FSDP's internals as training reads them on any device (GPU or CPU ranks), written against PyTorch 2.7.0
(FSDP1, ``torch.distributed.fsdp.FullyShardedDataParallel``). What only CPU ranks need is ``fsdp_cpu_ranks``.

**Full weights for EMA** (``fsdp_full_params``). The context Composer's EMA gathers FSDP weights in (``train.patches
.composer.patch_composer_ema`` puts it in place of Composer 0.32.1's ``get_model_context_manager``, which reached
them through ``model.module``, and ``train.ema`` updates its averages in it): FSDP's public
``FullyShardedDataParallel.summon_full_params`` on the whole model, so every unit inside it, wherever it sits,
holds its full weights. Without FSDP (Composer's ``misc.is_model_fsdp``) it is a no-op context, as Composer's is.

**Each rank's share of the weights** (``fsdp_weight_share``). FSDP keeps no public count of what a rank holds;
each unit's flat parameter does, privately: the unit's ``_handle`` (set in ``_init_param_handle_from_params``,
``torch/distributed/fsdp/_init_utils.py``) holds ``flat_param``, whose ``_shard_numel_padded`` (the padding
of this rank's shard, ``FlatParamHandle._init_shard_metadata``) and ``_unpadded_unsharded_size`` (the whole,
``FlatParameter._init_metadata``) are read to print what a run's strategy shards. Nothing upstream is changed;
a rename there would make the count fail, not training.
"""
from __future__ import annotations

import contextlib

import torch

# The version this module was written and tested against (`tests/train/test_compat.py` compares it).
WRITTEN_FOR = {"torch": "2.7.0"}


def fsdp_full_params(model: torch.nn.Module):
    """A context in which every FSDP unit inside ``model`` holds its full (unsharded) weights."""
    from composer.utils import misc

    if misc.is_model_fsdp(model):
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel.summon_full_params(model)
    return contextlib.nullcontext()


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
