"""Evaluation benchmarks: batched vs one-prompt-at-a-time generation, and memory against the number of images.

CPU, tiny checkpoint trained here at 32 px (its quality does not matter for timing or memory):

- batching: the same images (per-image seeds, 32 px, DDIM, guidance 5) generated one prompt per
  pipeline call vs ``--batch-size`` prompts per call, alternating rounds in one process; images/s
  and their ratio (target >= 3x).
- memory: `dwb evaluate run` scoring 1k and then 10k images (shapes prompts, domain FID on the
  shapes scorer, attribute accuracy), each in a fresh process; peak RSS of each from the kernel
  (``ru_maxrss`` of the child), and their ratio (target within 10%: statistics are streamed, images
  are written as they come and never all held).

Per-checkpoint scoring time of the demo is printed by `dwb demo` (its "evaluate" stage and
``eval/results.jsonl``'s ``seconds_checkpoint``).

Not here yet: the GPU figure the issue asks for (a full-size SD2-base pipeline with random weights,
1k images at 512², seconds per checkpoint); this script has no GPU path.

python bench/evaluate_bench.py [--rounds 3] [--images 1000,10000] [--skip-memory]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from _common import OUT, ROOT, fixtures, report


def tiny_checkpoint(data: Path, parts: Path) -> Path:
    from train.config import load_config
    from train.trainer import train

    folder = OUT / "eval-ckpt"
    ckpt = folder / "ep0-ba2-rank0.pt"
    if not ckpt.is_file():
        cfg = load_config(ROOT / "configs/tiny-phase2.yaml", [
            f"model.pretrained={parts}", f"data.path={data / '32'}", f"save_folder={folder}", "max_duration=2ba",
            "save_interval=2ba", "progress_bar=false", "loggers=[]", "load_path=null"])
        train(cfg)
    return ckpt


def scorer(data: Path) -> Path:
    from evaluate.domain import train_scorer

    path = OUT / "eval-scorer.pt"
    if not path.is_file():
        train_scorer(data, path, epochs=1, progress=False)  # accuracy does not matter here
    return path


def batching(ckpt: Path, n: int, batch_size: int, rounds: int, steps: int) -> dict:
    from evaluate.prompts import shapes_prompts
    from evaluate.samples import image_seed
    from train.pipeline import load_pipeline

    pipe = load_pipeline(ckpt)
    pipe.set_progress_bar_config(disable=True)
    prompts = shapes_prompts(n)

    def run(bs: int) -> tuple[float, np.ndarray]:
        t0, out = time.perf_counter(), []
        for s in range(0, n, bs):
            chunk = prompts[s:s + bs]
            gens = [torch.Generator().manual_seed(image_seed(p.index, 0)) for p in chunk]
            out.append(pipe([p.text for p in chunk], num_inference_steps=steps, guidance_scale=5.0, height=32,
                            width=32, generator=gens, output_type="np").images)
        return time.perf_counter() - t0, np.concatenate(out)

    run(batch_size)  # warm-up
    single, batched = [], []
    for r in range(rounds):
        order = ((1, single), (batch_size, batched)) if r % 2 == 0 else ((batch_size, batched), (1, single))
        for bs, times in order:
            t, images = run(bs)
            times.append(t)
            if bs == 1:
                ref = images
            else:
                last = images
    diff = np.abs(ref * 255 - last * 255).max()
    one, many = n / statistics.median(single), n / statistics.median(batched)
    return {"images": n, "steps": steps, "batch_size": batch_size, "rounds": rounds,
            "images_per_s_one_at_a_time": round(one, 2), "images_per_s_batched": round(many, 2),
            "speedup": round(many / one, 2), "max_abs_difference_8bit": round(float(diff), 3)}


def child_peak(args: list[str], log: Path) -> tuple[int, float]:
    """Run `dwb` in a fresh process; (its own peak RSS in bytes, from ``wait4``'s rusage; wall seconds)."""
    import os

    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "dwb", *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(log.read_text()[-2000:])
    return usage.ru_maxrss * 1024, time.perf_counter() - t0  # ru_maxrss is in KiB on Linux


def memory(ckpt: Path, data: Path, scorer_path: Path, sizes: list[int], steps: int) -> dict:
    out = {}
    for n in sorted(sizes):
        folder = OUT / f"eval-memory-{n}"
        if folder.exists():
            import shutil

            shutil.rmtree(folder)
        peak, secs = child_peak(["evaluate", "run", str(ckpt), "--out", str(folder), "--reference",
                                 str(data / "32"), "--scorer", str(scorer_path), "--prompts", "shapes",
                                 "--n-prompts", str(n), "--n-reference", "1000", "--guidance", "5", "--steps",
                                 str(steps), "--batch-size", "64", "--kid-subset-size", "1000"], OUT / f"eval-memory-{n}.log")
        rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
        assert rows[-1]["n_images"] == n
        out[n] = {"peak_rss_mib": round(peak / 2**20, 1), "seconds": round(secs, 1),
                  "images_per_s": round(n / rows[-1]["seconds_total"], 1)}
    lo, hi = min(sizes), max(sizes)
    return {"runs": out, "ratio_peak_rss": round(out[hi]["peak_rss_mib"] / out[lo]["peak_rss_mib"], 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-images", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--images", default="1000,10000")
    p.add_argument("--memory-steps", type=int, default=4, help="sampler steps in the memory runs (speed only)")
    p.add_argument("--skip-memory", action="store_true")
    args = p.parse_args()
    data, parts = fixtures()
    ckpt = tiny_checkpoint(data, parts)
    result = {"command": "python bench/evaluate_bench.py " + " ".join(sys.argv[1:]),
              "batching": batching(ckpt, args.batch_images, args.batch_size, args.rounds, args.steps)}
    print(json.dumps(result["batching"], indent=2), flush=True)
    if not args.skip_memory:
        sizes = [int(x) for x in args.images.split(",")]
        result["memory"] = memory(ckpt, data, scorer(data), sizes, args.memory_steps)
    report("evaluate", result)


if __name__ == "__main__":
    main()
