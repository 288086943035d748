"""Skipping batches whose loss or gradients are not finite, and stopping a run that keeps producing them.

A NaN or infinite loss (or gradient) on any rank makes every rank drop that batch's update, so AdamW leaves weights and
moments untouched. Each skip is counted and logged (``train/nonfinite_skipped``); ``limit`` skips in a row abort the
run with one line, since by then the model or the data is broken and more steps only waste time. The counters are part
of the checkpoint, so they survive a resume.

Nothing is read back to the host in a step. The check is kept on the device: each microbatch's loss is folded into a
flag, the gradients' norm is the one gradient clipping computes anyway (the guard clips: one pass over the gradients,
where the guard's own norm pass used to come before Composer's clipping), and the flag is all-reduced (max) so that
every rank holds the same decision. The decision reaches the optimizer on the device too: a fused AdamW takes it as
``found_inf`` (as under a GradScaler) and skips the update, moments and step count in its kernel. The counters are
read once per ``read_every`` batches (the log interval), and sooner when ``limit`` could be reached by then, so a run
still stops at the batch that makes ``limit`` in a row. Before, ``bool(isfinite(loss))`` after every microbatch and
``.item()`` of the all-reduced flag every step each waited for the device to finish all the work queued before it.

Where the optimizer cannot take the decision on the device (not fused, or amp_fp16, whose GradScaler sets its own
``found_inf``), the flag is read every step and the gradients are cleared instead (AdamW skips a weight without one).
"""
from __future__ import annotations

import logging

import torch
from composer.core import Algorithm, Event, Precision, State
from composer.loggers import Logger

from models.common import all_reduce
from models.errors import WorkbenchError

log = logging.getLogger(__name__)


class NonFiniteGuard(Algorithm):
    def __init__(self, limit: int = 10, clip_norm: float | None = None, read_every: int = 1):
        self.limit, self.clip_norm, self.read_every = limit, clip_norm, read_every
        self.read = {"skipped": 0, "consecutive": 0}  # the counters as last read
        self._counts: torch.Tensor | None = None  # on the device: skipped, consecutive
        self._bad: torch.Tensor | None = None  # this batch's flag, on the device
        self._unread = 0  # batches since the counters were read

    @property
    def skipped(self) -> int:
        return self.counters()["skipped"]

    @property
    def consecutive(self) -> int:
        return self.counters()["consecutive"]

    def counters(self) -> dict[str, int]:
        """The counters now (a read from the device)."""
        if self._counts is not None:
            skipped, consecutive = self._counts.tolist()
            self.read = {"skipped": int(skipped), "consecutive": int(consecutive)}
            self._unread = 0
        return dict(self.read)

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.BATCH_START, Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.BATCH_START:
            self._bad = None
        elif event == Event.AFTER_BACKWARD:  # once per microbatch
            loss = state.loss
            losses = loss.values() if isinstance(loss, dict) else (loss if isinstance(loss, (list, tuple)) else [loss])
            bad = torch.stack([~torch.isfinite(l.detach()).all() for l in losses]).any()
            self._bad = bad if self._bad is None else self._bad | bad
        else:  # AFTER_TRAIN_BATCH: gradients complete (all-reduced), optimizer not yet stepped
            self.decide(state, logger)

    def decide(self, state: State, logger: Logger) -> None:
        norm = gradient_norm(state, self.clip_norm)
        bad = self._bad if norm is None else ~torch.isfinite(norm)
        if bad is None:  # no gradient and no loss seen
            bad = torch.zeros((), dtype=torch.bool)
        elif norm is not None and self._bad is not None:
            bad = bad | self._bad.to(bad.device)
        flag = all_reduce(bad.float().reshape(1), "max")  # every rank skips, or none does
        optimizer = state.optimizers[0]
        if skips_on_device(state, optimizer):
            optimizer.found_inf = flag[0]  # the fused kernel leaves weights, moments and step count as they were
        elif flag.item() > 0:
            for p in state.model.parameters():
                p.grad = None  # AdamW skips parameters without gradients: no update, no moment change
        self.count(flag, state, logger)

    def count(self, flag: torch.Tensor, state: State, logger: Logger) -> None:
        """The counters updated on the device; read (and the limit checked) once per ``read_every`` batches, or at
        the first batch that could make ``limit`` in a row."""
        if self._counts is None or self._counts.device != flag.device:  # filled there: no copy from the host
            self._counts = torch.zeros(2, dtype=torch.long, device=flag.device)
            self._counts[0] += self.read["skipped"]
            self._counts[1] += self.read["consecutive"]
        hit = flag.long().reshape(())
        self._counts[0] += hit
        self._counts[1] = (self._counts[1] + 1) * hit
        self._unread += 1
        if self._unread < min(self.read_every, self.limit - self.read["consecutive"]):
            return
        before, batch = self.read["skipped"], int(state.timestamp.batch) + 1
        now = self.counters()
        if now["skipped"] > before:
            log.warning("batch %d: non-finite loss or gradients, %d update(s) skipped since the last read (%d in a "
                        "row, %d in all)", batch, now["skipped"] - before, now["consecutive"], now["skipped"])
        logger.log_metrics({"train/nonfinite_skipped": now["skipped"]})
        if now["consecutive"] >= self.limit:
            raise WorkbenchError(f"the loss or gradients were not finite for {now['consecutive']} batches in a row "
                                 f"(up to batch {batch}); stopping. Resume from the last checkpoint with a lower lr, "
                                 f"or check the data")

    def state_dict(self) -> dict:
        return self.counters()

    def load_state_dict(self, state: dict, strict: bool = False) -> None:
        self.read = {"skipped": int(state.get("skipped", 0)), "consecutive": int(state.get("consecutive", 0))}
        self._counts, self._unread = None, 0


def skips_on_device(state: State, optimizer) -> bool:
    """Whether ``optimizer`` takes the skip as a device flag: a fused torch optimizer (its kernel reads
    ``found_inf``), outside amp_fp16 (whose GradScaler sets ``found_inf`` itself)."""
    return bool(getattr(optimizer, "defaults", {}).get("fused")) and state.precision != Precision.AMP_FP16


def gradient_norm(state: State, clip_norm: float | None) -> torch.Tensor | None:
    """The gradients' norm, the gradients clipped to ``clip_norm`` where set, as Composer's ``GradientClipping``
    clips them (each root FSDP module's ``clip_grad_norm_``, else ``torch.nn.utils.clip_grad_norm_``): one pass. None
    where no weight has a gradient. Unclipped under FSDP, this rank's shard's norm: the flag is all-reduced."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    roots = [m for m in state.model.modules() if isinstance(m, FullyShardedDataParallel) and m.check_is_root()]
    if clip_norm is not None and roots:
        return torch.stack([root.clip_grad_norm_(max_norm=clip_norm).float() for root in roots]).max()
    if clip_norm is not None:
        return torch.nn.utils.clip_grad_norm_(state.model.parameters(), max_norm=clip_norm)
    grads = [p.grad for p in state.model.parameters() if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else None
