"""Run under `composer -n 2`: FSDP training where rank 1 alone sees a NaN loss at batch 2, and rank 0 alone looks
for a checkpoint to resume from (autoresume) for 8 s longer than the ranks' group timeout (``dist_timeout``);
writes, per rank, what its guard counted, the Adam step count of its UNet weights, the group's timeout and the
seconds the rank spent choosing the checkpoint to resume from, as JSON.

usage: fsdp_guard.py OUT CONFIG key=value ...
"""
import json
import math
import os
import sys
import time

import torch
from composer.utils import dist

import models.checkpoints
import train.trainer
from train.config import load_config
from train.trainer import build_trainer

out, config, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
cfg = load_config(config, overrides)
select, resolve, waited = models.checkpoints.select_resume_checkpoint, train.trainer.resolve_resume, []


def slow_select(*args, **kwargs):  # rank 0's real check, after a wait longer than the group's timeout
    time.sleep(cfg.dist_timeout + 8)
    return select(*args, **kwargs)


def timed_resolve(*args, **kwargs):
    start = time.perf_counter()
    try:
        return resolve(*args, **kwargs)
    finally:
        waited.append(time.perf_counter() - start)


if int(os.environ["RANK"]) == 0:
    models.checkpoints.select_resume_checkpoint = slow_select
train.trainer.resolve_resume = timed_resolve
trainer = build_trainer(cfg)
group = torch.distributed.distributed_c10d._get_default_group()
timeout = group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
state, loss = trainer.state, trainer.state.model.loss
nan_here = dist.get_global_rank() == 1
state.model.loss = lambda o, b: loss(o, b) * (math.nan if nan_here and int(state.timestamp.batch) == 2 else 1.0)
trainer.fit()
guard = next(a for a in state.algorithms if type(a).__name__ == "NonFiniteGuard")
steps = sorted({int(s["step"]) for s in state.optimizers[0].state.values() if "step" in s})
with open(f"{out}.rank{dist.get_global_rank()}", "w") as f:
    json.dump({"skipped": guard.skipped, "consecutive": guard.consecutive, "adam_steps": steps,
               "group_timeout": timeout, "resume_choice_seconds": waited}, f)
trainer.close()
