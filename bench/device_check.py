"""The one-shot GPU check: every GPU figure this project wants, in one run of at most 8 minutes on one H100,
written to one JSON file; and the same run on the CPU at tiny size (``--dry-run``) so that the suite keeps it working.

A GPU is lent to this project rarely and briefly (about 15 minutes, the machine's start included), so the
measurements are prepared here and run there in one command. Parts, each under its own time budget (a part that
overruns or fails records its one-line error, and the run goes on to the next):

- ``train_256``, ``train_512``: `dwb train` images/s (``build_trainer``, as bench/train_throughput.py times it)
  with configs/sd2-base-phase1.yaml at 256² and phase2.yaml at 512², their settings (microbatch 16, amp_bf16,
  low-precision norms, attention ``auto``, 8 loader workers, phase 2's EMA keys) except one GPU's global batch
  (``--batch``, default 64: 4 microbatches) and no FSDP; SD2-base UNet with random weights on precomputed random
  latents and text states (train_throughput's ``make_latents``); peak GPU memory.
- ``fsdp``: a whole `dwb train` run of phase 1 with ``fsdp=true`` (the configs' SHARD_GRAD_OP) on the one GPU,
  with validation loss (a held-out shapes split at 256²) and preview grids due twice inside it and a checkpoint
  at its end: whether it completes, and the share of its time that validation and previews took, timed around
  the callbacks' own passes (``ValidationLoss.measure``, ``Previews.draw``) as bench/run_overhead.py times them.
- ``sampling``: seconds per image through the one generation path (``models.checkpoints.load_pipeline``, then
  ``models.generation.generate_images``): SD2-base with random weights, 512², DDIM, 50 steps, guidance 7.5,
  batch 1, bf16, SDPA, as bench/app_overhead.py's GPU mode.
- ``scoring``: `dwb evaluate run` images/s on the same model, as bench/evaluate_bench.py's GPU mode (random
  Inception-v3 and ViT-L/14-sized CLIP, a shapes reference at 512², DDIM, 25 steps, batch 64, bf16), on fewer
  images (``--score-images``, default 128) and scored twice: the first row includes the reference statistics,
  the second is the steady state.
- ``nccl_rule``: NCCL's rule rehearsed on the one GPU: two ranks (each told it is local rank 0 of its own "node", so
  both hold ``cuda:0``) in a group that serves CUDA tensors only, as NCCL's does (``"cuda:gloo"``: gloo behind
  NCCL's device map; NCCL itself refuses two ranks on one GPU). First each collective the project makes is tried on
  CUDA tensors (which gloo serves there is recorded); then a `dwb train` run of phase 1 on random SD2-base, FULL_SHARD
  FSDP with a sharded checkpoint, EMA from the first batch, validation loss and preview grids due every
  ``rule_every`` batches, ``rule_batches`` batches in all. Where gloo serves none of FSDP's collectives on CUDA
  (``reduce_scatter_tensor``), the run is DDP and the JSON's ``rehearsed`` leaves FSDP and the sharded save out,
  naming the collective (``not_rehearsed``). A tensor kept on the CPU and handed to a collective fails here as it
  would under NCCL (``No backend type associated with device type cpu``).
- ``mmdit_medium``: configs/mmdit-medium-phase1.yaml's transformer (random weights, one GPU, one process, its
  microbatch 16 at 256², amp_bf16, EMA as configured) stepped ``mmdit_steps`` batches: the peak GPU memory against
  the memory plan that admitted it (``train.trainer.check_memory``'s ``RankPlan``: weights, gradients, AdamW, EMA,
  frozen parts in bf16; activations come on top) and against what the run counted it held
  (``memory/rank0.json``).

GPU:     python bench/device_check.py --out bench/out/device_check.json      (BENCHMARKS.md: The one-shot GPU check)
         (the first five parts fill 8 minutes: on a lent GPU of 15 minutes run them, then
         ``--parts nccl_rule mmdit_medium --out bench/out/device_check_scale.json``, about 5 minutes)
Dry run: python bench/device_check.py --dry-run --out /tmp/dc.json            (CPU, tiny architecture, a few
         minutes of CPU; the same parts and JSON with "dry_run": true, ``nccl_rule`` on two CPU ranks in a
         ``"cpu:gloo"`` group, ``mmdit_medium`` on tiny-mmdit; --smoke is the same, for tests/test_bench.py)
Exit status 1 when a part failed (the JSON is written all the same, after every part).
"""
from __future__ import annotations

import argparse
import atexit
import gc
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

STARTED = time.perf_counter()

from _common import ROOT, RUN, fixtures, tiny_checkpoint  # noqa: E402

NAME = "device_check"
TOTAL_BUDGET_S = 470  # the whole run, imports included: under 8 minutes with 10 s to spare for the interpreter
LAST_PART_MIN_S = 15  # a part is skipped rather than started with less than this left


@dataclass(frozen=True)
class Plan:
    """What each part measures, on which device and at which sizes; ``GPU`` and ``DRY_RUN`` below."""
    device: str
    arch: str
    resolutions: dict  # phase -> training resolution
    batch: int  # global batch of one GPU (the configs' 2048 is for 8 GPUs and more)
    microbatch: int | None  # None: the configs' (16)
    warmup: int  # batches before the timed ones
    steps: int  # timed batches
    workers: int | None  # None: the configs' (8)
    fsdp_phase: str
    fsdp_batches: int
    fsdp_every: int  # validation and previews every this many batches of the FSDP run
    held_out: int  # held-out samples read by validation
    preview_steps: int | None  # None: the configs' (20)
    sample_size: int
    sample_steps: int
    sample_rounds: int
    score_images: int
    score_size: int
    score_steps: int
    score_batch: int
    score_passes: int
    score_inception_features: int | None  # None: `dwb evaluate`'s (2048, the standard FID)
    rule_batches: int  # batches of the two-rank rehearsal of NCCL's rule
    rule_every: int  # validation, previews and the sharded save every this many batches of it
    mmdit_config: str  # the MMDiT stepped for its peak memory (configs/NAME.yaml)
    mmdit_resolution: int
    mmdit_batch: int  # its global batch (microbatches of the config's 16, or ``microbatch``)
    mmdit_steps: int
    budgets: dict = field(default_factory=dict)  # part -> seconds


# Budgets from the H200 figures in BENCHMARKS.md, with room (estimates: none of this has run on a GPU yet): the
# random SD2-base frozen parts and two latent sets (about 40 s, paid by the first training part), a trainer (about
# 20 s), 25 batches of 64 (7 s at 256², 17 s at 512²), under FSDP a plain UNet copy built for each preview grid
# (`full_unet`) and the final checkpoint (about 12 GB with AdamW's moments), a pipeline of random weights saved and
# opened (20-30 s), 128 images at 512² and 25 steps scored twice (about 40 s of generation).
# Their sum, 440 s, and the start (imports) fit TOTAL_BUDGET_S.
GPU = Plan(device="cuda", arch="sd2-base", resolutions={"phase1": 256, "phase2": 512}, batch=64, microbatch=None,
           warmup=5, steps=20, workers=None, fsdp_phase="phase1", fsdp_batches=12, fsdp_every=6, held_out=64,
           preview_steps=None, sample_size=512, sample_steps=50, sample_rounds=3, score_images=128, score_size=512,
           score_steps=25, score_batch=64, score_passes=2, score_inception_features=None,
           rule_batches=4, rule_every=2, mmdit_config="mmdit-medium-phase1", mmdit_resolution=256, mmdit_batch=32,
           mmdit_steps=4,
           # the rehearsal: two ranks each building random SD2-base (about 40 s), 4 batches, two validation passes
           # and preview grids, a sharded save; mmdit-medium: building 2B random weights on the CPU (about 60 s)
           budgets={"train_256": 95, "train_512": 55, "fsdp": 120, "sampling": 55, "scoring": 115,
                    "nccl_rule": 150, "mmdit_medium": 150})
# The same parts on the CPU at tiny size: 16 and 32 px stand for 256² and 512². Inception's first feature layer
# (64), where its forward stops: its 2048-d pool ran at 1.6 images/s on one thread here, 30 s of a 75 s dry run.
DRY_RUN = Plan(device="cpu", arch="tiny", resolutions={"phase1": 16, "phase2": 32}, batch=8, microbatch=4,
               warmup=1, steps=2, workers=0, fsdp_phase="phase1", fsdp_batches=4, fsdp_every=2, held_out=4,
               preview_steps=2, sample_size=32, sample_steps=2, sample_rounds=1, score_images=8, score_size=32,
               score_steps=2, score_batch=8, score_passes=2, score_inception_features=64,
               rule_batches=2, rule_every=2, mmdit_config="tiny-mmdit-phase1", mmdit_resolution=16, mmdit_batch=4,
               mmdit_steps=2,
               budgets={"train_256": 240, "train_512": 240, "fsdp": 240, "sampling": 240, "scoring": 240,
                        "nccl_rule": 240, "mmdit_medium": 240})
DRY_RUN_TOTAL_S = 900


# Our pins a GPU machine's own stack (torch, CUDA, numpy, scipy, Pillow, accelerate, ...) lacks or holds at other
# versions (transformers 5, huggingface-hub 1, tokenizers 0.23 and torchmetrics 1.9 there): the distributions a dry
# run imports, less that stack's. They travel as wheels installed with --no-deps over its torch (BENCHMARKS.md).
CARRIED = ("mosaicml mosaicml-cli mosaicml-streaming diffusers transformers huggingface-hub tokenizers torchmetrics "
           "torch-fidelity coolname backoff boto3 botocore s3transfer jmespath brotli catalogue cffi cramjam "
           "cryptography pynacl bcrypt paramiko dill ftfy google-api-core google-auth google-cloud-core "
           "google-cloud-storage google-resumable-media googleapis-common-protos gql graphql-core importlib-metadata "
           "opentelemetry-api prompt-toolkit questionary pyopenssl python-snappy ruamel-yaml validators wcwidth "
           "websockets zstd").split()


def carried_pins(lock: Path = ROOT / "requirements.lock") -> list[str]:
    """``name==version`` of each CARRIED distribution, from the lock."""
    pins = {}
    for line in lock.read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith((" ", "#")):
            pins[name.strip().lower().replace("_", "-").replace(".", "-")] = version.strip()
    missing = [n for n in CARRIED if n not in pins]
    if missing:
        raise SystemExit(f"{NAME}: {lock.name} pins no version of {', '.join(missing)}")
    return [f"{n}=={pins[n]}" for n in CARRIED]


class OverBudget(BaseException):
    """A part's time ran out (raised by SIGALRM in the main thread; a BaseException, so that no library's
    ``except Exception`` takes it for its own error)."""


# ---------------------------------------------------------------------------------------------- the machine


def versions() -> dict:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
    for key, dist in (("composer", "mosaicml"), ("streaming", "mosaicml-streaming"), ("diffusers", "diffusers"),
                      ("transformers", "transformers"), ("huggingface_hub", "huggingface-hub"),
                      ("tokenizers", "tokenizers"), ("torchmetrics", "torchmetrics"),
                      ("torch_fidelity", "torch-fidelity"), ("numpy", "numpy")):
        try:
            out[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[key] = None
    return out


def nvidia_smi() -> dict | None:
    """The driver's own view of the GPU, where nvidia-smi is installed."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        run = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": str(e).splitlines()[0]}
    fields = [f.strip() for f in run.stdout.strip().splitlines()[0].split(",")] if run.stdout.strip() else []
    if run.returncode != 0 or len(fields) != 3:
        return {"error": (run.stderr or run.stdout).strip()[:200]}
    return dict(zip(("name", "driver_version", "memory_total"), fields))


def machine() -> dict:
    import torch

    out = {"processor": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "torch_threads": torch.get_num_threads(), "gpu": None}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        driver_api = getattr(torch._C, "_cuda_getDriverVersion", lambda: None)()
        out["gpu"] = {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                      "compute_capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count,
                      "cuda_driver_api": driver_api, "nvidia_smi": nvidia_smi()}
    return out


def sync(plan: Plan) -> None:
    if plan.device == "cuda":
        import torch

        torch.cuda.synchronize()


def peak_memory_gib(plan: Plan) -> float | None:
    if plan.device != "cuda":
        return None
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2)


def free_memory(plan: Plan) -> None:
    """What the last part left behind, so that each part's peak is its own."""
    gc.collect()
    if plan.device == "cuda":
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# ---------------------------------------------------------------------------------------------- training


def parts_and_latents(plan: Plan, resolution: int) -> tuple[Path, Path]:
    """(frozen parts folder, precomputed-latent MDS dataset) of random weights, each built once."""
    from train_throughput import make_latents

    parts = RUN.out / f"device-check-parts-{plan.arch}"
    samples = plan.batch * max(plan.warmup + plan.steps, plan.fsdp_batches)
    return parts, make_latents(plan.arch, resolution, samples, parts, RUN.out / "device-check-latents")


def phase_config(plan: Plan, phase: str, folder: Path, *extra: str):
    """configs/sd2-base-{phase}.yaml with only what one GPU (or the dry run) must change."""
    from train.config import load_config

    resolution = plan.resolutions[phase]
    parts, data = parts_and_latents(plan, resolution)
    overrides = [f"model.architecture={plan.arch}", f"model.pretrained={parts}", f"data.path={data}",
                 "data.precomputed=true", f"data.resolution={resolution}", f"global_train_batch_size={plan.batch}",
                 f"save_folder={folder}", "save_interval=1000000ba", "progress_bar=false", "loggers=[]",
                 "autoresume=false", "load_path=null"]
    overrides += plan_overrides(plan)
    return load_config(ROOT / f"configs/sd2-base-{phase}.yaml", overrides + list(extra))


def plan_overrides(plan: Plan) -> list[str]:
    """The config overrides every training part takes from the plan: microbatch, loader workers, and on the CPU
    (the dry run) fp32 without the GPU's low-precision norms."""
    overrides = []
    if plan.microbatch is not None:
        overrides.append(f"device_train_microbatch_size={plan.microbatch}")
    if plan.workers is not None:
        overrides.append(f"data.num_workers={plan.workers}")
    if plan.device == "cpu":
        overrides += ["device=cpu", "precision=fp32", "low_precision_norms=false"]
    return overrides


def attention_backend(cfg, plan: Plan) -> str:
    """The backend ``train.trainer.set_attention`` picks for this config."""
    if plan.device == "cuda" and cfg.model.attention in ("auto", "xformers"):
        try:
            import xformers  # noqa: F401

            return "xformers"
        except ImportError:
            pass
    return "sdpa"


def train_throughput(plan: Plan, phase: str) -> dict:
    from train_throughput import PEAK_TFLOPS, TFLOP_PER_IMAGE, gpu_peak, workbench

    cfg = phase_config(plan, phase, RUN.out / "device-check-train" / phase / "checkpoints", "fsdp=false")
    images_per_s = workbench(cfg, plan.steps, plan.warmup)
    out = {"config": f"configs/sd2-base-{phase}.yaml", "architecture": plan.arch,
           "resolution": cfg.data.resolution, "batch": cfg.global_train_batch_size,
           "microbatch": cfg.device_train_microbatch_size, "precision": cfg.precision,
           "low_precision_norms": cfg.low_precision_norms, "attention": attention_backend(cfg, plan),
           "ema": cfg.ema.enabled, "fsdp": False, "loader_workers": cfg.data.num_workers,
           "warmup_batches": plan.warmup, "timed_batches": plan.steps, "images_per_s": round(images_per_s, 2),
           "peak_memory_gib": peak_memory_gib(plan)}
    peak = gpu_peak() if plan.device == "cuda" else None
    if peak and cfg.data.resolution in TFLOP_PER_IMAGE and plan.arch == "sd2-base":
        out["mfu"] = round(images_per_s * TFLOP_PER_IMAGE[cfg.data.resolution] / peak, 3)
        out["mfu_peak_tflops"] = peak
    elif plan.device == "cuda":
        out["mfu"] = None  # a GPU outside train_throughput's table of dense bf16 peaks
        out["known_peaks"] = sorted(PEAK_TFLOPS)
    return out


def held_out(resolution: int, n: int) -> Path:
    """A held-out shapes split of ``n`` images at ``resolution`` for the validation loss."""
    from train.shapes import write_shapes_dataset

    folder = RUN.out / f"device-check-held-out-{resolution}-{n}"
    if not (folder / "eval" / str(resolution) / "index.json").is_file():
        shutil.rmtree(folder, ignore_errors=True)
        write_shapes_dataset(folder, 8, seed=1, sizes=(resolution,), n_eval=n, progress=False)
    return folder / "eval" / str(resolution)


class Timed:
    """Wraps one bound method of a callback: the seconds of each call, the device synchronised on both sides
    (the instance attribute shadows the class's method, so the callback's own ``run_event`` calls this)."""

    def __init__(self, owner, method: str, plan: Plan):
        self.inner, self.plan, self.seconds = getattr(owner, method), plan, []
        setattr(owner, method, self)

    def __call__(self, *args, **kwargs):
        sync(self.plan)
        t0 = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            sync(self.plan)
            self.seconds.append(time.perf_counter() - t0)


def batch_clock(plan: Plan):
    """A Composer callback: the time at each batch's end, the device synchronised."""
    from composer.core import Callback

    class Clock(Callback):
        def __init__(self):
            self.t: list[float] = []

        def batch_end(self, state, logger):
            sync(plan)
            self.t.append(time.perf_counter())

    return Clock()


def fsdp_run(plan: Plan) -> dict:
    """A whole run under FSDP: validation and previews due every ``fsdp_every`` batches, a checkpoint at the end."""
    from train.callbacks.validation import unwrap
    from train.trainer import build_trainer, run_dir_of

    phase, n, every = plan.fsdp_phase, plan.fsdp_batches, plan.fsdp_every
    resolution = plan.resolutions[phase]
    folder = RUN.out / "device-check-fsdp" / "checkpoints"
    shutil.rmtree(folder.parent, ignore_errors=True)
    extra = ["fsdp=true", f"max_duration={n}ba", f"save_interval={n}ba", f"eval_interval={every}ba",
             f"preview_interval={every}ba", f"validation.path={held_out(resolution, plan.held_out)}",
             f"validation.max_samples={plan.held_out}", f"validation.batch_size={min(64, plan.held_out)}"]
    if plan.preview_steps is not None:
        extra.append(f"previews.steps={plan.preview_steps}")
    cfg = phase_config(plan, phase, folder, *extra)
    trainer = build_trainer(cfg)
    strategy = getattr(unwrap(trainer.state.model).unet, "sharding_strategy", None)
    callbacks = {type(c).__name__: c for c in trainer.state.callbacks}
    validation = Timed(callbacks["ValidationLoss"], "measure", plan)
    previews = Timed(callbacks["Previews"], "draw", plan)
    clock = batch_clock(plan)
    trainer.state.callbacks.append(clock)
    sync(plan)
    t0 = time.perf_counter()
    trainer.fit()
    t1 = time.perf_counter()
    batches = int(trainer.state.timestamp.batch)
    last_validation = dict(callbacks["ValidationLoss"].last)
    trainer.close()
    del trainer
    window = clock.t[-1] - t0  # first batch to last batch's end: training, validation and previews
    watched = sum(validation.seconds) + sum(previews.seconds)
    gaps = [b - a for a, b in zip([t0] + clock.t, clock.t)]
    plain = [g for i, g in enumerate(gaps, 1) if i % every and i > 1]  # neither the first nor a watched batch
    checkpoint = sorted(folder.glob(f"ep*-ba{n}-rank0.pt"))
    written = sum(f.stat().st_size for f in checkpoint)
    shutil.rmtree(folder, ignore_errors=True)  # SD2-base with AdamW's moments: about 12 GB of the machine's disk
    return {"config": f"configs/sd2-base-{phase}.yaml", "architecture": plan.arch, "resolution": resolution,
            "batch": cfg.global_train_batch_size, "microbatch": cfg.device_train_microbatch_size,
            "precision": cfg.precision, "fsdp": True, "sharding_strategy": cfg.fsdp_sharding_strategy,
            # PyTorch's FSDP runs NO_SHARD when the world is one process (it warns so)
            "sharding_strategy_used": getattr(strategy, "name", None),
            "ema": cfg.ema.enabled, "batches": n, "eval_interval": cfg.eval_interval,
            "preview_interval": cfg.preview_interval, "held_out_samples": plan.held_out,
            "validation_timesteps": len(cfg.validation.timesteps), "preview_steps": cfg.previews.steps,
            "preview_images": len(cfg.previews.prompts) * len(cfg.previews.seeds),
            "completed": batches == n and bool(checkpoint), "batches_run": batches,
            "checkpoint": checkpoint[-1].name if checkpoint else None, "checkpoint_gib": round(written / 2**30, 2),
            "previews_written": len(list((run_dir_of(cfg) / "previews").glob("*.png"))),
            "validation_loss": last_validation.get("validation/loss"),
            "validation_passes": len(validation.seconds), "preview_grids": len(previews.seconds),
            "seconds_run_window": round(window, 3), "seconds_validation": [round(s, 3) for s in validation.seconds],
            "seconds_previews": [round(s, 3) for s in previews.seconds],
            "share_validation_and_previews": round(watched / window, 4),
            "median_seconds_per_plain_batch": round(statistics.median(plain), 4) if plain else None,
            "seconds_after_last_batch": round(t1 - clock.t[-1], 2),  # the final checkpoint, mostly
            "peak_memory_gib": peak_memory_gib(plan)}


# ---------------------------------------------------------------------------------------------- NCCL's rule, at scale

# A group that serves the device's tensors only: NCCL's device map with gloo behind it on the GPU (NCCL refuses two
# ranks on one GPU), its CPU twin in the dry run
RULE_BACKENDS = {"cuda": "cuda:gloo", "cpu": "cpu:gloo"}
# What the project's collectives call (``models.common.ranks``, FSDP, DDP, Composer's dist), tried one by one
COLLECTIVES = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather_object",
               "barrier")
FSDP_COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor")
# Each rank is a "node" of one process (both then hold cuda:0), and a node's Streaming state lives in its /dev/shm,
# which two nodes must not share (``train.data.loader.check_node_shared_memory``): each gets its own, as
# tests/ranks.py gives the suite's two-node runs
PRIVATE_SHM = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh"]


def try_collectives(device: str) -> dict:
    """Each of ``COLLECTIVES`` on a tensor of ``device`` in the joined group: "served", or the error in one line."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    one = lambda: torch.ones(4, device=device)  # noqa: E731
    calls = {"all_reduce": lambda: dist.all_reduce(one()),
             "broadcast": lambda: dist.broadcast(one(), src=0),
             "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(4 * world, device=device),
                                                                           one()),
             "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.empty(4, device=device),
                                                                         torch.ones(4 * world, device=device)),
             "all_gather_object": lambda: dist.all_gather_object([None] * world, {"rank": dist.get_rank()}),
             "barrier": dist.barrier}
    served = {}
    for name in COLLECTIVES:
        try:
            calls[name]()
            served[name] = "served"
        except (RuntimeError, ValueError, NotImplementedError) as e:
            served[name] = one_line(e)
    return served


def rule_config(plan: Plan, folder: Path, fsdp: bool):
    """Phase 1 with FSDP (FULL_SHARD, sharded checkpoint) or DDP, EMA from the first batch, validation, previews and
    a save every ``rule_every`` batches: every path that meets a collective, due within ``rule_batches``."""
    resolution = plan.resolutions["phase1"]
    every = f"{plan.rule_every}ba"
    extra = [f"max_duration={plan.rule_batches}ba", f"save_interval={every}", f"eval_interval={every}",
             f"preview_interval={every}", f"validation.path={held_out(resolution, plan.held_out)}",
             f"validation.max_samples={plan.held_out}", f"validation.batch_size={min(64, plan.held_out)}",
             "ema.enabled=true", "ema.ema_start=0ba", "dist_timeout=600"]
    extra += (["fsdp=true", "fsdp_sharding_strategy=FULL_SHARD", "fsdp_state_dict_type=sharded"] if fsdp
              else ["fsdp=false"])
    if plan.preview_steps is not None:
        extra.append(f"previews.steps={plan.preview_steps}")
    return phase_config(plan, "phase1", folder, *extra)


def rule_rank(plan: Plan) -> dict:
    """One rank of ``nccl_rule`` (its process is started by ``nccl_rule``): the group joined with
    ``RULE_BACKENDS``, the collectives tried, then the run."""
    import datetime

    import torch
    import torch.distributed as dist

    from train.callbacks.validation import ema_of, unwrap
    from train.trainer import build_trainer, run_dir_of

    from composer.devices import DeviceCPU, DeviceGPU

    if plan.device == "cuda":
        torch.cuda.set_device(0)
    backend = RULE_BACKENDS[plan.device]
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=600))
    # Composer's Trainer joins the group its device names ("nccl", "gloo") and refuses one joined under another
    # name: its device is told this group's, which stands in for NCCL's
    (DeviceGPU if plan.device == "cuda" else DeviceCPU).dist_backend = backend
    device = "cuda:0" if plan.device == "cuda" else "cpu"
    served = try_collectives(device)
    fsdp = all(served[name] == "served" for name in FSDP_COLLECTIVES)
    folder = RUN.out / "device-check-nccl-rule" / "checkpoints"
    cfg = rule_config(plan, folder, fsdp)
    trainer = build_trainer(cfg)
    callbacks = {type(c).__name__: c for c in trainer.state.callbacks}
    model = unwrap(trainer.state.model)
    trainer.fit()
    batches = int(trainer.state.timestamp.batch)
    ema = ema_of(trainer.state)
    counted = run_dir_of(cfg) / "memory" / f"rank{dist.get_rank()}.json"  # what this rank held, EMA shards too
    out = {"rank": dist.get_rank(), "backend": str(dist.get_backend()), "collectives": served, "fsdp": fsdp,
           "sharding_strategy_used": getattr(getattr(model.denoiser, "sharding_strategy", None), "name", None),
           "batches_run": batches, "validation_loss": dict(callbacks["ValidationLoss"].last).get("validation/loss"),
           "previews_written": len(list((run_dir_of(cfg) / "previews").glob("*.png"))),
           "ema_started": bool(ema is not None and ema.ema_started),
           "held": json.loads(counted.read_text()) if counted.is_file() else None,
           "checkpoints": sorted(p.name for p in folder.iterdir()) if folder.is_dir() else [],
           "peak_memory_gib": peak_memory_gib(plan)}
    trainer.close()
    dist.destroy_process_group()
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nccl_rule(plan: Plan) -> dict:
    """Two ranks on the one device in a group serving only its tensors (``rule_rank`` each), their reports joined:
    which collectives gloo served there, and which parts of a run the rehearsal covered."""
    resolution = plan.resolutions["phase1"]
    parts_and_latents(plan, resolution)  # built once here, before two ranks read them
    held_out(resolution, plan.held_out)
    folder = RUN.out / "device-check-nccl-rule"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    port, procs = free_port(), []
    try:
        for rank in range(2):  # each rank local rank 0 of its own "node": both hold cuda:0
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                   "NODE_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            argv = [sys.executable, str(Path(__file__).resolve()), "--rule-rank", "--out",
                    str(folder / f"rank{rank}.json"), "--work", str(RUN.out), *(["--dry-run"] * RUN.smoke)]
            with open(folder / f"rank{rank}.log", "w") as log:
                procs.append(subprocess.Popen(PRIVATE_SHM + argv, env=env, stdout=log, stderr=subprocess.STDOUT))
        codes = [p.wait() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        tail = (folder / f"rank{codes.index(next(c for c in codes if c))}.log").read_text().strip().splitlines()
        raise RuntimeError(f"a rank exited {max(codes)}: {tail[-1] if tail else 'no output'}")
    return rehearsal([json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)], plan)


def rehearsal(ranks: list[dict], plan: Plan) -> dict:
    """The ranks' reports (``rule_rank``'s) joined: what the group refused, which parts of a run were rehearsed,
    and, for those that were not, why."""
    first = ranks[0]
    refused = {name: why for name, why in first["collectives"].items() if why != "served"}
    rehearsed = ["collectives", "validation", "previews", "ema"] + (["fsdp", "sharded_save"] if first["fsdp"] else
                                                                   ["ddp"])
    not_rehearsed = {} if first["fsdp"] else {
        "fsdp": f"the group does not serve {', '.join(n for n in FSDP_COLLECTIVES if n in refused)} on {plan.device}",
        "sharded_save": "written by FSDP only"}
    return {"backend": first["backend"], "ranks": len(ranks), "device": plan.device,
            "collectives": first["collectives"], "refused": refused, "rehearsed": rehearsed,
            "not_rehearsed": not_rehearsed, "completed": all(r["batches_run"] == plan.rule_batches for r in ranks),
            "batches": plan.rule_batches, "every": plan.rule_every, "per_rank": ranks}


def mmdit_medium(plan: Plan) -> dict:
    """configs/{mmdit_config}.yaml stepped on random weights: peak memory against the memory plan it was admitted
    with and against what the run counted it held (``memory/rank0.json``)."""
    from _common import fit_batch_end_times
    from train.config import load_config
    from train.trainer import build_trainer, check_memory, resolve_device, run_dir_of
    from train_throughput import make_latents

    base = load_config(ROOT / f"configs/{plan.mmdit_config}.yaml")
    arch, res = base.model.architecture, plan.mmdit_resolution
    parts = RUN.out / f"device-check-parts-{arch}"
    data = make_latents(arch, res, plan.mmdit_batch * (plan.mmdit_steps + 1), parts, RUN.out / "device-check-latents")
    folder = RUN.out / "device-check-mmdit" / "checkpoints"
    overrides = [f"model.pretrained={parts}", f"data.path={data}", "data.precomputed=true", f"data.resolution={res}",
                 f"global_train_batch_size={plan.mmdit_batch}", f"save_folder={folder}", "save_interval=1000000ba",
                 "eval_interval=null", "preview_interval=null", "progress_bar=false", "loggers=[]",
                 "autoresume=false", "load_path=null", "fsdp=false", "model.other_phrasing=0"]
    overrides += plan_overrides(plan)
    cfg = load_config(ROOT / f"configs/{plan.mmdit_config}.yaml", overrides)
    planned = check_memory(cfg, resolve_device(cfg))  # on the meta device: what build_trainer checks again
    trainer = build_trainer(cfg)
    times = fit_batch_end_times(trainer, plan.mmdit_steps, sync=lambda: sync(plan))
    trainer.close()
    counted = run_dir_of(cfg) / "memory" / "rank0.json"
    held = json.loads(counted.read_text()) if counted.is_file() else None
    peak = peak_memory_gib(plan)
    gib = lambda n: round(n / 2**30, 3)  # noqa: E731
    return {"config": f"configs/{plan.mmdit_config}.yaml", "architecture": arch, "resolution": res,
            "batch": cfg.global_train_batch_size, "microbatch": cfg.device_train_microbatch_size,
            "precision": cfg.precision, "ema": cfg.ema.enabled, "steps": plan.mmdit_steps,
            "seconds_per_batch": round((times[-1] - times[0]) / max(1, len(times) - 1), 3),
            "plan_gib": {k: gib(v) for k, v in planned.as_dict().items()}, "plan_total_gib": gib(planned.total),
            "held": held, "peak_memory_gib": peak,
            "peak_over_plan": round(peak / gib(planned.total), 3) if peak else None}


# ---------------------------------------------------------------------------------------------- generation


def model_to_sample(plan: Plan) -> Path:
    """SD2-base of random weights as a diffusers folder (evaluate_bench's, built once), or the tiny checkpoint."""
    if plan.arch == "tiny":
        return tiny_checkpoint()
    from evaluate_bench import sd2_base_folder

    return sd2_base_folder(RUN.out / "sd2-base-random")


def dtype_name(plan: Plan) -> str:
    return "bf16" if plan.device == "cuda" else "fp32"


def sampling(plan: Plan) -> dict:
    from diffusers.models.attention_processor import AttnProcessor2_0

    from app_overhead import GUIDANCE, NEGATIVE, PROMPT, SAMPLER
    from models.checkpoints import load_pipeline
    from models.generation import Settings, generate_images, pipeline_dtype

    model = model_to_sample(plan)
    t0 = time.perf_counter()
    pipe = load_pipeline(model, device=plan.device, dtype=pipeline_dtype(dtype_name(plan), plan.device))
    for module in (pipe.unet, pipe.vae):
        module.set_attn_processor(AttnProcessor2_0())  # PyTorch SDPA, as `dwb app` sets on a GPU
    open_s = time.perf_counter() - t0
    size = plan.sample_size
    settings = Settings(steps=plan.sample_steps, guidance=GUIDANCE, width=size, height=size, sampler=SAMPLER,
                        negative_prompt=NEGATIVE)

    def one_image(seed: int) -> float:
        sync(plan)
        t = time.perf_counter()
        images = generate_images(pipe, [PROMPT], [seed], settings)
        sync(plan)
        if images.shape != (1, size, size, 3):
            raise RuntimeError(f"generate_images returned {images.shape}, not (1, {size}, {size}, 3)")
        return time.perf_counter() - t

    warm = one_image(0)  # kernel selection, first allocations
    times = [one_image(seed) for seed in range(1, plan.sample_rounds + 1)]
    del pipe
    return {"model": f"{plan.arch}, random weights" if plan.arch != "tiny" else "tiny checkpoint",
            "size": size, "sampler": SAMPLER, "steps": plan.sample_steps, "guidance": GUIDANCE, "batch": 1,
            "dtype": dtype_name(plan), "attention": "sdpa",
            "seconds_open": round(open_s, 2), "seconds_first_image": round(warm, 3),
            "seconds_per_image": [round(t, 3) for t in times],
            "median_seconds_per_image": round(statistics.median(times), 3),
            "peak_memory_gib": peak_memory_gib(plan)}


def scoring_inputs(plan: Plan, model: Path) -> tuple[Path, Path, list[str]]:
    """(reference split, Inception weights, the CLIP flags): a shapes reference at the scoring size, Inception-v3
    and (on the GPU) a ViT-L/14-sized CLIP, all of random weights, built by evaluate_bench's helpers."""
    from evaluate_bench import random_clip_large, random_inception

    weights = random_inception(RUN.out / "inception-random" / "weights-inception-2015-12-05-6726825d.pth")
    if plan.arch == "tiny":
        return fixtures()[0] / str(plan.score_size), weights, []
    from train.shapes import write_shapes_dataset

    n, size = plan.score_images, plan.score_size
    ref = RUN.out / f"reference-{size}-{n}"
    if not (ref / str(size) / "index.json").is_file():
        write_shapes_dataset(ref, n, seed=0, sizes=(size,), n_eval=0, progress=False)
    clip = random_clip_large(RUN.out / "clip-vit-l14-random", model / "tokenizer")
    return ref / str(size), weights, ["--clip", str(clip)]


def results_rows(folder: Path) -> list[dict]:
    from models.common import loads_outside

    text = (folder / "results.jsonl").read_text()
    return [loads_outside(line, f"{folder / 'results.jsonl'}") for line in text.splitlines() if line.strip()]


def scoring(plan: Plan) -> dict:
    """`dwb evaluate run` in this process, as the command parses it; images/s from the rows it writes."""
    from dwb import build_parser
    from evaluate_bench import GUIDANCE_CPU, GUIDANCE_GPU, SAMPLER

    model = model_to_sample(plan)
    t0 = time.perf_counter()
    reference, weights, clip = scoring_inputs(plan, model)
    setup_s = time.perf_counter() - t0
    n, guidance = plan.score_images, GUIDANCE_GPU if plan.device == "cuda" else GUIDANCE_CPU
    folder = RUN.out / "device-check-scoring"
    shutil.rmtree(folder, ignore_errors=True)
    argv = ["evaluate", "run", *[str(model)] * plan.score_passes, "--out", str(folder), "--reference", str(reference),
            "--inception-weights", str(weights), *clip, "--prompts", "reference", "--n-prompts", str(n),
            "--n-reference", str(n), "--guidance", str(guidance), "--sampler", SAMPLER, "--steps",
            str(plan.score_steps), "--size", str(plan.score_size), "--batch-size", str(plan.score_batch),
            "--device", plan.device, "--dtype", dtype_name(plan), "--kid-subset-size", str(min(1000, n))]
    if plan.score_inception_features is not None:
        argv += ["--inception-features", str(plan.score_inception_features)]
    args = build_parser().parse_args(argv)
    t1 = time.perf_counter()
    args.func(args)
    wall = time.perf_counter() - t1
    rows = results_rows(folder)
    keys = ("n_images", "seconds_checkpoint", "seconds_generate", "seconds_metrics")
    last = rows[-1]
    return {"command": "dwb " + " ".join(argv[:2] + ["MODEL"] * plan.score_passes + argv[2 + plan.score_passes:]),
            "model": f"{plan.arch}, random weights" if plan.arch != "tiny" else "tiny checkpoint",
            "images": n, "size": plan.score_size, "steps": plan.score_steps, "sampler": SAMPLER,
            "guidance": guidance, "batch_size": plan.score_batch, "dtype": dtype_name(plan),
            "clip_score": bool(clip), "seconds_setup": round(setup_s, 1), "seconds_command": round(wall, 1),
            "first_checkpoint": {k: rows[0].get(k) for k in keys},
            **({"next_checkpoint": {k: last.get(k) for k in keys}} if len(rows) > 1 else {}),
            "images_per_s": round(last["n_images"] / last["seconds_checkpoint"], 3),
            "peak_memory_gib": peak_memory_gib(plan)}


# ---------------------------------------------------------------------------------------------- the run


PARTS = {
    "train_256": lambda plan: train_throughput(plan, "phase1"),
    "train_512": lambda plan: train_throughput(plan, "phase2"),
    "fsdp": fsdp_run,
    "sampling": sampling,
    "scoring": scoring,
    "nccl_rule": nccl_rule,
    "mmdit_medium": mmdit_medium,
}


def one_line(e: BaseException) -> str:
    from models.errors import first_line

    return f"{type(e).__name__}: {first_line(e)}"


def run_part(name: str, fn, plan: Plan, budget: float) -> dict:
    """``fn(plan)``'s figures under a time budget; a failure is recorded in one line (its traceback goes to
    stderr) and never stops the run."""
    def over(signum, frame):
        raise OverBudget(f"over its budget of {budget:g} s")

    print(f"{NAME}: {name} (budget {budget:.0f} s)", flush=True)
    free_memory(plan)
    previous = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, budget)
    t0 = time.perf_counter()
    try:
        result = {"status": "ok", **fn(plan)}
    except (Exception, SystemExit, OverBudget) as e:  # noqa: BLE001 - the next part runs whatever this one did
        signal.setitimer(signal.ITIMER_REAL, 0)
        traceback.print_exc()
        result = {"status": "over budget" if isinstance(e, OverBudget) else "failed", "error": one_line(e)}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    result.update(budget_seconds=round(budget, 1), wall_seconds=round(time.perf_counter() - t0, 1))
    free_memory(plan)
    print(f"{NAME}: {name} {result['status']} in {result['wall_seconds']} s", flush=True)
    return result


def write_report(path: Path, report: dict) -> None:
    from models.common import write_text_whole

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_whole(path, json.dumps(report, indent=2))


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", "--smoke", dest="dry_run", action="store_true",
                    help="every part on the CPU at tiny size (its figures mean nothing); exit status 1 if a part fails")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / f"{NAME}.json",
                    help=f"the JSON file to write (default bench/out/{NAME}.json); a folder: {NAME}.json in it, and "
                         "its data and models built there too")
    ap.add_argument("--work", type=Path, help="folder for the data and random-weight models it builds (default: "
                                              "the --out folder; bench/out; with --dry-run a temporary folder)")
    ap.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS), help="run only these parts")
    ap.add_argument("--batch", type=int, help="global batch of the training parts (default 64; dry run 8)")
    ap.add_argument("--score-images", type=int, help="images `dwb evaluate run` scores (default 128; dry run 8)")
    ap.add_argument("--pins", action="store_true", help="print the pins to carry as wheels to a GPU machine, and exit")
    ap.add_argument("--rule-rank", action="store_true", help=argparse.SUPPRESS)  # one rank of nccl_rule: --out its JSON
    return ap.parse_args()


def set_work_folder(args: argparse.Namespace) -> Path:
    """The JSON's path; sets ``RUN`` (the shared builders' folder and smoke flag) as the other scripts' options do."""
    RUN.smoke = args.dry_run
    out = args.out.resolve()
    if out.is_dir():
        RUN.out, out = out, out / f"{NAME}.json"
    elif args.work is not None:
        RUN.out = args.work.resolve()
    elif args.dry_run:
        RUN.out = Path(tempfile.mkdtemp(prefix="dwb-device-check-"))
        atexit.register(shutil.rmtree, RUN.out, ignore_errors=True)
    else:
        RUN.out = ROOT / "bench" / "out"
    RUN.out.mkdir(parents=True, exist_ok=True)
    return out


def main() -> None:
    args = parse_args()
    if args.pins:
        print("\n".join(carried_pins()))
        return
    if args.dry_run:
        # One thread, as every smoke run: on 2 shared cores torch's own threads cost more than they give.
        os.environ["OMP_NUM_THREADS"] = "1"
    out = set_work_folder(args)
    plan = DRY_RUN if args.dry_run else GPU
    overrides = {k: v for k, v in (("batch", args.batch), ("score_images", args.score_images)) if v is not None}
    plan = Plan(**{**asdict(plan), **overrides})
    import torch

    if args.dry_run:
        torch.set_num_threads(1)
    elif not torch.cuda.is_available():
        raise SystemExit(f"{NAME}: no CUDA GPU is visible; --dry-run runs every part on the CPU at tiny size")
    import composer  # noqa: F401 - the libraries every part uses, imported once before any part's clock starts
    import streaming  # noqa: F401
    import transformers  # noqa: F401
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()  # dtype-cast notices, as `dwb` silences them
    if args.rule_rank:
        write_report(out, rule_rank(plan))
        return
    total = DRY_RUN_TOTAL_S if args.dry_run else TOTAL_BUDGET_S
    report = {"benchmark": NAME, **({"smoke": True} if args.dry_run else {}), "dry_run": args.dry_run,
              "date": time.strftime("%Y-%m-%d"), "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": "python bench/device_check.py " + " ".join(sys.argv[1:]),
              "versions": versions(), "machine": machine(), "plan": asdict(plan), "total_budget_seconds": total,
              "seconds_start": round(time.perf_counter() - STARTED, 1), "parts": {}, "complete": False}
    write_report(out, report)
    for name in args.parts:
        left = total - (time.perf_counter() - STARTED)
        if left < LAST_PART_MIN_S:
            report["parts"][name] = {"status": "skipped", "error": f"{left:.0f} s of the run's budget left"}
        else:
            report["parts"][name] = run_part(name, PARTS[name], plan, min(plan.budgets[name], left))
        write_report(out, report)  # after every part: a run cut short keeps what it measured
    report.update(complete=True, wall_seconds=round(time.perf_counter() - STARTED, 1),
                  failed=[k for k, v in report["parts"].items() if v["status"] != "ok"])
    write_report(out, report)
    print(json.dumps(report, indent=2), flush=True)
    if report["failed"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
