"""The app's generation service, without Gradio: roots, device, pipeline cache, stop requests, outputs.

``Service.generate`` and ``Service.compare`` are what the UI's events (and the API) call; every
problem a user can fix comes out as a one-line ``WorkbenchError``.

Loading and generation run on the process's compute threads (one per concurrent generation), never
on whichever thread the web server hands a request to: PyTorch's CPU kernels keep one OpenMP
thread team per calling thread, and with a second team spinning next to the first, a generation on
2 cores took 3x as long (measured in bench/app_overhead.py's set-up).
"""
from __future__ import annotations

import contextlib
import contextvars
import difflib
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch
from PIL import Image

from models.errors import WorkbenchError, first_line
from models.checkpoints import (Checkpoint, CheckpointInfo, ChosenLora, LoraFiles, content_hash, describe, discover,
                                find_checkpoint, weights_of)
from models.families import family_or_ours
from models.generation import (WEIGHT_CHOICES, ImageRecord, Refiner, check_drawable, generate_images, guidance_kind_of,
                               save_png, with_metadata)

from .cache import PipelineCache
from .generate import (GenerationParams, Limits, check_client, check_pixel_steps, checkpoint_name, generate,
                       pixel_steps, record_of, settings_of, shown, validate, whole_number)
from .labelled_grid import labelled_grid
from .scores import ScoreFiles
from .xyz import Plan, parse_axis, plan

log = logging.getLogger("app")
WEIGHTS = WEIGHT_CHOICES  # "auto": EMA where the checkpoint holds EMA weights
NOT_FOUND = "checkpoint not found: "  # models.checkpoints' words for a name that names nothing
NOT_A_PIPELINE = "is a folder but neither a diffusers pipeline"  # ... and for a folder that is no checkpoint
SERVER_PATH = re.compile(r"(?<![\w.:/])/(?:[^\s/:'\"(),;]+/)*[^\s/:'\"(),;]+")  # an absolute POSIX path in a message
KNOWN_SHOWN = 5  # labels a "checkpoint not found" message names
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
        from models.generation import pick_device, pipeline_dtype

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
                 cache_size: int = 2, output: Path | None = None, workers: int = 1, allow_download: bool = False,
                 results: list[Path] = (), studies: list[Path] = (), adapter_cache: Path | None = None):
        from models.common import download_cache
        from models.export import AdapterExports

        self.roots = roots
        self.scores = ScoreFiles(roots, results, studies,
                                 checkpoints=lambda: [c.path for c in self.checkpoints() if c.path is not None])
        # adapter checkpoints of runs are exported once per version into the app's own cache, never the user's folders
        self.adapter_exports = AdapterExports(adapter_cache or download_cache("adapters"))
        # the LoRA files (and adapter checkpoints) under the same folders, by the same rules
        self.loras = LoraFiles(roots, exported=lambda path: self.adapter_exports.file_of(find_checkpoint(path)))
        self.allow_download = allow_download  # hub ids: only from the local cache unless the server allows more
        self.limits = limits
        self.runtime = runtime or Runtime.pick()
        self.cache = PipelineCache(cache_size)
        self.output = output
        self._compute = compute_pool(workers)
        self._stops: dict[str, threading.Event] = {}
        self._stops_lock = threading.Lock()
        self._running: dict[str, list[int]] = {}  # client -> the pixel-steps of each of its running requests
        self._running_lock = threading.Lock()
        self._saved = 0

    # -- checkpoints -----------------------------------------------------------------------------

    def checkpoints(self) -> list[Checkpoint]:
        """The checkpoints under the roots that draw: a run's adapter checkpoints are listed with the LoRAs instead
        (``models.checkpoints.LoraFiles``), as they hold no whole model."""
        return [c for c in discover(self.roots) if not self.loras.lists_as_lora(c)]

    def open(self, text: str, parts: str = "") -> Checkpoint:
        """A checkpoint under the roots (or a hub id from the cache), with the folder ``parts`` names as a single
        file's other parts (under the roots too); errors name them by label, never by the server's absolute paths."""
        checkpoint_name(text)  # before any filesystem work
        checkpoint_name(parts)
        try:
            return find_checkpoint(text, roots=self.roots, allow_download=self.allow_download, parts=parts or None)
        except WorkbenchError as e:
            if NOT_A_PIPELINE in str(e):  # a folder under the roots that holds no checkpoint of its own
                e = WorkbenchError(f"{NOT_FOUND}{text.strip()} (a folder, not a checkpoint)")
            message = self.redact(str(e))
            raise WorkbenchError(f"{message}; {self.known_labels(text)}" if message.startswith(NOT_FOUND)
                                 else message) from None

    def known_labels(self, text: str) -> str:
        """The checkpoints the app lists, those named most like ``text`` first: a few, then how many more."""
        labels = [c.label for c in self.checkpoints()]
        if not labels:
            return "no checkpoint is under the app's folders"
        near = sorted(labels, key=lambda label: difflib.SequenceMatcher(None, text, label).ratio(),
                      reverse=True)[:KNOWN_SHOWN]  # ties keep the list's natural order
        more = f" and {len(labels) - len(near)} more" if len(labels) > len(near) else ""
        return f"the app's checkpoints: {', '.join(near)}{more}"

    def redact(self, message: str) -> str:
        """A message with the roots' absolute paths replaced by the names the UI shows under them, and the
        Hugging Face cache's by its name (a loader's error about a hub model's files)."""
        from models.checkpoints import hub_cache

        for root in sorted(self.roots, key=lambda r: len(str(r)), reverse=True):
            message = message.replace(f"{root}/", f"{root.name}/" if len(self.roots) > 1 else "")
            message = message.replace(str(root), root.name)
        return message.replace(str(hub_cache()), "the Hugging Face cache")

    def for_client(self, message: str) -> str:
        """A message as a client may see it: the roots by their names (``redact``), the ``--output`` folder by
        that name, and any other absolute path (a library's error about its own files) as "<server path>"."""
        if self.output is not None:
            message = message.replace(str(self.output), "--output")
        return SERVER_PATH.sub("<server path>", self.redact(message))

    def labels_by_hash(self) -> dict[str, str]:
        """Content hash -> label of each readable checkpoint under the roots (hashes are cached; the first label
        of a hash wins)."""
        labels: dict[str, str] = {}
        for ckpt in self.checkpoints():
            try:
                labels.setdefault(content_hash(ckpt), ckpt.label)
            except (OSError, WorkbenchError):
                continue
        return labels

    def label_of_hash(self, digest: str) -> str | None:
        """The label of the checkpoint under the roots whose content hash is ``digest``."""
        return self.labels_by_hash().get(digest)

    def lora_name_of_hash(self, digest: str) -> str | None:
        """The ``<lora:NAME>`` of the LoRA file under the roots whose AUTOMATIC1111 short hash is ``digest``."""
        listing = self.loras.listing()
        found = self.loras.by_hash(digest, listing)
        return None if found is None else self.loras.tag_name(found, listing)

    def info(self, text: str) -> tuple[Checkpoint, CheckpointInfo]:
        ckpt = self.open(text)
        return ckpt, describe(ckpt)

    def check_size(self, ckpt: Checkpoint, width: int, height: int) -> None:
        """The one size rule (``models.generation.check_drawable``) for the checkpoint's family, before its weights
        are read: the app refuses the sizes `dwb sample` refuses (the app's limits are ``validate``'s)."""
        try:
            check_drawable(family_or_ours(describe(ckpt).family), (width, height), "the size", limits=None)
        except WorkbenchError as e:
            raise WorkbenchError(f"{ckpt.label}: {e}") from None

    def weights_of(self, ckpt: Checkpoint, weights: str) -> str:
        """What a record says of the weights a choice ("auto", "ema", "raw") opens: "ema" or "raw" of a Composer
        checkpoint, "stored" for the kinds that hold one set (``models.checkpoints.weights_of``)."""
        check_weights(weights)
        try:
            return weights_of(ckpt, weights)
        except WorkbenchError as e:
            raise WorkbenchError(self.redact(f"{ckpt.label}: {str(e).replace(str(ckpt.path), ckpt.label)}")) from None

    def pipeline(self, ckpt: Checkpoint, weights: str, loras: tuple[ChosenLora, ...] = ()):
        """The pipeline for a checkpoint's chosen weights with ``loras`` applied, from the cache or loaded into it.
        Applying a LoRA changes a pipeline (a merged one its weights), so each set of LoRAs and strengths is a
        pipeline of its own in the cache: the checkpoint's own, from the cache (loaded once), around copies of its
        denoiser and text towers that the LoRAs are applied to (``models.adapters.adaptable_copy``), its VAE and
        other parts shared; a strength changed reads no checkpoint again while the base stays cached."""
        ema = self.weights_of(ckpt, weights) == "ema"
        key = (str(ckpt.path), ema, content_hash(ckpt), self.runtime, ckpt.parts)
        base = self.cache.get(key + ((),), lambda: self._load(ckpt, ema))
        if not loras:
            return base
        return self.cache.get(key + (tuple(c.key() for c in loras),), lambda: self._with_loras(base, ckpt, loras))

    def _with_loras(self, pipe, ckpt: Checkpoint, loras: tuple[ChosenLora, ...]):
        """A copy of ``pipe`` with ``loras`` applied (``models.adapters.apply_adapters``); messages name the files by
        label."""
        from models.adapters import adaptable_copy, apply_adapters

        try:
            pipe = adaptable_copy(pipe)
            apply_adapters(pipe, [(c.path, c.strength) for c in loras])
        except Exception as e:  # noqa: BLE001 - a file from anywhere: its judge's one line, or what a reader raised
            message = first_line(e) if isinstance(e, WorkbenchError) else f"{type(e).__name__}: {first_line(e)}"
            for c in loras:
                message = message.replace(str(c.path), c.file.label).replace(str(c.file.path), c.file.label)
            raise WorkbenchError(self.for_client(f"{ckpt.label} with LoRA: {message}")) from None
        return pipe

    def refiner(self, params: GenerationParams):
        """The second stage validated ``params`` name (``models.generation.Refiner``: SDXL's refiner, opened once
        into the cache), or None for the base alone."""
        if not params.refiner:
            return None
        ckpt = self.open(params.refiner)
        key = (str(ckpt.path), "refiner", content_hash(ckpt), self.runtime)
        pipe = self.cache.get(key, lambda: self._load(ckpt, False, refiner=True))
        return Refiner(pipe, ckpt.label, content_hash(ckpt), params.refiner_switch)

    def vae(self, params: GenerationParams, pipe):
        """The VAE validated ``params`` name under the roots, judged against ``pipe``'s own and opened
        (``models.checkpoints.open_vae``), or None for the checkpoint's own; errors name it by label."""
        from models.checkpoints import open_vae

        if not params.vae:
            return None
        try:
            return open_vae(params.vae, pipe, roots=self.roots)
        except WorkbenchError as e:
            raise WorkbenchError(self.for_client(first_line(e))) from None

    def controlled(self, params: GenerationParams, pipe) -> GenerationParams:
        """``params`` with the ControlNet they name (``app.modes.control_request``) opened under the roots against
        ``pipe``'s family and UNet (``models.checkpoints.open_controlnet``); unchanged without one or once opened;
        errors name it by label."""
        from models.checkpoints import open_controlnet

        control = params.control
        if control is None or control.model is not None:
            return params
        try:
            opened = open_controlnet(control.name, pipe, roots=self.roots, allow_download=self.allow_download)
        except WorkbenchError as e:
            raise WorkbenchError(self.for_client(first_line(e))) from None
        return replace(params, control=replace(control, model=opened.model, name=opened.name, hash=opened.hash))

    def controlnet_of_record(self, name: str, digest: str) -> str | None:
        """The label of the ControlNet under the roots that A1111's ``Model: NAME [HASH]`` of a ControlNet unit names: a
        ``NAME.safetensors`` file or a ``NAME`` folder holding a ControlNet's config and weights, whose content hash
        starts with the hash (only those of that name are hashed)."""
        import os

        from models.checkpoints import controlnet_hash, label_under

        name, digest = Path(str(name)).name, str(digest).strip().lower()
        if not name or not digest:
            return None
        for root in self.roots:
            for folder, dirs, files in os.walk(root):
                for path in (Path(folder) / f"{name}.safetensors", Path(folder) / name):
                    if path.name not in files and path.name not in dirs or path.is_symlink():
                        continue
                    label = label_under(path, self.roots)
                    try:
                        found = controlnet_hash(label, roots=self.roots)
                    except WorkbenchError:
                        continue
                    if found.startswith(digest):
                        return label
        return None

    def vae_of_record(self, name: str, digest: str) -> str | None:
        """The label of the file under the roots that AUTOMATIC1111's ``VAE: NAME, VAE hash: HASH`` names: a
        ``.safetensors`` file of that name whose SHA-256 starts with the hash (only files of that name are hashed)."""
        import os

        from models.checkpoints import a1111_vae_hash, label_under

        name, digest = Path(str(name)).name, str(digest).strip().lower()
        if not name.endswith(".safetensors") or not digest:
            return None
        for root in self.roots:
            for folder, _, files in os.walk(root):
                path = Path(folder) / name
                if name in files and path.is_file() and not path.is_symlink() and a1111_vae_hash(path) == digest:
                    return label_under(path, self.roots)
        return None

    def _load(self, ckpt: Checkpoint, ema: bool, refiner: bool = False):
        from models.checkpoints import load_pipeline

        t0 = time.perf_counter()
        try:
            pipe = load_pipeline(ckpt, ema=ema, device=self.runtime.device, dtype=self.runtime.dtype, refiner=refiner)
        except WorkbenchError as e:
            raise WorkbenchError(self.redact(f"{ckpt.label}: {str(e).replace(str(ckpt.path), ckpt.label)}")) from None
        except Exception as e:  # noqa: BLE001 - anything else a foreign file can make a loader raise
            reason = first_line(e).replace(str(ckpt.path), ckpt.label)
            raise WorkbenchError(self.for_client(f"cannot load {ckpt.label}: {type(e).__name__}: {reason}")) from None
        if self.runtime.device.startswith("cuda") and getattr(pipe, "unet", None) is not None:
            from diffusers.models.attention_processor import AttnProcessor2_0

            # PyTorch SDPA (flash / memory-efficient kernels); the transformers' own processors use it already
            pipe.unet.set_attn_processor(AttnProcessor2_0())
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

    # What each request costs in pixel-steps (``app.generate.pixel_steps``), from its parameters alone (no
    # checkpoint opened): a request over ``--max-pixel-steps`` is a LimitError here. The app asks when a request
    # joins the queue, and again when it runs.

    def generate_cost(self, params: GenerationParams) -> int:
        return pixel_steps(validate(params, self.limits))

    def compare_cost(self, checkpoints: list[str], params: GenerationParams) -> int:
        names, params = self._comparison(checkpoints, params)
        return check_pixel_steps(pixel_steps(params, images=len(names)), self.limits)

    def plot_cost(self, checkpoint: str, weights: str, params: GenerationParams, axes: list[tuple[str, str]]) -> int:
        return self._plan(checkpoint, weights, params, axes).pixel_steps()

    def generate(self, checkpoint: str, weights: str, params: GenerationParams, *, session: str = "",
                 client: str = "", on_step: Callable[[int, int], None] | None = None, parts: str = "") -> Result:
        """``params.batch_size`` images from one checkpoint (a single file's other parts from ``parts``, where
        given); every parameter validated first."""
        params = validate(params, self.limits)
        self.loras.chosen(params.prompt)  # an unknown LoRA is refused before any checkpoint is opened
        ckpt = self.open(checkpoint, parts)
        self.check_size(ckpt, params.width, params.height)

        def step(k: int, done: int, total: int) -> None:
            if on_step is not None:
                on_step(done, total)

        return self._run(session, client, pixel_steps(params), self._generate, [ckpt], weights, params, step)

    def compare(self, checkpoints: list[str], weights: str, params: GenerationParams, *, session: str = "",
                client: str = "", on_step: Callable[[int, int, int, int], None] | None = None) -> Result:
        """One image per checkpoint (2 to 4), same prompt, seed and settings."""
        names, params = self._comparison(checkpoints, params)
        cost = check_pixel_steps(pixel_steps(params, images=len(names)), self.limits)
        self.loras.chosen(params.prompt)
        ckpts = [self.open(c) for c in names]
        if len({c.path for c in ckpts}) < len(ckpts):
            raise WorkbenchError("the same checkpoint is chosen twice: choose different ones")
        for ckpt in ckpts:
            self.check_size(ckpt, params.width, params.height)

        def step(k: int, done: int, total: int) -> None:
            if on_step is not None:
                on_step(k, len(ckpts), done, total)

        return self._run(session, client, cost, self._generate, ckpts, weights, params, step)

    def _comparison(self, checkpoints, params: GenerationParams) -> tuple[list[str], GenerationParams]:
        """The names to compare (two to four) and the checked parameters of one image each."""
        params = validate(replace(params, batch_size=1), self.limits)
        checkpoints = [] if checkpoints is None else checkpoints
        if not isinstance(checkpoints, (list, tuple)):
            raise WorkbenchError(f"checkpoints to compare are a list of names, got {type(checkpoints).__name__}")
        names = [c for c in checkpoints if not isinstance(c, str) or c.strip()]
        if not 2 <= len(names) <= 4:
            raise WorkbenchError(f"choose two to four checkpoints to compare, got {len(names)}")
        return [checkpoint_name(c) for c in names], params

    def xyz_plot(self, checkpoint: str, weights: str, params: GenerationParams, axes: list[tuple[str, str]],
                 batch_size: int, *, session: str = "", client: str = "",
                 on_progress: Callable[[float, int, int], None] | None = None) -> Plot:
        """An X/Y/Z plot (``app.xyz``): every setting and checkpoint checked before the first image."""
        made = self._plan(checkpoint, weights, params, axes)
        batch = whole_number("batch size", batch_size, 1, self.limits.max_batch)
        for prompt in dict.fromkeys(c.params.prompt for c in made.cells):
            self.loras.chosen(prompt)  # every cell's LoRAs found before the first image
        for chosen in {c.weights for c in made.cells}:
            check_weights(chosen)
        ckpts = {name: self.open(name) for name in dict.fromkeys(c.checkpoint for c in made.cells)}
        for name, width, height in dict.fromkeys((c.checkpoint, c.params.width, c.params.height) for c in made.cells):
            self.check_size(ckpts[name], width, height)
        return self._run(session, client, made.pixel_steps(), self._plot, made, ckpts, batch,
                         on_progress or (lambda *a: None))

    def _plan(self, checkpoint: str, weights: str, params: GenerationParams, axes: list[tuple[str, str]]) -> Plan:
        parsed = tuple(parse_axis(f"{name} axis", kind, values, self.limits)
                       for name, (kind, values) in zip("XYZ", axes))
        return plan(checkpoint, weights, params, parsed, self.limits)

    def _run(self, session: str, client: str, cost: int, work: Callable, *args):
        """``work(*args, stop)`` on a compute thread (the caller's context, e.g. Gradio's progress, goes along),
        counted against the client's limits while it runs."""
        with self._running_for(client, cost):
            stop = self._begin(session)
            try:
                return self._compute.submit(contextvars.copy_context().run, work, *args, stop).result()
            finally:
                self._end(session, stop)

    @contextlib.contextmanager
    def _running_for(self, client: str, cost: int):
        """The request counted among the client's running ones (``check_client``) while the context lasts. The
        queue checks what a client has waiting or running when a request joins it; this holds for any caller."""
        with self._running_lock:
            held = self._running.get(client, [])
            check_client(held, cost, self.limits)
            self._running[client] = [*held, cost]
        try:
            yield
        finally:
            with self._running_lock:
                rest = list(self._running[client])
                rest.remove(cost)
                if rest:
                    self._running[client] = rest
                else:
                    del self._running[client]

    def _generate(self, ckpts: list[Checkpoint], weights: str, params: GenerationParams,
                  on_step: Callable[[int, int, int], None], stop: threading.Event) -> Result:
        t0 = time.perf_counter()
        images, records = [], []
        refiner = self.refiner(params)
        text, loras = self.loras.chosen(params.prompt)
        for k, ckpt in enumerate(ckpts):
            pipe = self.pipeline(ckpt, weights, loras)
            vae = self.vae(params, pipe)
            params = self.controlled(params, pipe)
            out = generate(pipe, replace(params, prompt=text), on_step=lambda done, total: on_step(k, done, total),
                           should_stop=stop.is_set, refiner=refiner, vae=vae)
            for i, image in enumerate(out):
                record = record_of(params, i, ckpt.label, content_hash(ckpt), self.weights_of(ckpt, weights),
                                   guidance_kind_of(pipe), refiner, loras, vae)
                images.append(self._keep(image, record))
                records.append(record)
        return Result(images, records, time.perf_counter() - t0)

    def _plot(self, made: Plan, ckpts: dict[str, Checkpoint], batch_size: int,
              on_progress: Callable[[float, int, int], None], stop: threading.Event) -> Plot:
        t0, n, done = time.perf_counter(), len(made.cells), 0
        by_cell: dict[tuple[int, int, int], tuple[Image.Image, ImageRecord]] = {}
        loras_of = {prompt: self.loras.chosen(prompt) for prompt in dict.fromkeys(c.params.prompt for c in made.cells)}
        for call in made.batches(batch_size):
            ckpt, first = ckpts[call[0].checkpoint], call[0]
            chosen = [loras_of[c.params.prompt] for c in call]  # one set of LoRAs a call (``Cell.call_key``)
            pipe = self.pipeline(ckpt, first.weights, chosen[0][1])
            vae = self.vae(first.params, pipe)

            def step(k: int, total: int, already: int = done, size: int = len(call)) -> None:
                on_progress((already + size * k / total) / n, already, n)

            pixels = generate_images(pipe, [text for text, _ in chosen], [c.params.seed for c in call],
                                     settings_of(first.params, vae=vae), on_step=step, should_stop=stop.is_set)
            for cell, image, (_, loras) in zip(call, pixels, chosen):
                record = record_of(cell.params, 0, ckpt.label, content_hash(ckpt),
                                   self.weights_of(ckpt, cell.weights), guidance_kind_of(pipe), loras=loras,
                                   vae=vae)
                by_cell[cell.position] = (self._keep(Image.fromarray(image), record), record)
            done += len(call)
        on_progress(1.0, n, n)
        return Plot.of(made, by_cell, time.perf_counter() - t0)

    def _keep(self, image: Image.Image, record: ImageRecord) -> Image.Image:
        """The image with its record as PNG text; with ``--output DIR`` also saved as DIR/YYYY-MM-DD/HHMMSS-N-SEED.png."""
        image = with_metadata(image, record)
        if self.output is None:
            return image
        folder = self.output / time.strftime("%Y-%m-%d")
        folder.mkdir(parents=True, exist_ok=True)
        with self._stops_lock:
            self._saved += 1
            n = self._saved
        save_png(image, folder / f"{time.strftime('%H%M%S')}-{n}-{record.seed}.png", record)
        return image


def check_weights(weights) -> None:
    if weights not in WEIGHTS:
        raise WorkbenchError(f"weights must be one of {', '.join(WEIGHTS)}, got {shown(weights)}")


@dataclass
class Plot:
    """An X/Y/Z plot: the cells in plot order (z, y, x) with their captions, and one labelled grid per Z value."""

    cells: Result
    captions: list[str]
    grids: list[Image.Image]

    @classmethod
    def of(cls, made: Plan, by_cell: dict, seconds: float) -> "Plot":
        x, y, z = made.axes
        order = [c.position for c in made.cells]
        images = [by_cell[p][0] for p in order]
        captions = [" | ".join(label for label in (x.labels[i], y.labels[j], z.labels[k]) if label)
                    for i, j, k in order]
        grids = [labelled_grid([[by_cell[(i, j, k)][0] for i in range(len(x))] for j in range(len(y))],
                               list(x.labels), list(y.labels), z.labels[k]) for k in range(len(z))]
        return cls(Result(images, [by_cell[p][1] for p in order], seconds), captions, grids)
