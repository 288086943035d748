"""Training throughput on precomputed latents: `dwb train`'s Composer path vs a plain PyTorch loop, same run.

Both train the same UNet architecture (random init) on the same precomputed-latent MDS dataset
(random latents and text states of the right shapes, written once under bench/out), with AdamW,
epsilon prediction, gradient clipping at 1.0, no EMA, the same precision and attention backend (each
named in the config overrides, not left to the config file):

- workbench: `train.trainer.build_trainer` (Composer Trainer, Streaming loader, non-finite guard,
  gradient clipping, SpeedMonitor), exactly what `dwb train` runs;
- plain: what users write instead, a DataLoader over the same StreamingDataset and a loop of
  forward, MSE, backward, clip, AdamW step under torch.autocast.

Reported per resolution: images/s and, on a GPU, model FLOP utilisation from the FLOPs per image
given for SD2-base (forward + backward: 0.54 TFLOP at 256², 2.41 TFLOP at 512²) against the GPU's
dense bf16 peak. Targets on one H200: >= 600 images/s at 256², >= 150 at 512².

GPU:  python bench/train_throughput.py                  (sd2-base, 256 and 512, bf16, SDPA)
CPU:  python bench/train_throughput.py --reduced        (tiny architecture; proves the script only)
Smoke: python bench/train_throughput.py --smoke         (--reduced at 16 px, 2 timed steps, 1 round)
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from _common import ROOT, RUN, fit_batch_end_times, parse_args, report

TFLOP_PER_IMAGE = {256: 0.54, 512: 2.41}  # SD2-base UNet, forward + backward, per image
PEAK_TFLOPS = {"H200": 989.5, "H100": 989.5, "A100": 312.0}  # dense bf16


def gpu_peak() -> float | None:
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), None)


def make_parts(arch: str, folder: Path):
    """Random frozen VAE and text encoder saved as a diffusers-layout folder, plus a small tokenizer."""
    from models.checkpoints.components import load_frozen_parts, random_text_encoder, random_vae
    from train.shapes.prepare import fit_tokenizer

    if not (folder / "tokenizer").is_dir():
        torch.manual_seed(0)
        random_vae(arch).save_pretrained(folder / "vae")
        te = random_text_encoder(arch)
        te.save_pretrained(folder / "text_encoder")
        tok = fit_tokenizer(["a photo of a cat", "a red circle"], max_length=te.config.max_position_embeddings)
        tok.save_pretrained(folder / "tokenizer")
    return load_frozen_parts(str(folder))


def make_latents(arch: str, res: int, n: int, parts: Path, folder: Path) -> Path:
    """An MDS dataset in `dwb data precompute`'s format with random latents and text states."""
    from streaming import MDSWriter

    from models.checkpoints.architectures import ARCHITECTURES
    from train.data.latents import LATENTS_FORMAT, META, latent_columns, encode_array
    from models.checkpoints.hashing import fingerprint
    from train.data.precompute import part_fingerprints

    out = folder / f"{arch}-{res}"
    if (out / META).is_file():
        return out
    vae, te, tok = make_parts(arch, parts)
    down = 2 ** (len(ARCHITECTURES[arch]["vae"]["block_out_channels"]) - 1)
    lat, txt = (4, res // down, res // down), (te.config.max_position_embeddings, te.config.hidden_size)
    rng = np.random.default_rng(0)
    with MDSWriter(out=str(out), columns=latent_columns(lat, txt, "float16"), size_limit="256mb") as w:
        for i in range(n):
            text = rng.standard_normal(txt, dtype=np.float32).astype(np.float16)
            w.write({"latent_mean": rng.standard_normal(lat, dtype=np.float32).astype(np.float16),
                     "latent_std": np.full(lat, 0.01, np.float16), "text": text, "text_alt": text,
                     "caption": f"sample {i}", "original_size": np.array([res, res]),
                     "crop_top_left": np.zeros(2, np.int64)})
    meta = {"format": LATENTS_FORMAT, "complete": True, "resolution": res, "dtype": "float16", "samples": n,
            "scaling_factor": float(vae.config.scaling_factor), "latent_shape": list(lat), "text_shape": list(txt),
            # every dtype a run holds its frozen parts in (a GPU's bfloat16 too): what training checks them against
            "vae": {"fingerprint": fingerprint(vae), "fingerprints": part_fingerprints(vae)},
            "text_encoder": {"fingerprint": fingerprint(te), "fingerprints": part_fingerprints(te)},
            "empty_text": encode_array(np.zeros(txt, np.float16)), "center_crop": True}
    (out / META).write_text(json.dumps(meta))
    return out


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def workbench(cfg, steps: int, warmup: int) -> float:
    """Images/s through build_trainer (the `dwb train` path)."""
    from train.trainer import build_trainer

    times = fit_batch_end_times(build_trainer(cfg), steps + warmup, sync=sync)
    elapsed = times[-1] - times[warmup - 1]
    return cfg.global_train_batch_size * steps / elapsed


def plain(cfg, steps: int, warmup: int) -> float:
    """Images/s of a hand-written loop over the same UNet and data."""
    from diffusers.models.attention_processor import AttnProcessor2_0
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    from models.checkpoints.components import build_unet
    from models.checkpoints.schedules import ddpm_scheduler

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    unet = build_unet(cfg.model.architecture).to(dev)
    unet.set_attn_processor(AttnProcessor2_0())
    unet.train()
    opt = torch.optim.AdamW(unet.parameters(), lr=cfg.optimizer.lr, weight_decay=cfg.optimizer.weight_decay)
    alphas = ddpm_scheduler("epsilon").alphas_cumprod.to(dev)
    ds = StreamingDataset(local=cfg.data.path, shuffle=True, batch_size=cfg.global_train_batch_size)
    loader = DataLoader(ds, batch_size=cfg.global_train_batch_size, num_workers=cfg.data.num_workers, drop_last=True)
    amp = dev == "cuda" and cfg.precision != "fp32"
    def forever():
        while True:
            yield from loader

    times, it = [], forever()
    for _ in range(steps + warmup):
        batch = next(it)
        mean = batch["latent_mean"].to(dev, non_blocking=True).float()
        x0 = mean + batch["latent_std"].to(dev).float() * torch.randn_like(mean)
        text = batch["text"].to(dev).float()
        noise = torch.randn_like(x0)
        t = torch.randint(0, 1000, (x0.shape[0],), device=dev)
        a = alphas[t].view(-1, 1, 1, 1)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=amp):
            pred = unet(a.sqrt() * x0 + (1 - a).sqrt() * noise, t, encoder_hidden_states=text).sample
        loss = torch.nn.functional.mse_loss(pred.float(), noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(unet.parameters(), 1.0)
        opt.step()
        sync()
        times.append(time.perf_counter())
    del unet, opt
    return cfg.global_train_batch_size * steps / (times[-1] - times[warmup - 1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reduced", action="store_true", help="tiny architecture on CPU: proves the script, no GPU figure")
    ap.add_argument("--resolutions", type=int, nargs="+")
    ap.add_argument("--batch", type=int, nargs="+", help="per-resolution batch (default 64 at 256, 32 at 512)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--num-workers", type=int, default=4)
    ap.add_argument("--attention", default="sdpa")
    args = parse_args(ap, smoke=dict(reduced=True, resolutions=[16], steps=2, warmup=1, rounds=1))

    from train.config import load_config

    gpu = torch.cuda.is_available()
    if not gpu and not args.reduced:
        raise SystemExit("no CUDA GPU: run with --reduced for the CPU check of the script")
    arch = "tiny" if args.reduced else "sd2-base"
    resolutions = args.resolutions or ([16, 32] if args.reduced else [256, 512])
    batches = args.batch or ([16] * len(resolutions) if args.reduced else [64 if r <= 256 else 32 for r in resolutions])
    workers = 0 if args.reduced else args.num_workers
    parts = RUN.out / f"throughput-parts-{arch}"
    results = []
    for res, batch in zip(resolutions, batches):
        data = make_latents(arch, res, args.samples if not args.reduced else 256, parts, RUN.out / "throughput-data")
        cfg = load_config(ROOT / "configs/sd2-base-phase1.yaml", [
            f"model.architecture={arch}", f"model.pretrained={parts}", f"data.path={data}", "data.precomputed=true",
            f"data.resolution={res}", f"data.num_workers={workers}", f"global_train_batch_size={batch}",
            f"device_train_microbatch_size={batch}", f"model.attention={args.attention}", "fsdp=false",
            "model.prediction_type=epsilon", "grad_clip_norm=1.0", "ema.enabled=false",
            "low_precision_norms=" + ("true" if gpu else "false"), "precision=" + ("amp_bf16" if gpu else "fp32"),
            f"save_folder={RUN.out / 'throughput-ckpt'}", "save_interval=1000000ba", "progress_bar=false", "loggers=[]",
            "autoresume=false", "load_path=null", "scheduler.t_warmup=1ba"])
        wb, pl = [], []
        for _ in range(args.rounds):  # alternate, so drift on the machine hits both
            wb.append(workbench(cfg, args.steps, args.warmup))
            pl.append(plain(cfg, args.steps, args.warmup))
            if gpu:
                torch.cuda.empty_cache()
        w, p = statistics.median(wb), statistics.median(pl)
        row = {"resolution": res, "batch": batch, "workbench_images_per_s": round(w, 1), "plain_images_per_s": round(p, 1),
               "ratio": round(w / p, 3), "rounds_workbench": [round(x, 1) for x in wb], "rounds_plain": [round(x, 1) for x in pl]}
        peak = gpu_peak()
        if gpu and peak and res in TFLOP_PER_IMAGE:
            row["workbench_mfu"] = round(w * TFLOP_PER_IMAGE[res] / peak, 3)
            row["plain_mfu"] = round(p * TFLOP_PER_IMAGE[res] / peak, 3)
        if gpu:
            row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
        results.append(row)
        print(json.dumps(row), flush=True)
    report("train_throughput_gpu" if gpu else "train_throughput_cpu_reduced", {
        "command": "python bench/train_throughput.py" + (" --reduced" if args.reduced else ""),
        "architecture": arch, "device": torch.cuda.get_device_name() if gpu else "cpu",
        "precision": "amp_bf16" if gpu else "fp32", "attention": args.attention, "steps_timed": args.steps,
        "results": results,
        "targets": "H200: >= 600 images/s at 256, >= 150 at 512" if gpu else "none (script check; GPU figure pending)",
    })


if __name__ == "__main__":
    main()
