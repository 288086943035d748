"""EMA of the trainable weights, as Composer's EMA algorithm, with the per-batch update fused.

Composer's ``compute_ema`` issues four small ops per tensor; on a CPU each costs 10-100 us, which
made EMA a visible share of a tiny model's step. Here the update is one ``_foreach_lerp_`` over all
tensors. Only floating-point tensors are averaged (integer buffers such as position ids stay as
they are). State, checkpoints and the swap of EMA weights in for eval and saving are Composer's.

Under FSDP every EMA step here gathers the full weights with ``train.patches.fsdp.fsdp_full_params``, and
Composer's own EMA code does too (``train.patches.composer.patch_composer_ema``: it looked for ``model.module``).
"""
from __future__ import annotations

import torch
from composer.algorithms import EMA
from composer.core import Event

from .patches.composer import patch_composer_ema
from .patches.fsdp import fsdp_full_params

patch_composer_ema()


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
            with fsdp_full_params(state.model):
                fused_ema_update(state.model, self.ema_model, self.smoothing)
            return
        super().apply(event, state, logger)
