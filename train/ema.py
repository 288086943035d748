"""EMA of the trainable weights, as Composer's EMA algorithm, with the per-batch update fused.

Composer's ``compute_ema`` issues four small ops per tensor; on a CPU each costs 10-100 us, which
made EMA a visible share of a tiny model's step. Here the update is one ``_foreach_lerp_`` over all
tensors. Only floating-point tensors are averaged (integer buffers such as position ids stay as
they are). State, checkpoints and the swap of EMA weights in for eval and saving are Composer's.

Under FSDP, Composer's EMA gathers the full weights through ``model.module``, which exists on its
HuggingFaceModel but not on a model whose FSDP units are its children (the UNet here). Every EMA
step here, and Composer's own EMA code through the hook below, gathers them with FSDP's
``summon_full_params`` on the whole model instead, which finds each FSDP unit inside it.
"""
from __future__ import annotations

import contextlib

import composer.algorithms.ema.ema as composer_ema
import torch
from composer.algorithms import EMA
from composer.core import Event
from composer.utils import misc


def full_params(model: torch.nn.Module):
    """A context in which every FSDP unit inside ``model`` holds its full (unsharded) weights."""
    if misc.is_model_fsdp(model):
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel.summon_full_params(model)
    return contextlib.nullcontext()


composer_ema.get_model_context_manager = full_params


@torch.no_grad()
def fused_ema_update(model: torch.nn.Module, ema_model, smoothing: float) -> None:
    """ema <- smoothing * ema + (1 - smoothing) * current, for every tracked floating tensor."""
    params, buffers = ema_model.named_parameters_dict, ema_model.named_buffers_dict
    pairs = [(params[n], p) for n, p in model.named_parameters() if n in params]
    pairs += [(buffers[n], b) for n, b in model.named_buffers() if n in buffers and b.is_floating_point()]
    if pairs:
        torch._foreach_lerp_([e for e, _ in pairs], [c.detach() for _, c in pairs], 1.0 - smoothing)


class FusedEMA(EMA):
    def apply(self, event: Event, state, logger) -> None:
        if event in (Event.BATCH_END, Event.EPOCH_END) and self.ema_model is not None:
            with full_params(state.model):
                fused_ema_update(state.model, self.ema_model, self.smoothing)
            return
        super().apply(event, state, logger)
