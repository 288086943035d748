"""What `dwb demo` runs: its sizes, and how its grids and scores generate. Light to import (`dwb --help` shows it)."""
from __future__ import annotations

from models.generation import DEFAULT_SAMPLER, DEFAULT_WEIGHTS

# Guidance of the grids and the scores, where the demo differs from the workbench's defaults
# (models.generation.DEFAULT_GUIDANCE): the tiny model's attribute accuracy peaks near 3 and falls at
# higher scales (measured: BENCHMARKS.md, "The demo's scores"). Sampler and weights are the defaults.
GUIDANCE = 3.0

# Phase lengths, batch and resolution come from configs/tiny-phase{1,2}.yaml; --quick shrinks them.
FULL = dict(n=12000, n_eval=1000, vae_steps=1200, steps=20, scorer_epochs=4, score_prompts=256, train=[])
QUICK = dict(n=256, n_eval=32, vae_steps=10, steps=4, scorer_epochs=1, score_prompts=8,
             train=["max_duration=4ba", "save_interval=2ba", "global_train_batch_size=16", "device_train_microbatch_size=16",
                    "eval_interval=2ba"])


def generation(quick: bool = False) -> dict:
    """How the demo's grids and scores generate: its guidance and steps, the workbench's sampler and weights."""
    return {"guidance": GUIDANCE, "steps": (QUICK if quick else FULL)["steps"], "sampler": DEFAULT_SAMPLER,
            "weights": DEFAULT_WEIGHTS}
