"""Precomputed latents vs on-the-fly encoding: the same training step through `dwb train`, same run.

Same tiny model, same shapes data (32 px, batch 64), same Composer Trainer: one run reads images and
captions and encodes them with the frozen VAE and text encoder at every step; the other reads the
latents and text states `dwb data precompute` stored (fp16). They alternate in one process; the
figure is the median step time and its ratio.

Run: .venv/bin/python bench/precompute_speedup.py [--steps 40 --rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

from _common import OUT, ROOT, fit_batch_end_times, fixtures, report


def step_times(cfg, steps: int) -> list[float]:
    from train.trainer import build_trainer

    times = fit_batch_end_times(build_trainer(cfg), steps)
    return [b - a for a, b in zip(times, times[1:])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from train.config import load_config
    from train.precompute import precompute

    data, parts = fixtures()
    latents = OUT / "precomputed-latents"
    t0 = time.perf_counter()
    summary = precompute(str(data), str(latents), vae_ref=str(parts), text_encoder_ref=str(parts), resolutions=[32],
                         batch_size=64, progress=False)[0]
    precompute_s = time.perf_counter() - t0
    common = [f"model.pretrained={parts}", "data.resolution=32", "load_path=null", "progress_bar=false", "loggers=[]",
              f"save_folder={OUT / 'speedup-ckpt'}", "save_interval=1000000ba", "max_duration=1000000ba"]
    raw = load_config(ROOT / "configs/tiny-phase2.yaml", common + [f"data.path={data / '32'}"])
    pre = load_config(ROOT / "configs/tiny-phase2.yaml", common + [f"data.path={latents / '32'}", "data.precomputed=true"])
    warm = 5
    a, b = [], []
    for _ in range(args.rounds):
        a += step_times(raw, args.steps)[warm:]
        b += step_times(pre, args.steps)[warm:]
    ra, rb = statistics.median(a), statistics.median(b)
    report("precompute_speedup", {
        "command": f"python bench/precompute_speedup.py --steps {args.steps} --rounds {args.rounds}",
        "batch": raw.global_train_batch_size, "resolution": 32, "steps_timed_each": len(a),
        "on_the_fly_median_step_ms": round(1e3 * ra, 1), "precomputed_median_step_ms": round(1e3 * rb, 1),
        "speedup": round(ra / rb, 3),
        "precompute_samples": summary["samples"], "precompute_seconds": round(precompute_s, 1),
        "precompute_images_per_s": round(summary["samples"] / precompute_s, 1) if not summary["already_done"] else None,
    })


if __name__ == "__main__":
    main()
