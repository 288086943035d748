"""Step time and peak memory of a LoRA run against a full fine-tune of the same base, same machine, one run.

Both start from the same tiny base written by diffusers' save_pretrained (the reduced SD 2 pipeline of
tests/checkpoints/fixtures.py; with --family flux, the tiny Flux.1-dev of tests/family_fixtures.py) through
`model.init_from`, on the same shapes data at 16 px, with the same batch, AdamW, EMA and everything else; the LoRA run
adds `adapter.type=lora` (the family's preset targets, rank 4). Each run is `train.trainer.build_trainer` in a child
process of its own (its peak resident memory is its own), the two alternating over --rounds rounds (ABAB: drifts of a
shared machine fall on both). Reported per kind: the median step time over the timed batches (after --warmup),
the trained weights, and the peak memory: the child's peak resident set over what it held before the trainer was
built (CPU), or the CUDA allocator's peak (GPU).

CPU:   python bench/lora_vs_full.py                   (SD 2, 3 rounds of 20 timed batches of 16)
Smoke: python bench/lora_vs_full.py --smoke           (1 round, 2 timed batches)
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, RUN, fit_batch_end_times, parse_args, report


def base_folder(family: str) -> Path:
    """The tiny base, written once under the output folder."""
    out = RUN.out / f"lora-base-{family}"
    if not (out / "model_index.json").is_file():
        import torch

        torch.manual_seed(0)
        if family == "sd2":
            from tests.checkpoints.fixtures import reduced_pipeline

            reduced_pipeline("sd2").save_pretrained(out)
        else:
            from tests.family_fixtures import write_flux

            write_flux(out, RUN.out / "lora-base-tokenizers")
    return out


def shapes(n: int) -> Path:
    from train.shapes import write_shapes_dataset

    out = RUN.out / f"lora-shapes-{n}"
    if not (out / "16").is_dir():
        write_shapes_dataset(out, n, seed=5, sizes=(16,), n_eval=0, progress=False)
    return out / "16"


def child(args) -> None:
    """One run: build the trainer, fit warm-up + timed batches, print the figures as JSON."""
    import torch

    from train.config import load_config
    from train.trainer import build_trainer

    keys = [f"model.init_from={args.base}", f"data.path={args.data}", "data.resolution=16",
            f"save_folder={RUN.out}/lora-runs/{args.kind}-{time.time_ns()}", f"global_train_batch_size={args.batch}",
            f"device_train_microbatch_size={args.batch}", "save_interval=100000ba", "ema.enabled=true",
            "ema.smoothing=0.99", "eval_interval=null", "progress_bar=false", "loggers=[]", "scheduler.t_warmup=0ba",
            f"max_duration={args.warmup + args.timed}ba", *(["adapter.type=lora"] if args.kind == "lora" else [])]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trainer = build_trainer(load_config(None, keys))
    model = trainer.state.model
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    ends = fit_batch_end_times(trainer, args.warmup + args.timed, sync=torch.cuda.synchronize if gpu else None)
    steps = [b - a for a, b in zip(ends[args.warmup - 1:], ends[args.warmup:])]
    peak = torch.cuda.max_memory_allocated() if gpu else \
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    print(json.dumps({"kind": args.kind, "step_s": statistics.median(steps), "trained": trained,
                      "peak_bytes": peak, "memory": "cuda peak allocated" if gpu else "peak RSS growth"}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=("sd2", "flux"), default="sd2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timed", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--child", choices=("full", "lora"), help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = parse_args(ap, smoke=dict(rounds=1, warmup=1, timed=2, batch=4))
    if args.child:
        args.kind = args.child
        return child(args)
    base, data = base_folder(args.family), shapes(max(64, args.batch * (args.warmup + args.timed)))
    runs = {"full": [], "lora": []}
    for _ in range(args.rounds):
        for kind in ("full", "lora"):
            cmd = [sys.executable, str(Path(__file__)), "--child", kind, "--base", str(base), "--data", str(data),
                   "--out", str(RUN.out), "--warmup", str(args.warmup), "--timed", str(args.timed),
                   "--batch", str(args.batch)]
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if done.returncode:
                sys.exit(f"the {kind} run failed:\n{done.stderr[-3000:]}")
            runs[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
    summary = {kind: {"step_ms": round(1000 * statistics.median(r["step_s"] for r in rs), 1),
                      "peak_mib": round(max(r["peak_bytes"] for r in rs) / 2**20, 1), "trained": rs[0]["trained"],
                      "memory": rs[0]["memory"]} for kind, rs in runs.items()}
    lora, full = summary["lora"], summary["full"]
    ratios = {"step": round(lora["step_ms"] / full["step_ms"], 3),
              "peak": round(lora["peak_mib"] / full["peak_mib"], 3)}
    report("lora_vs_full", {"family": args.family, "rounds": args.rounds, "timed_batches": args.timed,
                            "batch": args.batch, **summary, "lora_over_full": ratios, "runs": runs})


if __name__ == "__main__":
    main()
