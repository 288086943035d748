"""Composer overhead: the tiny training step through `dwb train`'s Composer path vs a bare PyTorch loop.

Both run the same math on the same model, data loader and batch: VAE + text encoding, noise, UNet
forward/backward, gradient clipping, AdamW, warm-up then constant lr and an EMA update (the lr schedule
is named in the config overrides, so the Composer side cannot drift to another one). They alternate
(A B A B ...) in one process so machine noise hits both; the figure is the median step time.
Target: ratio <= 1.15.   Run: .venv/bin/python bench/composer_overhead.py [--steps 60 --rounds 3]
Smoke: .venv/bin/python bench/composer_overhead.py --smoke (7 steps of 8 images, 1 round, small data)
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from _common import ROOT, RUN, fit_batch_end_times, fixtures, parse_args, report

WARM = 5  # first steps include one-off costs (allocations, worker start) in both paths: not timed


def composer_steps(cfg, steps: int) -> list[float]:
    from train.trainer import build_trainer

    times = fit_batch_end_times(build_trainer(cfg), steps)
    return [b - a for a, b in zip(times, times[1:])]


def bare_steps(cfg, steps: int) -> list[float]:
    from train.data.loader import build_dataloader
    from train.trainer import build_model

    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    model.train()
    loader = build_dataloader(cfg.data, model.tokenizer, cfg.global_train_batch_size, cfg.seed)
    params = list(model.unet.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.optimizer.lr, weight_decay=cfg.optimizer.weight_decay)
    warmup = int(cfg.scheduler.t_warmup.rstrip("ba"))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    ema = [p.detach().clone() for p in params]
    times, it = [], iter(loader)
    for _ in range(steps):
        batch = next(it)
        loss = model.loss(model(batch), batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip_norm)
        opt.step()
        sched.step()
        with torch.no_grad():
            torch._foreach_lerp_(ema, params, 1 - cfg.ema.smoothing)
        times.append(time.perf_counter())
    return [b - a for a, b in zip(times, times[1:])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--resolution", type=int, default=32)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64, help="images per step (the tiny configs' batch)")
    args = parse_args(ap, smoke=dict(steps=WARM + 2, rounds=1, batch=8))

    from train.config import load_config

    data, parts = fixtures()
    res = args.resolution
    cfg = load_config(ROOT / "configs/tiny-phase2.yaml", [
        f"model.pretrained={parts}", f"data.path={data / str(res)}", f"data.resolution={res}", "load_path=null",
        f"save_folder={RUN.out / 'overhead-ckpt'}", "save_interval=100000ba", "progress_bar=false", "loggers=[]",
        "max_duration=100000ba", f"data.num_workers={args.num_workers}", "scheduler.name=constant_with_warmup",
        f"global_train_batch_size={args.batch}", f"device_train_microbatch_size={args.batch}"])
    comp, bare = [], []
    for _ in range(args.rounds):
        comp += composer_steps(cfg, args.steps)[WARM:]
        bare += bare_steps(cfg, args.steps)[WARM:]
    c, b = statistics.median(comp), statistics.median(bare)
    report("composer_overhead", {
        "command": f"python bench/composer_overhead.py --steps {args.steps} --rounds {args.rounds} --resolution {res} "
                   f"--num-workers {args.num_workers} --batch {args.batch}",
        "batch": cfg.global_train_batch_size, "resolution": res, "steps_timed_each": len(comp),
        "composer_median_step_ms": round(1e3 * c, 1), "bare_median_step_ms": round(1e3 * b, 1),
        "composer_mean_step_ms": round(1e3 * statistics.mean(comp), 1), "bare_mean_step_ms": round(1e3 * statistics.mean(bare), 1),
        "ratio_median": round(c / b, 3), "target": "<= 1.15",
    })


if __name__ == "__main__":
    main()
