"""Run under `composer -n 2`: FSDP training where rank 1 alone sees a NaN loss at batch 2; writes, per rank,
what its guard counted and the Adam step count of its UNet weights, as JSON.

usage: fsdp_guard.py OUT CONFIG key=value ...
"""
import json
import math
import sys

from composer.utils import dist

from train.config import load_config
from train.trainer import build_trainer

out, config, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
trainer = build_trainer(load_config(config, overrides))
state, loss = trainer.state, trainer.state.model.loss
nan_here = dist.get_global_rank() == 1
state.model.loss = lambda o, b: loss(o, b) * (math.nan if nan_here and int(state.timestamp.batch) == 2 else 1.0)
trainer.fit()
guard = next(a for a in state.algorithms if type(a).__name__ == "NonFiniteGuard")
steps = sorted({int(s["step"]) for s in state.optimizers[0].state.values() if "step" in s})
with open(f"{out}.rank{dist.get_global_rank()}", "w") as f:
    json.dump({"skipped": guard.skipped, "consecutive": guard.consecutive, "adam_steps": steps}, f)
trainer.close()
