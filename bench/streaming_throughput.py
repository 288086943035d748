"""Data: Streaming read throughput vs the tiny model's consumption rate (target: at least 30x).

Readers over the same MDS bucket (8192 shapes samples, 32 px PNG), each a full shuffled epoch:
  stream_default  StreamingDataset with its default predownload (shuffle, PNG decode), main process;
  stream          the same with the predownload `dwb train` sets for local data (the whole epoch);
  stream_w2       that through a DataLoader with 2 worker processes;
  loader      the training DataLoader of `dwb train`: decode, crop, tokenize, collate, 0 workers;
  loader_w2   the same with 2 workers.
Consumption: images/s of the tiny model's Composer training step (batch 64, 32 px), same run.
Every reader reads batches of the training batch (--batch).
Run: .venv/bin/python bench/streaming_throughput.py [--steps 30]
Smoke: .venv/bin/python bench/streaming_throughput.py --smoke (256 samples, 7 training steps of 8 images)
"""
from __future__ import annotations

import argparse
import time

from torch.utils.data import DataLoader

from _common import ROOT, RUN, fixtures, parse_args, report
from composer_overhead import WARM, composer_steps


def rate(iterable, count) -> float:
    t0, n = time.perf_counter(), 0
    for item in iterable:
        n += count(item)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="training steps timed for the consumption rate")
    ap.add_argument("--batch", type=int, default=64, help="images per step (the tiny configs' batch)")
    args = parse_args(ap, smoke=dict(steps=WARM + 2, batch=8))
    batch = args.batch

    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    from train.config import load_config
    from train.data.loader import build_dataloader
    from models.datasets.mds import count_samples
    from train.trainer import build_model

    clean_stale_shared_memory()
    data, parts = fixtures(n=8192)
    folder = data / "32"

    def plain(workers: int, predownload: int | None = 1 << 30) -> float:
        ds = StreamingDataset(local=str(folder), shuffle=True, shuffle_seed=workers, batch_size=batch,
                              predownload=predownload)
        if workers == 0:
            return rate(ds, lambda s: (s["image"].load(), 1)[1])
        dl = DataLoader(ds, batch_size=batch, num_workers=workers,
                        collate_fn=lambda b: sum((s["image"].load(), 1)[1] for s in b))
        return rate(dl, int)

    stream_default = {0: plain(0, predownload=None)}
    stream = {w: plain(w) for w in (0, 2)}
    cfg = load_config(ROOT / "configs/tiny-phase2.yaml", [
        f"model.pretrained={parts}", f"data.path={folder}", "load_path=null", "progress_bar=false", "loggers=[]",
        f"save_folder={RUN.out / 'stream-ckpt'}", "save_interval=100000ba", "max_duration=100000ba",
        f"global_train_batch_size={batch}", f"device_train_microbatch_size={batch}"])
    tokenizer = build_model(cfg).tokenizer
    loader = {}
    for workers in (0, 2):
        cfg.data.num_workers = workers
        loader[workers] = rate(build_dataloader(cfg.data, tokenizer, batch, seed=workers), lambda b: len(b["image"]))

    cfg.data.num_workers = 0
    steps = sorted(composer_steps(cfg, args.steps)[WARM:])
    consume = cfg.global_train_batch_size / steps[len(steps) // 2]
    result = {"command": f"python bench/streaming_throughput.py --steps {args.steps} --batch {batch}",
              "dataset": f"{count_samples(folder)} shapes samples, 32 px PNG, shuffled",
              "model_consumes_images_per_s": round(consume, 1), "target": ">= 30x"}
    for name, rates in (("stream_default", stream_default), ("stream", stream), ("loader", loader)):
        for w, r in rates.items():
            key = f"{name}_{w}_workers"
            result[f"{key}_samples_per_s"] = round(r)
            result[f"{key}_ratio"] = round(r / consume, 1)
    report("streaming_throughput", result)


if __name__ == "__main__":
    main()
