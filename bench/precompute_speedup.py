"""Precomputed latents vs on-the-fly encoding: the same training step through `dwb train`, same run.

Same tiny model, same shapes data (32 px, batch 64), same Composer Trainer: one run reads images and
captions and encodes them with the frozen VAE and text encoder at every step; the other reads the
latents and text states `dwb data precompute` stored (fp16). Both name the same lr schedule (warm-up
then constant). They alternate in one process; the figure is the median step time and its ratio.

Run: .venv/bin/python bench/precompute_speedup.py [--steps 40 --rounds 3]
Smoke: .venv/bin/python bench/precompute_speedup.py --smoke (256 samples, 7 steps of 8 images, 1 round)
"""
from __future__ import annotations

import argparse
import statistics
import time

from _common import ROOT, RUN, fixtures, parse_args, report
from composer_overhead import WARM, composer_steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64, help="images per step (the tiny configs' batch)")
    args = parse_args(ap, smoke=dict(steps=WARM + 2, rounds=1, batch=8))

    from train.config import load_config
    from train.data.precompute import precompute_latents

    data, parts = fixtures()
    latents = RUN.out / "precomputed-latents"
    t0 = time.perf_counter()
    summary = precompute_latents(str(data), str(latents), vae_ref=str(parts), text_encoder_ref=str(parts), resolutions=[32],
                         batch_size=64, progress=False)[0]
    precompute_s = time.perf_counter() - t0
    common = [f"model.pretrained={parts}", "data.resolution=32", "load_path=null", "progress_bar=false", "loggers=[]",
              f"save_folder={RUN.out / 'speedup-ckpt'}", "save_interval=1000000ba", "max_duration=1000000ba",
              "scheduler.name=constant_with_warmup", f"global_train_batch_size={args.batch}",
              f"device_train_microbatch_size={args.batch}"]
    raw = load_config(ROOT / "configs/tiny-phase2.yaml", common + [f"data.path={data / '32'}"])
    pre = load_config(ROOT / "configs/tiny-phase2.yaml", common + [f"data.path={latents / '32'}", "data.precomputed=true"])
    a, b = [], []
    for _ in range(args.rounds):
        a += composer_steps(raw, args.steps)[WARM:]
        b += composer_steps(pre, args.steps)[WARM:]
    ra, rb = statistics.median(a), statistics.median(b)
    report("precompute_speedup", {
        "command": f"python bench/precompute_speedup.py --steps {args.steps} --rounds {args.rounds} "
                   f"--batch {args.batch}",
        "batch": raw.global_train_batch_size, "resolution": 32, "steps_timed_each": len(a),
        "on_the_fly_median_step_ms": round(1e3 * ra, 1), "precomputed_median_step_ms": round(1e3 * rb, 1),
        "speedup": round(ra / rb, 3),
        "precompute_samples": summary["samples"], "precompute_seconds": round(precompute_s, 1),
        "precompute_images_per_s": round(summary["samples"] / precompute_s, 1) if not summary["already_done"] else None,
    })


if __name__ == "__main__":
    main()
