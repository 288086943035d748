"""What each rank holds, counted, beside what the memory plan said it would hold: ``memory/rank{r}.json`` in the run
folder, so the plan a run was admitted with (``train.trainer.check_memory``) can be checked against the run itself.

At each batch's end a rank counts the bytes of the tensors it holds, by what they are: the denoiser's weights
(its FSDP shards where it is sharded) and their gradients, DDP's gradient buckets with them
(``train.patches.fsdp.ddp_bucket_bytes``), AdamW's state, the EMA (this rank's shards under FSDP), the frozen parts
(every other parameter and buffer of the model) and the full copy of the denoiser previews drew with at this batch
(``Previews.copy_held``). Tensors are counted by storage, once each: FSDP's original parameters and their gradients
are views of a flat shard, which is counted whole, padding included. The file is rewritten while the count grows
and until every part the plan counts is held (EMA started, a preview drawn), then left as it is. Activations and
what a step gathers for a moment are not counted, as the plan does not count them.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from composer.core import Callback, State
from composer.loggers import Logger

from models.common import write_text_whole

from .validation import ema_of, unwrap

log = logging.getLogger(__name__)


class _Count:
    """Bytes and values by part, each storage counted once, in the first part it is met in."""

    def __init__(self):
        self.bytes: dict[str, int] = {}
        self.values: dict[str, int] = {}
        self.seen: set[int] = set()

    def add(self, part: str, tensors) -> None:
        self.bytes.setdefault(part, 0)
        self.values.setdefault(part, 0)
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.is_meta:
                continue
            storage = t.untyped_storage()
            if storage.nbytes() == 0 or storage.data_ptr() in self.seen:
                continue
            self.seen.add(storage.data_ptr())
            self.bytes[part] += storage.nbytes()
            self.values[part] += storage.nbytes() // t.element_size()


def ema_tensors(state: State) -> list[torch.Tensor]:
    """The tensors the EMA holds on this rank: a sharded EMA's (``train.ema.ShardedEMA.tensors``) or Composer's."""
    ema = ema_of(state)
    if ema is None or not ema.ema_started:
        return []
    held = ema.ema_model
    if hasattr(held, "tensors"):
        return held.tensors()
    return [*held.named_parameters_dict.values(), *held.named_buffers_dict.values()]


def held_tensors(state: State, preview_bytes: int) -> _Count:
    """This rank's tensors by what they are (see above), in bytes and values."""
    from ..patches.fsdp import ddp_bucket_bytes

    model = unwrap(state.model)
    denoiser = list(model.denoiser.parameters())
    count = _Count()
    count.add("weights", [*denoiser, *model.denoiser.buffers()])
    count.add("gradients", [p.grad for p in denoiser if p.grad is not None])
    buckets = ddp_bucket_bytes(state.model)
    count.bytes["gradients"] += buckets
    count.values["gradients"] += buckets // 4  # float32 gradients
    count.add("optimizer", [t for opt in state.optimizers for s in opt.state.values() for t in s.values()])
    count.add("ema", ema_tensors(state))
    count.add("frozen", [*model.parameters(), *model.buffers()])
    count.bytes["preview"] = preview_bytes  # its values are not kept: the copy is in the dtype previews draw in
    return count


class MemoryReport(Callback):
    """Writes this rank's count beside its plan (see above): ``plan``, the plan's figures for this rank by part."""

    def __init__(self, folder: str | Path, plan: dict[str, int]):
        self.folder, self.plan = Path(folder), dict(plan)
        self.written = -1
        self.done = False

    def batch_end(self, state: State, logger: Logger) -> None:
        from composer.utils import dist

        if self.done:
            return
        batch = int(state.timestamp.batch)
        drawn = [c.copy_held[1] for c in state.callbacks if getattr(c, "copy_held", (None,))[0] == batch]
        count = held_tensors(state, sum(drawn))
        total = sum(count.bytes.values())
        self.done = all(count.bytes.get(part, 0) > 0 for part, planned in self.plan.items() if planned > 0)
        if total <= self.written and not self.done:
            return
        self.written = total
        rank = dist.get_global_rank()
        report = {"rank": rank, "batch": batch, "plan": self.plan, "held": count.bytes,
                  "held_values": count.values, "complete": self.done}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_text_whole(self.folder / f"rank{rank}.json", json.dumps(report, indent=1))
        except OSError as e:  # a report is no reason to stop training
            log.warning("warning: the memory report %s was not written (%s); no more are", self.folder, e)
            self.done = True
