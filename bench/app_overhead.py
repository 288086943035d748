"""The app's cost over diffusers: generation through `dwb app`'s API vs a bare pipeline call, same run.

CPU (default), tiny checkpoint trained here at 32 px:

- overhead: `dwb app` runs in its own process on 127.0.0.1 and is called through its API (queue,
  progress events, PNG with the parameters chunk, download of the PNG), both over plain HTTP
  (`/gradio_api/call/generate`, what any language uses; one keep-alive client for all requests) and
  with gradio_client (which adds its own polling: it sleeps 50 ms whenever no message is waiting).
  This process makes the same call on the pipeline `train.load_pipeline` gives (same prompt, seed,
  sampler, steps, guidance, size, PIL output; each named here, none left to a default). The three
  alternate, request by request, and must return the same pixels. Figure: the median of the
  per-round ratios (target <= 1.05).
  Measured at the tiny model's own 32 px (a request costs a few hundred ms, so the fixed per-request
  cost shows most) and at 128 px (a cost per image closer to real use).
- cache: the app's first open of a checkpoint (load and hash) vs the second, cached (target <= 10%).

GPU (`--gpu`): a full-size SD2-base pipeline with random weights (models.checkpoints.components), 512², 50 steps,
batch 1, bf16, SDPA: seconds per image through the app's `generate` and through a bare pipeline
call, eager and (with `--compile`) with the UNet compiled. Target on one H200: <= 0.6 s per image.

CPU: python bench/app_overhead.py [--rounds 12]
GPU: python bench/app_overhead.py --gpu [--compile]
Smoke: python bench/app_overhead.py --smoke (CPU, 2 steps, 1 round: the script runs and the images are equal)
"""
from __future__ import annotations

import argparse
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from _common import ROOT, RUN, parse_args, random_sd2_base, report, tiny_checkpoint

PROMPT, NEGATIVE = "two red circles left of a blue square", "green"
# Named for both paths, never left to a default: the bare call once relied on the pipeline's default
# sampler, which changed (DDIM to DPM++ 2M) while the app call still asked for DDIM.
SAMPLER, GUIDANCE = "DDIM", 7.5


def with_sampler(pipe):
    """``pipe`` with SAMPLER as its scheduler, as a diffusers user sets one once before calling it."""
    from models.generation.samplers import make_sampler

    pipe.scheduler = make_sampler(SAMPLER, pipe.scheduler.config)
    return pipe


def start_app(root: Path) -> tuple[subprocess.Popen, str]:
    """`dwb app` on a free port of 127.0.0.1, started (it takes seconds to be ready: see ``wait_ready``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(RUN.out / "app_overhead_server.log", "w") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "dwb"), "app", "--checkpoints", str(root), "--port",
                                 str(port)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen, url: str) -> None:
    import httpx

    for _ in range(1200):
        if proc.poll() is not None:
            log = RUN.out / "app_overhead_server.log"
            raise SystemExit(f"dwb app exited ({log}):\n" + log.read_text()[-2000:])
        try:
            if httpx.get(f"{url}/gradio_api/info", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise SystemExit("dwb app did not start")


def bare_call(pipe, seed: int, steps: int, size: int):
    """What a diffusers user writes: one call of a pipeline set to SAMPLER (``with_sampler``)."""
    gen = torch.Generator().manual_seed(seed)
    return pipe(PROMPT, negative_prompt=NEGATIVE, num_inference_steps=steps, guidance_scale=GUIDANCE, width=size,
                height=size, generator=gen, output_type="pil").images[0]


def http_call(c: httpx.Client, url: str, data: list) -> bytes:
    """The app's HTTP API as any language calls it: POST the inputs, read the event stream, GET the PNG.

    ``c`` serves every request, as a client making repeated calls keeps one: a new ``httpx.Client``
    per request loads the system's CA bundle for TLS that this plain-HTTP URL never uses (30-100 ms
    here, more than the app's own cost).
    """
    event = c.post(f"{url}/gradio_api/call/generate", json={"data": data}).json()["event_id"]
    kind = None
    with c.stream("GET", f"{url}/gradio_api/call/generate/{event}") as r:
        for line in r.iter_lines():
            if line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:") and kind in ("complete", "error"):
                if kind == "error":
                    raise SystemExit(f"the app refused the request: {line}")
                out = json.loads(line[5:])
                break
    return c.get(out[0][0]["image"]["url"]).content


def overhead(client, http, url: str, pipe, ckpt: Path, size: int, steps: int, rounds: int) -> dict:
    """Bare call, HTTP API and gradio_client, each once per round (the order rotates), all the same pixels.

    The figure is the median over rounds of each round's ratio to the bare call: pairing cancels the
    slow drifts of a shared machine's speed.
    """
    from PIL import Image

    times: dict[str, list[float]] = {"bare": [], "http": [], "gradio_client": []}
    for r in range(rounds + 1):  # round 0 warms every path (first load, first call)
        seed = 1000 + r
        # /generate's inputs in order: a single file's parts, a refiner and its switch (none), then text to image's
        # mode controls (no init image or mask, strength, mask blur, no hires fix, its upscaler, clip skip 1), the
        # checkpoint's own VAE, and no ControlNet (nor its image; its preprocessing, weight, start and end)
        data = [str(ckpt), "ema", PROMPT, NEGATIVE, SAMPLER, steps, GUIDANCE, size, size, seed, 1, "", "", 0.8,
                "txt2img", None, None, 0.75, 4, 1, 0, "Latent", 1, "", "", None, "none", 1, 0, 1]
        calls = {"bare": lambda: np.asarray(bare_call(pipe, seed, steps, size)),
                 "http": lambda: http_call(http, url, data),
                 "gradio_client": lambda: client.predict(*data, api_name="/generate")[0][0]["image"]}
        order = list(calls)[r % 3:] + list(calls)[:r % 3]
        got, took = {}, {}
        for name in order:
            t0 = time.perf_counter()
            got[name] = calls[name]()
            took[name] = time.perf_counter() - t0
        with Image.open(io.BytesIO(got["http"])) as a, Image.open(got["gradio_client"]) as b:
            same = (np.array_equal(np.asarray(a.convert("RGB")), got["bare"])
                    and np.array_equal(np.asarray(b.convert("RGB")), got["bare"]))
        if not same:
            raise SystemExit(f"the app's image differs from the bare pipeline's at {size} px, seed {seed}")
        if r:
            for name, dt in took.items():
                times[name].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = {k: statistics.median(a / b for a, b in zip(times[k], times["bare"])) for k in ("http", "gradio_client")}
    return {"size": size, "sampler": SAMPLER, "steps": steps, "guidance": GUIDANCE, "requests_each": rounds,
            "identical_images": True,
            **{f"{k}_median_s": round(v, 4) for k, v in med.items()},
            "ratio_http": round(paired["http"], 3), "ratio_gradio_client": round(paired["gradio_client"], 3),
            "extra_ms_http": round(1e3 * (med["http"] - med["bare"])),
            "extra_ms_gradio_client": round(1e3 * (med["gradio_client"] - med["bare"]))}


def cache_figure(ckpt: Path, repeats: int) -> dict:
    from app.service import Service
    from models.checkpoints import content_hash, find, hashing

    firsts, seconds = [], []
    for _ in range(repeats):
        hashing._cache.clear()
        find._kinds.clear()
        service = Service([ckpt.parent], cache_size=2)
        for times in (firsts, seconds):
            t0 = time.perf_counter()
            c = service.open(str(ckpt))
            service.pipeline(c, "ema")
            content_hash(c)
            times.append(time.perf_counter() - t0)
    f, s = statistics.median(firsts), statistics.median(seconds)
    return {"first_open_median_s": round(f, 4), "second_open_median_s": round(s, 6), "ratio": round(s / f, 5),
            "checkpoint_mib": round(ckpt.stat().st_size / 2**20, 1), "target": "<= 0.10"}


def cpu(args) -> None:
    import httpx
    from gradio_client import Client

    from models.checkpoints import load_pipeline

    ckpt = tiny_checkpoint()
    proc, url = start_app(ckpt.parent)
    try:
        pipe = with_sampler(load_pipeline(ckpt, ema=True))  # while the app starts
        wait_ready(proc, url)
        # ssl_verify=False: gradio_client opens a new httpx client for each call, stream and download,
        # and with verification each loads the CA bundle, though http://127.0.0.1 has no TLS to verify.
        client = Client(url, verbose=False, download_files=str(RUN.out / "app-downloads"), ssl_verify=False)
        with httpx.Client(timeout=600) as http:
            runs = [overhead(client, http, url, pipe, ckpt, size, args.steps, args.rounds) for size in (32, 128)]
    finally:
        proc.terminate()
        proc.wait(30)
    report("app_overhead", {
        "command": f"python bench/app_overhead.py --rounds {args.rounds} --steps {args.steps}",
        "checkpoint": "tiny, 32 px", "overhead": runs, "overhead_target": "<= 1.05",
        "cache": cache_figure(ckpt, args.cache_repeats)})


def sd2_base_pipeline(device: str, dtype: torch.dtype):
    """SD2-base at full size with random weights: UNet (865.9M), VAE, 23-layer OpenCLIP-H text tower."""
    from diffusers.models.attention_processor import AttnProcessor2_0

    pipe = with_sampler(random_sd2_base([PROMPT, "a photo of an astronaut riding a horse on mars"]))
    pipe.to(device=device, dtype=dtype)
    for module in (pipe.unet, pipe.vae):
        module.set_attn_processor(AttnProcessor2_0())  # PyTorch SDPA, as `dwb app` sets on a GPU
    return pipe


def gpu(args) -> None:
    from app.generate import GenerationParams, Limits, generate, validate

    if not torch.cuda.is_available() and args.device == "cuda":
        raise SystemExit("--gpu: no CUDA GPU is visible (use --device cpu --size 64 --steps 2 to check the script)")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    pipe = sd2_base_pipeline(args.device, dtype)
    params = validate(GenerationParams(PROMPT, NEGATIVE, SAMPLER, args.steps, GUIDANCE, args.size, args.size, 0, 1),
                      Limits(max_size=max(1024, args.size)))

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    def timed(fn) -> list[float]:
        fn()  # warm-up (kernel selection; compilation when compiled)
        times = []
        for _ in range(args.rounds):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return times

    out = {}
    variants = ["eager"] + (["compiled"] if args.compile else [])
    for variant in variants:
        if variant == "compiled":
            pipe.unet = torch.compile(pipe.unet, fullgraph=True)  # the UNet is ~all of the time per image
        app_t = timed(lambda: generate(pipe, params))
        bare_t = timed(lambda: bare_call(pipe, 0, args.steps, args.size))
        out[variant] = {"app_median_s_per_image": round(statistics.median(app_t), 3),
                        "bare_median_s_per_image": round(statistics.median(bare_t), 3),
                        "ratio": round(statistics.median(app_t) / statistics.median(bare_t), 3)}
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    report("app_latency_gpu" if args.device == "cuda" else "app_latency_cpu_check", {
        "command": f"python bench/app_overhead.py --gpu --device {args.device} --size {args.size} --steps {args.steps} "
                   f"--dtype {args.dtype} --rounds {args.rounds}" + (" --compile" if args.compile else ""),
        "device": name, "model": "sd2-base, random weights", "size": args.size, "sampler": SAMPLER,
        "steps": args.steps, "guidance": GUIDANCE, "batch": 1,
        "dtype": args.dtype, "attention": "SDPA", "rounds": args.rounds, **out, "target": "<= 0.6 s per image (H200)",
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if args.device == "cuda" else None})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12, help="timed requests per path and setting")
    ap.add_argument("--steps", type=int, default=None, help="denoising steps (CPU default 25, GPU 50)")
    ap.add_argument("--gpu", action="store_true", help="SD2-base latency on a GPU instead of the CPU figures")
    ap.add_argument("--compile", action="store_true", help="with --gpu: also time a torch.compile'd UNet")
    ap.add_argument("--device", default="cuda", help="with --gpu: cuda, or cpu to check the script at a small size")
    ap.add_argument("--size", type=int, default=512, help="with --gpu: image size")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="with --gpu")
    ap.add_argument("--cache-repeats", type=int, default=5, help="first and second opens timed for the cache figure")
    args = parse_args(ap, smoke=dict(rounds=1, steps=2, cache_repeats=1))
    if args.smoke and args.gpu:
        ap.error("--smoke checks the CPU path; --gpu is not part of it")
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()  # dtype-cast notices, as `dwb` silences them
    if args.gpu:
        args.steps = args.steps or 50
        gpu(args)
    else:
        args.steps = args.steps or 25
        cpu(args)


if __name__ == "__main__":
    main()
