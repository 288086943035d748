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

GPU (``--gpu``): seconds to score one full-size checkpoint. `dwb evaluate run` in a fresh process on a
diffusers folder holding SD2-base with random weights (865.9M UNet, VAE, OpenCLIP-H text tower),
1k images at 512² (one per caption of a 1k-image shapes reference set at 512²), DDIM, 25 steps,
guidance 7.5, bf16, batch 64; FID and KID on a 2048-d Inception-v3 (torch-fidelity's architecture,
random weights) and CLIP score on a ViT-L/14-sized CLIP (random weights). By default the same
folder is scored twice in that process (``--passes``): the first row includes the reference
statistics (1k images), the second is the steady state of a run that scores checkpoints as they land. Weights are random, so
the figures are times, not quality.

The sampler (DDIM), guidance, steps and sizes are named on every path, never left to a default.

CPU: python bench/evaluate_bench.py [--rounds 3] [--images 1000,10000] [--skip-memory]
GPU: python bench/evaluate_bench.py --gpu [--images 1000] [--steps 25] [--size 512] [--passes 2]
     (--gpu --device cpu --images 8 --size 64 --steps 2 checks the script on a CPU)
Smoke: python bench/evaluate_bench.py --smoke (CPU: 4 images batched, one `dwb evaluate run` of 8 images, 1-2 steps)
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

from _common import ROOT, RUN, fixtures, parse_args, random_sd2_base, report, tiny_checkpoint

# Named on every path: a default (the pipelines' sampler is DPM++ 2M now) is not this benchmark's setting.
SAMPLER, GUIDANCE_CPU, GUIDANCE_GPU = "DDIM", 5.0, 7.5


def scorer(data: Path) -> Path:
    from models.shapes.scorer import train_scorer

    path = RUN.out / "eval-scorer.pt"
    if not path.is_file():
        train_scorer(data, path, epochs=1, progress=False)  # accuracy does not matter here
    return path


def batching(ckpt: Path, n: int, batch_size: int, rounds: int, steps: int) -> dict:
    from evaluate.prompts import shapes_prompts
    from evaluate.samples import image_seed
    from models.checkpoints import load_pipeline
    from models.generation.samplers import make_sampler

    pipe = load_pipeline(ckpt)
    pipe.scheduler = make_sampler(SAMPLER, pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    prompts = shapes_prompts(n)

    def run(bs: int) -> tuple[float, np.ndarray]:
        t0, out = time.perf_counter(), []
        for s in range(0, n, bs):
            chunk = prompts[s:s + bs]
            gens = [torch.Generator().manual_seed(image_seed(p.index, 0)) for p in chunk]
            out.append(pipe([p.text for p in chunk], num_inference_steps=steps, guidance_scale=GUIDANCE_CPU, height=32,
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
    return {"images": n, "sampler": SAMPLER, "steps": steps, "guidance": GUIDANCE_CPU, "batch_size": batch_size,
            "rounds": rounds,
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


def memory(ckpt: Path, data: Path, scorer_path: Path, sizes: list[int], steps: int, n_reference: int) -> dict:
    out = {}
    for n in sorted(sizes):
        folder = RUN.out / f"eval-memory-{n}"
        if folder.exists():
            import shutil

            shutil.rmtree(folder)
        peak, secs = child_peak(["evaluate", "run", str(ckpt), "--out", str(folder), "--reference",
                                 str(data / "32"), "--scorer", str(scorer_path), "--prompts", "shapes",
                                 "--n-prompts", str(n), "--n-reference", str(n_reference), "--size", "32",
                                 "--guidance", str(GUIDANCE_CPU), "--sampler", SAMPLER, "--steps", str(steps),
                                 "--batch-size", "64", "--kid-subset-size", "1000"], RUN.out / f"eval-memory-{n}.log")
        rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
        if rows[-1]["n_images"] != n:
            raise SystemExit(f"`dwb evaluate run` scored {rows[-1]['n_images']} images, not {n}")
        out[n] = {"peak_rss_mib": round(peak / 2**20, 1), "seconds": round(secs, 1),
                  "images_per_s": round(n / rows[-1]["seconds_total"], 1)}
    lo, hi = min(sizes), max(sizes)
    return {"sampler": SAMPLER, "steps": steps, "guidance": GUIDANCE_CPU, "n_reference": n_reference, "runs": out,
            "ratio_peak_rss": round(out[hi]["peak_rss_mib"] / out[lo]["peak_rss_mib"], 3)}


def random_inception(path: Path) -> Path:
    """torch-fidelity's Inception-v3 architecture with seeded random weights, saved under the file name
    `dwb evaluate` expects (timing needs the architecture, not the trained weights)."""
    from unittest import mock

    import torch_fidelity.feature_extractor_inceptionv3 as fe

    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with mock.patch.object(fe, "load_state_dict_from_url", lambda *a, **k: {}), \
                mock.patch.object(fe.FeatureExtractorInceptionV3, "load_state_dict", lambda self, sd, *a, **k: None):
            torch.manual_seed(0)
            model = fe.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
        torch.save(model.state_dict(), path)
    return path


def random_clip_large(folder: Path, tokenizer_folder: Path) -> Path:
    """A CLIP with ViT-L/14's sizes (the usual CLIP-score model), random weights, our tokenizer."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    if not (folder / "config.json").is_file():
        tokenizer = CLIPTokenizer.from_pretrained(tokenizer_folder)
        config = CLIPConfig(
            text_config=dict(vocab_size=tokenizer.vocab_size, hidden_size=768, intermediate_size=3072,
                             num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77),
            vision_config=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                               image_size=224, patch_size=14),
            projection_dim=768)
        torch.manual_seed(0)
        CLIPModel(config).save_pretrained(folder)
        CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tokenizer).save_pretrained(folder)
    return folder


def sd2_base_folder(folder: Path) -> Path:
    """SD2-base at full size with random weights, saved as a diffusers folder (fp16 safetensors)."""
    if not (folder / "model_index.json").is_file():
        pipe = random_sd2_base(["a photo of an astronaut riding a horse on mars", "two red circles above a square"])
        pipe.to(dtype=torch.float16).save_pretrained(folder, safe_serialization=True)
    return folder


def gpu_scoring(args) -> dict:
    """`dwb evaluate run` on a full-size random SD2-base folder: seconds per checkpoint, and their parts."""
    from train.shapes import write_shapes_dataset

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--gpu: no CUDA GPU is visible (--gpu --device cpu --images 8 --size 64 --steps 2 checks "
                         "the script on a CPU)")
    n, size = int(args.images.split(",")[0]), args.size
    t0 = time.perf_counter()
    pipe_dir = sd2_base_folder(RUN.out / "sd2-base-random")
    ref = RUN.out / f"reference-{size}-{n}"
    if not (ref / str(size) / "index.json").is_file():
        write_shapes_dataset(ref, n, seed=0, sizes=(size,), n_eval=0, progress=False)
    weights = random_inception(RUN.out / "inception-random" / "weights-inception-2015-12-05-6726825d.pth")
    clip = random_clip_large(RUN.out / "clip-vit-l14-random", pipe_dir / "tokenizer")
    setup_s = time.perf_counter() - t0
    folder = RUN.out / f"eval-gpu-{args.device}"
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    peak, secs = child_peak(["evaluate", "run", *[str(pipe_dir)] * args.passes, "--out", str(folder), "--reference",
                             str(ref / str(size)), "--inception-weights", str(weights), "--clip", str(clip),
                             "--prompts", "reference", "--n-prompts", str(n), "--n-reference", str(n),
                             "--guidance", str(GUIDANCE_GPU), "--sampler", SAMPLER, "--steps", str(args.steps),
                             "--size", str(size), "--batch-size", str(args.batch_size), "--device", args.device,
                             "--dtype", args.dtype, "--kid-subset-size", str(min(1000, n))],
                            RUN.out / f"eval-gpu-{args.device}.log")
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    keys = ("n_images", "seconds_checkpoint", "seconds_generate", "seconds_metrics")
    return {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
            "model": "sd2-base, random weights", "images": n, "size": size, "steps": args.steps,
            "guidance": GUIDANCE_GPU, "sampler": SAMPLER, "dtype": args.dtype, "batch_size": args.batch_size, "setup_seconds": round(setup_s, 1),
            "first_checkpoint": {k: rows[0][k] for k in keys},
            **({"next_checkpoint": {k: rows[-1][k] for k in keys}} if len(rows) > 1 else {}),
            "images_per_s": round(rows[-1]["n_images"] / rows[-1]["seconds_checkpoint"], 2),
            "process_wall_seconds": round(secs, 1), "process_peak_rss_gib": round(peak / 2**30, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-images", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, help="sampler steps (default 20; 25 with --gpu)")
    p.add_argument("--images", help="image counts (default 1000,10000; 1000 with --gpu)")
    p.add_argument("--memory-steps", type=int, default=4, help="sampler steps in the memory runs (speed only)")
    p.add_argument("--n-reference", type=int, default=1000, help="reference images in the memory runs")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--gpu", action="store_true", help="seconds to score a full-size SD2-base checkpoint")
    p.add_argument("--device", default="cuda", help="with --gpu: cuda, or cpu to check the script at a small size")
    p.add_argument("--size", type=int, default=512, help="with --gpu: image side")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="with --gpu")
    p.add_argument("--passes", type=int, default=2, help="with --gpu: times the checkpoint is scored in one process")
    args = parse_args(p, smoke=dict(rounds=1, batch_images=4, batch_size=4, steps=2, images="8", memory_steps=1,
                                    n_reference=64))
    if args.smoke and args.gpu:
        p.error("--smoke checks the CPU path; --gpu is not part of it")
    args.steps = args.steps or (25 if args.gpu else 20)
    args.images = args.images or ("1000" if args.gpu else "1000,10000")
    if args.gpu:
        result = {"command": "python bench/evaluate_bench.py " + " ".join(sys.argv[1:]), "scoring": gpu_scoring(args)}
        print(json.dumps(result, indent=2), flush=True)
        report("evaluate_gpu" if args.device == "cuda" else "evaluate_gpu_cpu_check", result)
        return
    data, _ = fixtures()
    ckpt = tiny_checkpoint()
    result = {"command": "python bench/evaluate_bench.py " + " ".join(sys.argv[1:]),
              "batching": batching(ckpt, args.batch_images, args.batch_size, args.rounds, args.steps)}
    print(json.dumps(result["batching"], indent=2), flush=True)
    if not args.skip_memory:
        sizes = [int(x) for x in args.images.split(",")]
        result["memory"] = memory(ckpt, data, scorer(data), sizes, args.memory_steps, args.n_reference)
    report("evaluate", result)


if __name__ == "__main__":
    main()
