"""The app's generation service, without Gradio: roots, device, pipeline cache, stop requests, outputs.

``Service.generate`` and ``Service.compare`` are what the UI's events (and the API) call; every
problem a user can fix comes out as a one-line ``WorkbenchError``.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from PIL import Image

from train.errors import WorkbenchError

from .cache import PipelineCache
from .checkpoints import Checkpoint, CheckpointInfo, checkpoint_hash, describe, discover, resolve_checkpoint, \
    weights_version
from .generate import GenerationParams, ImageRecord, Limits, generate, save_png, validate, with_metadata

log = logging.getLogger("app")
WEIGHTS = ("ema", "raw")


@dataclass(frozen=True)
class Runtime:
    """Where pipelines run: float32 on CPU; bf16 (or fp16) with PyTorch's SDPA attention on a GPU."""

    device: str
    dtype: torch.dtype

    @classmethod
    def pick(cls, device: str = "auto", dtype: str = "auto") -> "Runtime":
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise WorkbenchError("--device cuda: no CUDA GPU is visible")
        names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                 "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
        if dtype == "auto":
            on_gpu = device.startswith("cuda")
            chosen = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if on_gpu else torch.float32
        elif dtype in names:
            chosen = names[dtype]
        else:
            raise WorkbenchError(f"unknown dtype {dtype!r}; choose auto, float32, bfloat16 or float16")
        return cls(device, chosen)


@dataclass
class Result:
    images: list[Image.Image]  # PNG text chunks in .info
    records: list[ImageRecord]
    seconds: float


class Service:
    def __init__(self, roots: list[Path], *, limits: Limits = Limits(), runtime: Runtime | None = None,
                 cache_size: int = 2, output: Path | None = None):
        self.roots = roots
        self.limits = limits
        self.runtime = runtime or Runtime.pick()
        self.cache = PipelineCache(cache_size)
        self.output = output
        self._stops: dict[str, threading.Event] = {}
        self._stops_lock = threading.Lock()
        self._saved = 0

    # -- checkpoints -----------------------------------------------------------------------------

    def checkpoints(self) -> list[Checkpoint]:
        return discover(self.roots)

    def open(self, text: str) -> Checkpoint:
        return resolve_checkpoint(text, self.roots)

    def info(self, text: str) -> tuple[Checkpoint, CheckpointInfo]:
        ckpt = self.open(text)
        return ckpt, describe(ckpt)

    def pipeline(self, ckpt: Checkpoint, weights: str):
        """The pipeline for a checkpoint's EMA or raw weights, from the cache or loaded into it."""
        if weights not in WEIGHTS:
            raise WorkbenchError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
        ema = weights == "ema" and ckpt.kind == "composer"  # a diffusers folder holds the weights it was exported with
        key = (str(ckpt.path), ema, *weights_version(ckpt), self.runtime)
        return self.cache.get(key, lambda: self._load(ckpt, ema))

    def _load(self, ckpt: Checkpoint, ema: bool):
        from train.pipeline import load_pipeline

        t0 = time.perf_counter()
        try:
            pipe = load_pipeline(ckpt.path, ema=ema, device=self.runtime.device, dtype=self.runtime.dtype)
        except WorkbenchError as e:
            raise WorkbenchError(f"{ckpt.label}: {e}" if ckpt.label not in str(e) and str(ckpt.path) not in str(e)
                                 else str(e)) from None
        except Exception as e:  # noqa: BLE001 - anything else a foreign file can make a loader raise
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            raise WorkbenchError(f"cannot load {ckpt.label}: {type(e).__name__}: {first}") from None
        if self.runtime.device.startswith("cuda"):
            from diffusers.models.attention_processor import AttnProcessor2_0

            pipe.unet.set_attn_processor(AttnProcessor2_0())  # PyTorch SDPA (flash / memory-efficient kernels)
            pipe.vae.set_attn_processor(AttnProcessor2_0())
        log.info("loaded %s (%s) in %.1f s", ckpt.label, "EMA" if ema else "raw", time.perf_counter() - t0)
        return pipe

    # -- stop requests, per browser session (or API client) ---------------------------------------

    def _begin(self, session: str) -> threading.Event:
        with self._stops_lock:
            event = self._stops[session] = threading.Event()
        return event

    def stop(self, session: str) -> None:
        """Ask the session's running generation to end after its current step."""
        with self._stops_lock:
            event = self._stops.get(session)
        if event is not None:
            event.set()

    def _end(self, session: str, event: threading.Event) -> None:
        with self._stops_lock:
            if self._stops.get(session) is event:
                del self._stops[session]

    # -- generation ------------------------------------------------------------------------------

    def generate(self, checkpoint: str, weights: str, params: GenerationParams, *, session: str = "",
                 on_step: Callable[[int, int], None] | None = None) -> Result:
        """``params.batch_size`` images from one checkpoint; every parameter validated first."""
        params = validate(params, self.limits)
        ckpt = self.open(checkpoint)
        return self._run([ckpt], weights, params, session, lambda k, done, total: on_step and on_step(done, total))

    def compare(self, checkpoints: list[str], weights: str, params: GenerationParams, *, session: str = "",
                on_step: Callable[[int, int, int, int], None] | None = None) -> Result:
        """One image per checkpoint (2 to 4), same prompt, seed and settings."""
        params = validate(params, self.limits)
        names = [c for c in (checkpoints or []) if str(c).strip()]
        if not 2 <= len(names) <= 4:
            raise WorkbenchError(f"choose two to four checkpoints to compare, got {len(names)}")
        ckpts = [self.open(c) for c in names]
        if len({c.path for c in ckpts}) < len(ckpts):
            raise WorkbenchError("the same checkpoint is chosen twice: choose different ones")
        params.batch_size = 1
        n = len(ckpts)
        return self._run(ckpts, weights, params, session,
                         lambda k, done, total: on_step and on_step(k, n, done, total))

    def _run(self, ckpts: list[Checkpoint], weights: str, params: GenerationParams, session: str,
             on_step: Callable[[int, int, int], None]) -> Result:
        t0 = time.perf_counter()
        stop = self._begin(session)
        images, records = [], []
        try:
            for k, ckpt in enumerate(ckpts):
                pipe = self.pipeline(ckpt, weights)
                digest = checkpoint_hash(ckpt)
                kind = weights if ckpt.kind == "composer" else "exported"
                out = generate(pipe, params, on_step=lambda done, total: on_step(k, done, total),
                               should_stop=stop.is_set)
                for i, image in enumerate(out):
                    record = ImageRecord.of(params, i, ckpt.label, digest, kind)
                    images.append(with_metadata(image, record))
                    records.append(record)
                    self._save(image, record)
        finally:
            self._end(session, stop)
        return Result(images, records, time.perf_counter() - t0)

    def _save(self, image: Image.Image, record: ImageRecord) -> None:
        """With ``--output DIR``: also keep every image as DIR/YYYY-MM-DD/NNNNN-SEED.png."""
        if self.output is None:
            return
        folder = self.output / time.strftime("%Y-%m-%d")
        folder.mkdir(parents=True, exist_ok=True)
        with self._stops_lock:
            self._saved += 1
            n = self._saved
        save_png(image, folder / f"{n:05d}-{record.seed}.png", record)
