"""Checkpoint saves under FSDP on CPU ranks: full state dicts (gathered on rank 0, one file) against sharded ones
(every rank writes its own part through torch.distributed.checkpoint), side by side in one launch.

`composer -n RANKS` runs this script's worker: each rank builds `dwb train`'s trainer on configs/tiny-phase1.yaml
with FULL_SHARD and a widened tiny UNet (``--width``: the first block's channels, the second twice as many),
trains one batch, then alternates full and sharded saves of the same state, ``--rounds`` times. Each save is timed
between barriers, and each rank samples its resident memory every millisecond during it: the peak above the
resident memory before the save is its extra memory. The report gives medians and the ratios sharded / full (of
the time, of rank 0's extra memory, of the largest extra memory of any rank). Its equality check: the last
sharded checkpoint, consolidated by the readers, holds the same weights as the last full one.

  python bench/sharded_checkpoints.py [--ranks 2] [--rounds 5] [--width 256]
  python bench/sharded_checkpoints.py --smoke      # 2 ranks, 1 round, width 32
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from _common import ROOT, RUN, fixtures, parse_args, report

PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakMemory:
    """The largest resident memory seen while inside the block, sampled every millisecond by a thread."""

    def __enter__(self):
        self.base = self.peak = resident_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, resident_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, resident_bytes())

    @property
    def extra(self) -> int:
        return self.peak - self.base


def worker(out: Path, rounds: int, width: int, data: str, parts: str) -> None:
    """One rank: build, train a batch, then full and sharded saves in turn; this rank's figures as JSON."""
    import gc

    from composer.utils import checkpoint, dist

    from train.config import load_config
    from train.trainer import build_trainer

    unet = f"{{block_out_channels: [{width}, {2 * width}], norm_num_groups: 8, attention_head_dim: 8}}"
    cfg = load_config(ROOT / "configs/tiny-phase1.yaml", [
        f"model.pretrained={parts}", f"data.path={data}/16", "data.resolution=16", f"model.unet={unet}",
        f"save_folder={out / 'unused'}", "max_duration=1ba", "save_interval=1000ba", f"global_train_batch_size={4 * int(os.environ['WORLD_SIZE'])}",
        "device_train_microbatch_size=4", "progress_bar=false", "loggers=[]", "eval_interval=null",
        "fsdp=true", "fsdp_sharding_strategy=FULL_SHARD", "scheduler.t_warmup=1ba"])
    trainer = build_trainer(cfg)
    trainer.fit()
    state, rank = trainer.state, dist.get_global_rank()
    figures: dict[str, list] = {"full_s": [], "sharded_s": [], "full_extra": [], "sharded_extra": []}
    for r in range(rounds):
        for kind in ("full", "sharded"):
            state.fsdp_config.state_dict_type = kind
            # a sharded save is a folder named as Composer names it (sharded-R/ep0-ba1/) beside the file's name
            name = out / "saves" / (f"{kind}-{r}-rank{{rank}}.pt" if kind == "full" else f"{kind}-{r}/x")
            gc.collect()
            dist.barrier()
            with PeakMemory() as memory:
                t0 = time.perf_counter()
                checkpoint.save_checkpoint(state, str(name).format(rank=rank))
                dist.barrier()
                seconds = time.perf_counter() - t0
            figures[f"{kind}_s"].append(seconds)
            figures[f"{kind}_extra"].append(memory.extra)
    (out / f"rank{rank}.json").write_text(json.dumps(figures))
    trainer.close()


def same_weights(saves: Path, rounds: int) -> bool:
    import torch

    from models.checkpoints import model_weights, read_checkpoint

    full = model_weights(read_checkpoint(saves / f"full-{rounds - 1}-rank0.pt"))
    sharded = model_weights(read_checkpoint(saves / f"sharded-{rounds - 1}" / "ep0-ba1"))
    return full.keys() == sharded.keys() and all(torch.equal(full[k], sharded[k]) for k in full)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--width", type=int, default=256, help="the UNet's first block channels (tiny: 32)")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--parts", help=argparse.SUPPRESS)
    args = parse_args(ap, smoke={"rounds": 1, "width": 32})
    if args.worker:
        worker(args.worker, args.rounds, args.width, args.data, args.parts)
        return 0
    data, parts = fixtures()
    out = RUN.out / "sharded-checkpoints"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    launch = [str(Path(sys.executable).parent / "composer"), "-n", str(args.ranks), __file__, "--worker", str(out),
              "--rounds", str(args.rounds), "--width", str(args.width), "--data", str(data), "--parts", str(parts),
              *(["--smoke"] if RUN.smoke else []), "--out", str(RUN.out)]
    # glibc's mmap threshold fixed: every large buffer is mapped and unmapped on its own, so resident memory
    # follows what a save holds (with the default dynamic threshold a freed buffer stays resident for reuse
    # and the second save of a round measured 0 extra)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 17)}
    done = subprocess.run(launch, cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
        return 1
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(args.ranks)]
    med = {k: statistics.median(ranks[0][k]) for k in ranks[0]}
    largest = {kind: max(statistics.median(r[f"{kind}_extra"]) for r in ranks) for kind in ("full", "sharded")}
    equal = same_weights(out / "saves", args.rounds)
    result = {
        "ranks": args.ranks, "rounds": args.rounds, "unet_width": args.width, "sharding": "FULL_SHARD",
        "median_save_s": {"full": med["full_s"], "sharded": med["sharded_s"]},
        "rank0_extra_mib": {"full": med["full_extra"] / 2**20, "sharded": med["sharded_extra"] / 2**20},
        "largest_rank_extra_mib": {k: v / 2**20 for k, v in largest.items()},
        "bytes_on_disk": {"full": folder_bytes(out / "saves" / f"full-{args.rounds - 1}-rank0.pt"),
                          "sharded": folder_bytes(out / "saves" / f"sharded-{args.rounds - 1}" / "ep0-ba1")},
        "ratio_sharded_over_full": {
            "save_time": med["sharded_s"] / med["full_s"],
            "rank0_extra_memory": med["sharded_extra"] / max(med["full_extra"], 1),
            "largest_rank_extra_memory": largest["sharded"] / max(largest["full"], 1)},
        "same_weights_consolidated": equal,
    }
    report("sharded_checkpoints", result)
    subprocess.run(["rm", "-rf", str(out / "saves")], check=True)  # 2 GB a round at the default width
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
