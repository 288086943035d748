"""Data: Streaming read throughput vs the tiny model's consumption rate (target: at least 30x).

Three readers over the same MDS bucket (32 px shapes), each a full pass:
  raw     StreamingDataset samples (MDS read + PNG decode);
  loader  the training DataLoader of `dwb train` (decode, crop to tensor, tokenize, collate), 0 workers;
  loader2 the same with 2 worker processes.
Consumption: images/s of the tiny model's Composer training step measured in the same run.
Run: .venv/bin/python bench/streaming_throughput.py
"""
from __future__ import annotations

import time

from _common import ROOT, fixtures, report


def main() -> None:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    from composer_overhead import composer_steps
    from train.config import load_config
    from train.data import build_dataloader
    from train.trainer import build_model

    clean_stale_shared_memory()
    data, parts = fixtures(n=8192)
    folder = data / "32"
    ds = StreamingDataset(local=str(folder), shuffle=False, batch_size=64)
    t0 = time.perf_counter()
    for i in range(ds.num_samples):
        ds[i]["image"].load()
    raw = ds.num_samples / (time.perf_counter() - t0)

    cfg = load_config(ROOT / "configs/tiny-phase2.yaml", [
        f"model.pretrained={parts}", f"data.path={folder}", "load_path=null", "progress_bar=false", "loggers=[]",
        f"save_folder={ROOT / 'bench/out/stream-ckpt'}", "save_interval=100000ba", "max_duration=100000ba"])
    tokenizer = build_model(cfg).tokenizer
    rates = {}
    for workers in (0, 2):
        cfg.data.num_workers = workers
        loader = build_dataloader(cfg.data, tokenizer, 64, seed=0)
        t0, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch["image"])
        rates[workers] = n / (time.perf_counter() - t0)

    cfg.data.num_workers = 0
    steps = composer_steps(cfg, 30)[5:]
    step = sorted(steps)[len(steps) // 2]
    consume = cfg.global_train_batch_size / step
    report("streaming_throughput", {
        "command": "python bench/streaming_throughput.py", "dataset": f"{ds.num_samples} shapes samples, 32 px PNG",
        "raw_samples_per_s": round(raw), "loader_0_workers_samples_per_s": round(rates[0]),
        "loader_2_workers_samples_per_s": round(rates[2]), "model_consumes_images_per_s": round(consume, 1),
        "ratio_raw": round(raw / consume, 1), "ratio_loader_0_workers": round(rates[0] / consume, 1),
        "ratio_loader_2_workers": round(rates[2] / consume, 1), "target": ">= 30",
    })


if __name__ == "__main__":
    main()
