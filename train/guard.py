"""Skipping batches whose loss or gradients are not finite, and stopping a run that keeps producing them.

A NaN or infinite loss (or gradient) on any rank makes every rank drop that batch's update: the
gradients are cleared before the optimizer steps, so AdamW leaves weights and moments untouched.
Each skip is counted and logged (``train/nonfinite_skipped``); ``limit`` skips in a row abort the
run with one line, since by then the model or the data is broken and more steps only waste time.
The counters are part of the checkpoint, so they survive a resume.
"""
from __future__ import annotations

import logging

import torch
from composer.core import Algorithm, Event, State
from composer.loggers import Logger
from composer.utils import dist

from models.errors import WorkbenchError

log = logging.getLogger(__name__)


class NonFiniteGuard(Algorithm):
    def __init__(self, limit: int = 10):
        self.limit = limit
        self.skipped = 0
        self.consecutive = 0
        self._bad_loss = False

    def match(self, event: Event, state: State) -> bool:
        return event in (Event.BATCH_START, Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH)

    def apply(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.BATCH_START:
            self._bad_loss = False
        elif event == Event.AFTER_BACKWARD:  # once per microbatch
            loss = state.loss
            losses = loss.values() if isinstance(loss, dict) else (loss if isinstance(loss, (list, tuple)) else [loss])
            self._bad_loss = self._bad_loss or any(not torch.isfinite(l.detach()).all() for l in losses)
        else:  # AFTER_TRAIN_BATCH: gradients complete (all-reduced), optimizer not yet stepped
            grads = [p.grad for p in state.model.parameters() if p.grad is not None]
            bad = self._bad_loss
            if grads and not bad:
                bad = not bool(torch.isfinite(torch.stack(torch._foreach_norm(grads))).all())
            flag = torch.tensor([1.0 if bad else 0.0], device=grads[0].device if grads else "cpu")
            dist.all_reduce(flag, reduce_operation="MAX")  # every rank skips, or none does
            if flag.item() > 0:
                for p in state.model.parameters():
                    p.grad = None  # AdamW skips parameters without gradients: no update, no moment change
                self.skipped += 1
                self.consecutive += 1
                log.warning("batch %d: non-finite loss or gradients, update skipped (%d in a row, %d in all)",
                            int(state.timestamp.batch) + 1, self.consecutive, self.skipped)
                if self.consecutive >= self.limit:
                    raise WorkbenchError(f"the loss or gradients were not finite for {self.consecutive} batches in a row "
                                         f"(up to batch {int(state.timestamp.batch) + 1}); stopping. Resume from the last "
                                         f"checkpoint with a lower lr, or check the data")
            else:
                self.consecutive = 0
            logger.log_metrics({"train/nonfinite_skipped": self.skipped})

    def state_dict(self) -> dict:
        return {"skipped": self.skipped, "consecutive": self.consecutive}

    def load_state_dict(self, state: dict, strict: bool = False) -> None:
        self.skipped = int(state.get("skipped", 0))
        self.consecutive = int(state.get("consecutive", 0))
