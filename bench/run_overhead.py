"""What watching a run costs: validation loss and previews at the default intervals of the tiny demo's configs,
as a share of training time, measured side by side in one process; and the share at SD2-base size, estimated
from the measured step costs.

For each tiny phase (configs/tiny-phase{1,2}.yaml: batch 64, 16 and 32 px, EMA on, images encoded on the fly):
rounds of [train k batches, one validation pass (raw and EMA weights, the configs' held-out defaults), one
preview grid (the default prompts x seeds)] on the same trainer; the medians give seconds per batch,
validation and preview, and the share over a phase is

    (batches / eval_interval x validation + batches / preview_interval x preview) / (batches x batch).

SD2-base (configs/sd2-base-phase{1,2}.yaml): a validation pass is max_samples x timesteps UNet forwards (x2 with
EMA) and a preview prompts x seeds x steps x 2 (guidance) forwards; a training sample is a forward and a
backward (3 forwards' FLOPs). The estimate divides those forward counts, with the tiny model's measured cost of
a held-out forward relative to a training sample, by the training samples between two of them.

  python bench/run_overhead.py [--rounds 3] [--batches 10]
  python bench/run_overhead.py --smoke        # seconds: phase 1 only, 1 round of 2 batches, 8 held-out samples
"""
from __future__ import annotations

import argparse
import statistics
import time

from _common import ROOT, RUN, fixtures, parse_args, report


class BatchClock:
    """The wall-clock time at each batch's end (a Composer callback; the trainer fits again after each round)."""

    def __new__(cls):
        from composer.core import Callback

        class Clock(Callback):
            def __init__(self):
                self.t: list[float] = []

            def batch_end(self, state, logger):
                self.t.append(time.perf_counter())

        return Clock()


def held_out() -> str:
    from train.shapes import write_shapes_dataset

    folder = RUN.out / "held-out"
    if not (folder / "eval" / "32" / "index.json").is_file():
        write_shapes_dataset(folder, 16, seed=1, sizes=(32,), n_eval=64, progress=False)
    return str(folder / "eval" / "32")


def phase_costs(phase: str, rounds: int, batches: int, max_samples: int | None) -> dict:
    from train.config import load_config
    from train.trainer import build_trainer

    data, parts = fixtures()
    cfg = load_config(ROOT / f"configs/tiny-{phase}.yaml", [
        f"model.pretrained={parts}", f"save_folder={RUN.out / 'run-overhead' / phase / 'checkpoints'}",
        "load_path=null", "progress_bar=false", "loggers=[]", "save_interval=100000ba", "max_duration=100000ba"])
    cfg.data.path = str(data / str(cfg.data.resolution))
    cfg.validation.path = held_out()
    if max_samples:
        cfg.validation.max_samples = max_samples
    defaults = {"eval_interval": int(cfg.eval_interval[:-2]), "preview_interval": int(cfg.preview_interval[:-2])}
    trainer = build_trainer(cfg)
    callbacks = {type(c).__name__: c for c in trainer.state.callbacks}
    clock = BatchClock()
    trainer.state.callbacks.append(clock)
    trainer.fit(duration="2ba")  # warm-up: first batches, EMA started
    step, val, prev = [], [], []
    for _ in range(rounds):
        clock.t = []
        trainer.fit(duration=f"{batches}ba")
        step += [b - a for a, b in zip(clock.t, clock.t[1:])]
        t0 = time.perf_counter()
        callbacks["ValidationLoss"].measure(trainer.state)
        t1 = time.perf_counter()
        callbacks["Previews"].draw(trainer.state, "bench")
        t2 = time.perf_counter()
        val.append(t1 - t0)
        prev.append(t2 - t1)
    trainer.close()
    batch_s, val_s, prev_s = statistics.median(step), statistics.median(val), statistics.median(prev)
    share = (val_s / defaults["eval_interval"] + prev_s / defaults["preview_interval"]) / batch_s
    v = cfg.validation
    forwards = v.max_samples * len(v.timesteps) * (2 if cfg.ema.enabled else 1)
    return {"resolution": cfg.data.resolution, "batch": cfg.global_train_batch_size, **defaults,
            "seconds_per_batch": round(batch_s, 4), "seconds_per_validation": round(val_s, 4),
            "seconds_per_preview": round(prev_s, 4), "overhead_share": round(share, 4),
            # a held-out forward's cost relative to one training sample's (forward + backward + optimizer)
            "forward_vs_training_sample": round((val_s / forwards) / (batch_s / cfg.global_train_batch_size), 3)}


def sd2_estimate(forward_ratio: float) -> dict:
    """Share at SD2-base size with the configs' intervals, from forward counts (see the module's docstring)."""
    from train.config import load_config

    out = {}
    for phase in ("phase1", "phase2"):
        cfg = load_config(ROOT / f"configs/sd2-base-{phase}.yaml")
        v, p = cfg.validation, cfg.previews
        validation = v.max_samples * len(v.timesteps) * (2 if cfg.ema.enabled else 1)
        preview = len(p.prompts) * len(p.seeds) * p.steps * 2
        per_batch = cfg.global_train_batch_size
        eval_every, preview_every = int(cfg.eval_interval[:-2]), int((cfg.preview_interval or cfg.save_interval)[:-2])
        share = forward_ratio * (validation / eval_every + preview / preview_every) / per_batch
        out[phase] = {"eval_interval": eval_every, "preview_interval": preview_every,
                      "validation_forwards": validation, "preview_forwards": preview, "estimated_share": share}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=10, help="training batches per round")
    ap.add_argument("--max-samples", type=int, help="held-out samples (default: the configs')")
    ap.add_argument("--phases", nargs="+", choices=("phase1", "phase2"), default=["phase1", "phase2"])
    args = parse_args(ap, smoke=dict(rounds=1, batches=2, max_samples=8, phases=["phase1"]))
    phases = {phase: phase_costs(phase, args.rounds, args.batches, args.max_samples) for phase in args.phases}
    ratio = max(p["forward_vs_training_sample"] for p in phases.values())
    report("run_overhead", {"rounds": args.rounds, "batches_per_round": args.batches, "tiny": phases,
                            "sd2_base": sd2_estimate(ratio), "forward_ratio_used": ratio})


if __name__ == "__main__":
    main()
