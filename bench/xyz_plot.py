"""The app's X/Y/Z plot against the same images made as single generations, same run (CPU, tiny checkpoint).

The plot: 2 checkpoints (the tiny checkpoint's EMA and raw weights, two pipelines) x 4 seeds x 2 prompts =
16 cells through ``app.service.Service.xyz_plot``, which generates each checkpoint's 8 cells in one pipeline
call (``--batch`` cells per call). The singles: the same 16 images, one ``Service.generate`` call each. Both
run on one Service whose pipeline cache already holds both pipelines (loading is not what is compared), and
they alternate, round by round. Figure: the median of the per-round ratios singles / plot (target >= 2).

Checks, every round: each cell of the plot equals its single generation up to float rounding in batched
kernels (at most 1 level of 255), and once per run a plot made one cell per call equals them bit for bit.

CPU: python bench/xyz_plot.py [--rounds 5 --steps 25 --size 32]
Smoke: python bench/xyz_plot.py --smoke (2 steps, 1 round: the script runs and the images are equal)
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from _common import ROOT, parse_args, report, tiny_checkpoint  # noqa: F401 - ROOT puts the repo on sys.path

PROMPTS = ("two red circles left of a blue square", "three yellow triangles")
SEEDS = (11, 12, 13, 14)
SAMPLER, GUIDANCE = "DDIM", 5.0  # named for both paths, never left to a default


def pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def plot(service, label: str, params, batch: int):
    axes = [("seed", ", ".join(map(str, SEEDS))), ("prompt", "\n".join(PROMPTS)),
            ("checkpoint", f"{label}\n{label} (raw)")]
    return service.xyz_plot(label, "ema", params, axes, batch)


def singles(service, label: str, params) -> list:
    """The plot's 16 images, in its order (checkpoint, then prompt, then seed), one generation each."""
    from dataclasses import replace

    out = []
    for weights in ("ema", "raw"):
        for prompt in PROMPTS:
            for seed in SEEDS:
                out.append(service.generate(label, weights, replace(params, prompt=prompt, seed=seed)).images[0])
    return out


def worst_difference(cells: list, alone: list) -> int:
    return max(int(np.abs(pixels(a) - pixels(b)).max()) for a, b in zip(cells, alone))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds of each path")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--size", type=int, default=32, help="image size (the tiny checkpoint is trained at 32 px)")
    ap.add_argument("--batch", type=int, default=8, help="cells per pipeline call in the plot")
    args = parse_args(ap, smoke=dict(rounds=1, steps=2))
    from diffusers.utils import logging as diffusers_logging

    from app.generate import GenerationParams, Limits
    from app.service import Service

    diffusers_logging.set_verbosity_error()
    ckpt = tiny_checkpoint()
    service = Service([ckpt.parent], limits=Limits(max_batch=max(8, args.batch)), cache_size=2)
    label = service.checkpoints()[0].label
    params = GenerationParams("", sampler=SAMPLER, steps=args.steps, guidance=GUIDANCE, width=args.size,
                              height=args.size, seed=0)
    alone = singles(service, label, params)  # warm-up: loads both pipelines into the cache
    exact = plot(service, label, params, batch=1).cells.images
    if worst_difference(exact, alone) != 0:
        raise SystemExit("a cell made one per call differs from its single generation")
    plot_t, single_t, ratios, worst = [], [], [], 0
    for r in range(args.rounds):
        order = [("plot", lambda: plot(service, label, params, args.batch).cells.images),
                 ("singles", lambda: singles(service, label, params))]
        times = {}
        for name, fn in order if r % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            images = fn()
            times[name] = time.perf_counter() - t0
            worst = max(worst, worst_difference(images, alone))
        plot_t.append(times["plot"])
        single_t.append(times["singles"])
        ratios.append(times["singles"] / times["plot"])
    if worst > 1:
        raise SystemExit(f"a batched cell differs from its single generation by {worst} levels of 255")
    report("xyz_plot", {
        "command": f"python bench/xyz_plot.py --rounds {args.rounds} --steps {args.steps} --size {args.size} "
                   f"--batch {args.batch}",
        "model": "tiny checkpoint, EMA and raw weights", "cells": "2 checkpoints x 4 seeds x 2 prompts = 16",
        "sampler": SAMPLER, "guidance": GUIDANCE, "steps": args.steps, "size": args.size,
        "cells_per_call": args.batch, "rounds": args.rounds,
        "plot_median_s": round(statistics.median(plot_t), 3), "singles_median_s": round(statistics.median(single_t), 3),
        "ratio_singles_over_plot": round(statistics.median(ratios), 3), "target": ">= 2",
        "cells_equal_singles": "bit for bit one cell per call; batched: at most "
                               f"{worst} level(s) of 255 apart"})


if __name__ == "__main__":
    main()
