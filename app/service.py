"""The app's generation service, without Gradio: roots, device, pipeline cache, stop requests, outputs.

``Service.generate`` and ``Service.compare`` are what the UI's events (and the API) call; every
problem a user can fix comes out as a one-line ``WorkbenchError``.

Loading and generation run on the process's compute threads (one per concurrent generation), never
on whichever thread the web server hands a request to: PyTorch's CPU kernels keep one OpenMP
thread team per calling thread, and with a second team spinning next to the first, a generation on
2 cores took 3x as long (measured in bench/app_overhead.py's set-up).
"""
from __future__ import annotations

import contextvars
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from PIL import Image

from train.errors import WorkbenchError

from train.checkpoints import Checkpoint, CheckpointInfo, content_hash, describe, discover, find_checkpoint
from train.generation import ImageRecord, save_png, with_metadata

from .cache import PipelineCache
from .generate import GenerationParams, Limits, generate, record_of, validate

log = logging.getLogger("app")
WEIGHTS = ("ema", "raw")
_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def compute_pool(workers: int) -> ThreadPoolExecutor:
    """The process's long-lived compute threads for ``workers`` concurrent generations (shared by services)."""
    with _pools_lock:
        if workers not in _pools:
            _pools[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dwb-compute")
        return _pools[workers]


@dataclass(frozen=True)
class Runtime:
    """Where pipelines run: float32 on CPU; bf16 (or fp16) with PyTorch's SDPA attention on a GPU."""

    device: str
    dtype: torch.dtype

    @classmethod
    def pick(cls, device: str = "auto", dtype: str = "auto") -> "Runtime":
        from train.device import pick_device, pipeline_dtype

        chosen = pick_device(device)
        return cls(str(chosen), pipeline_dtype(dtype, chosen))


@dataclass
class Result:
    images: list[Image.Image]  # PNG text chunks in .info
    records: list[ImageRecord]
    seconds: float


class Service:
    """Generation from the checkpoints under ``roots``: what `dwb app`'s events and API call."""

    def __init__(self, roots: list[Path], *, limits: Limits = Limits(), runtime: Runtime | None = None,
                 cache_size: int = 2, output: Path | None = None, workers: int = 1, allow_download: bool = False):
        self.roots = roots
        self.allow_download = allow_download  # hub ids: only from the local cache unless the server allows more
        self.limits = limits
        self.runtime = runtime or Runtime.pick()
        self.cache = PipelineCache(cache_size)
        self.output = output
        self._compute = compute_pool(workers)
        self._stops: dict[str, threading.Event] = {}
        self._stops_lock = threading.Lock()
        self._saved = 0

    # -- checkpoints -----------------------------------------------------------------------------

    def checkpoints(self) -> list[Checkpoint]:
        return discover(self.roots)

    def open(self, text: str) -> Checkpoint:
        """A checkpoint under the roots (or a hub id from the cache); errors name it by label, never by the
        server's absolute paths."""
        if not isinstance(text, str):
            raise WorkbenchError(f"a checkpoint is named by one text, got {type(text).__name__}")
        try:
            return find_checkpoint(text, roots=self.roots, allow_download=self.allow_download)
        except WorkbenchError as e:
            raise WorkbenchError(self.redact(str(e))) from None

    def redact(self, message: str) -> str:
        """A message with the roots' absolute paths replaced by the names the UI shows under them."""
        for root in sorted(self.roots, key=lambda r: len(str(r)), reverse=True):
            message = message.replace(f"{root}/", f"{root.name}/" if len(self.roots) > 1 else "")
            message = message.replace(str(root), root.name)
        return message

    def info(self, text: str) -> tuple[Checkpoint, CheckpointInfo]:
        ckpt = self.open(text)
        return ckpt, describe(ckpt)

    def pipeline(self, ckpt: Checkpoint, weights: str):
        """The pipeline for a checkpoint's EMA or raw weights, from the cache or loaded into it."""
        if weights not in WEIGHTS:
            raise WorkbenchError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
        ema = weights == "ema" and ckpt.kind in ("composer", "mosaicml")  # the other kinds hold one set of weights
        key = (str(ckpt.path), ema, content_hash(ckpt), self.runtime)
        return self.cache.get(key, lambda: self._load(ckpt, ema))

    def _load(self, ckpt: Checkpoint, ema: bool):
        from train.checkpoints import load_pipeline

        t0 = time.perf_counter()
        try:
            pipe = load_pipeline(ckpt, ema=ema, device=self.runtime.device, dtype=self.runtime.dtype)
        except WorkbenchError as e:
            raise WorkbenchError(self.redact(f"{ckpt.label}: {str(e).replace(str(ckpt.path), ckpt.label)}")) from None
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

        def step(k: int, done: int, total: int) -> None:
            if on_step is not None:
                on_step(done, total)

        return self._run([ckpt], weights, params, session, step)

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

        def step(k: int, done: int, total: int) -> None:
            if on_step is not None:
                on_step(k, len(ckpts), done, total)

        return self._run(ckpts, weights, params, session, step)

    def _run(self, ckpts: list[Checkpoint], weights: str, params: GenerationParams, session: str,
             on_step: Callable[[int, int, int], None]) -> Result:
        """Generate on a compute thread (the caller's context, e.g. Gradio's progress, goes along)."""
        stop = self._begin(session)
        try:
            return self._compute.submit(contextvars.copy_context().run, self._generate, ckpts, weights, params,
                                        stop, on_step).result()
        finally:
            self._end(session, stop)

    def _generate(self, ckpts: list[Checkpoint], weights: str, params: GenerationParams, stop: threading.Event,
                  on_step: Callable[[int, int, int], None]) -> Result:
        t0 = time.perf_counter()
        images, records = [], []
        for k, ckpt in enumerate(ckpts):
            pipe = self.pipeline(ckpt, weights)
            digest = content_hash(ckpt)
            kind = weights if ckpt.kind in ("composer", "mosaicml") else "stored"
            out = generate(pipe, params, on_step=lambda done, total: on_step(k, done, total), should_stop=stop.is_set)
            for i, image in enumerate(out):
                record = record_of(params, i, ckpt.label, digest, kind)
                images.append(with_metadata(image, record))
                records.append(record)
                self._save(image, record)
        return Result(images, records, time.perf_counter() - t0)

    def _save(self, image: Image.Image, record: ImageRecord) -> None:
        """With ``--output DIR``: also keep every image as DIR/YYYY-MM-DD/HHMMSS-N-SEED.png."""
        if self.output is None:
            return
        folder = self.output / time.strftime("%Y-%m-%d")
        folder.mkdir(parents=True, exist_ok=True)
        with self._stops_lock:
            self._saved += 1
            n = self._saved
        save_png(image, folder / f"{time.strftime('%H%M%S')}-{n}-{record.seed}.png", record)
