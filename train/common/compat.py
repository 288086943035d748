"""Where the workbench relies on a library's private internals: every such place, in one module.

Each entry names the library version it was written for (``WRITTEN_FOR``); `tests/train/test_compat.py`
fails when an installed version differs, so an upgrade re-reads this file before anything else, and the
behaviour each entry exists for is tested where it matters (resumption, EMA under FSDP).

**Composer's RNG state on resumption** (``RestoreRNG``). Composer restores a checkpoint's RNG state at
the start of ``fit`` when the checkpoint was taken at an epoch boundary (``batch_in_epoch`` 0), or while
it spins a dataloader forward to the resumed batch. A Streaming dataset resumes inside an epoch by
itself (no spinning), and then Composer never applies the saved state: the resumed run would draw other
noise, timesteps and caption dropouts. Two cases, told apart by where the checkpoint was taken:

- *inside an epoch*: the uninterrupted run goes on with the iterator it already has; the resumed run
  first creates one, and creating a ``DataLoader`` iterator draws its base seed from torch's global RNG.
  The state is applied after the first batch is fetched (``AFTER_DATALOADER``), past that draw.
- *at an epoch's last batch* (``batch_in_epoch`` equal to the epoch's length; Composer saves at
  ``BATCH_CHECKPOINT``, before the epoch rolls over): Streaming yields nothing for the rest of that
  epoch, and the uninterrupted run's next draw is the *next* epoch's iterator seed. Applying the state
  after the first batch would skip that draw (measured: 1,144 of 1,622 model, EMA and optimizer tensors
  differed 6 batches later); it is applied at ``EPOCH_START`` of the next epoch, before the iterator.
  Composer's warning that the (empty) rest of the epoch trained no batches is silenced for that run.

**Streaming's position at an epoch boundary** (``align_dataset_epoch``). A checkpoint taken when an
epoch ends (``save_interval`` in epochs: Composer saves at ``EPOCH_CHECKPOINT``, after the epoch rolled
over) asks the dataset for its state with 0 samples seen; Streaming still counts the epoch it just
finished as its current one and records (that epoch, sample 0), so a resumed run replayed the finished
epoch's sample order instead of starting the next one (1,144 of 1,622 tensors differed). After loading
such a checkpoint, the dataset's resume state is moved to Composer's epoch, sample 0.

**Gradio's request queue** (``calm_gradio_queue``). Gradio's queue looks for an event to start every
millisecond and for progress to send every 10 ms, on the event loop of the process that runs the pipeline.
Each wake-up takes the GIL (and, on a small CPU, a core) from the denoising thread. Measured on 2 cores: with a
1 kHz asyncio loop in the process the same pipeline call took 7-25% longer, and a request to the app made
~1,400-2,000 context switches instead of ~180. The queue's intervals are set to 5 ms (new events) and 100 ms
(progress, like tqdm's ``mininterval``), and the pandas summary it rebuilds after every event for its
monitoring dashboard (2-9 ms holding the GIL, growing with the history), which `dwb app` does not serve, is
skipped.

**Gradio's queue, as a client's share of it** (``serialize_queue_joins``, ``queue_jobs``). `dwb app` counts
what each client has waiting or running when it asks to join the queue (an event's ``validator``, which
``Queue.push`` runs before it appends the event). ``queue_jobs`` lists the queue's waiting events and the
running ones (``active_jobs``) with their HTTP request and raw inputs. ``Queue.push`` awaits between running
the validator and appending the event, so two joins at once could each pass a count that missed the other:
``serialize_queue_joins`` makes joins one at a time (an asyncio lock around ``push``; a validator takes
microseconds to milliseconds).

**Gradio's upload route, stopped mid-body** (``upload_abort``). Gradio's multipart parser writes each uploaded
file to a temporary file as the body arrives, and deletes those files only when the parsing raises Starlette's
``MultiPartException`` (the route then answers 400, or 413 for its own size cap). A client that left mid-upload
raised ``ClientDisconnect`` instead, and its partial files stayed in the temporary folder for good. `dwb app`'s
upload limit (``app.uploads``) raises ``upload_abort(...)`` from the body's ``receive`` when an upload passes
its limit or its client leaves, so Gradio deletes them.

**Streaming's shared memory in one process** (``release_streaming_shared_memory``, for test sessions).
Streaming keeps every dataset's shared-memory blocks (about a dozen file descriptors each) open until the
process exits; a training process makes a handful, a test session hundreds, and would run out of file
descriptors. The context records the blocks made inside it and frees them at its end.

**Gradio's HTTP server** (``serve_gradio_with``). Gradio builds its uvicorn ``Config`` itself
(``gradio.http_server.start_server``) and takes no HTTP protocol, so the app could not give its server the
deadline for a request to arrive and the cap on connections (``train.common.serving``): 1,500 half-sent requests
stayed open for good. Gradio's ``Server`` class is replaced by a subclass that sets the config's ``http``
before uvicorn loads it.

**Composer's EMA under FSDP** (``fsdp_full_params``). Composer's EMA gathers FSDP weights through
``model.module``, which the workbench's model does not have (its FSDP units are its children);
``composer.algorithms.ema.ema.get_model_context_manager`` is replaced by one that gathers them with
FSDP's ``summon_full_params`` on the whole model. Without FSDP it returns a no-op context, as Composer's does.

**Diffusers' Flux.1 single-file converter at any width** (``flux_single_file_widths``). Diffusers 0.39's
``convert_flux_transformer_checkpoint_to_diffusers`` splits each single block's fused ``linear1`` (q, k, v and the
MLP's input, stacked) at the published widths it writes down (``inner_dim = 3072``, MLP 4x), whatever the file
holds: a Flux.1 transformer of another width failed with ``split_with_sizes`` (a tiny one of width 32: 224 rows
where it expects 21,504). The converter's entry in diffusers' table of single-file loaders is replaced by one that
reads the widths from the file itself (``img_in``'s rows are the width; the MLP takes the rest of ``linear1``),
lets the converter do every other name, and splits ``linear1`` there. At the published width the converter runs
as it is.

**Composer's "latest" pointer to a remote checkpoint** (``prompt_remote_latest``). After a save to an object store,
Composer uploads the ``latest`` symlink only once the checkpoint's files are found there, looking every 30 s (a
private attribute its own tests shorten); the upload itself runs in a freshly spawned process that first imports
Composer. So nearly every remote save's pointer waited a full 30 s, and a run's end waited for it: two 2-batch
runs saving to a local S3 server and resuming from it took 92 s, and 27 s looking every 2 s, as the workbench does
(a HEAD request each, against an upload of minutes at full size).
"""
from __future__ import annotations

import contextlib
import functools
import warnings

import torch
from composer.core import Callback, Event, State
from composer.loggers import Logger
from composer.utils import misc, reproducibility

# The versions each entry below was written and tested against.
WRITTEN_FOR = {"mosaicml": "0.32.1", "mosaicml-streaming": "0.13.0", "gradio": "6.17.3", "diffusers": "0.39.0"}
GRADIO_EVENT_POLL_S = 0.005
GRADIO_PROGRESS_INTERVAL_S = 0.1
FLUX_PUBLISHED_WIDTH = 3072  # the width diffusers' Flux.1 converter writes down (see above)


class RestoreRNG(Callback):
    """Apply a checkpoint's RNG state at the point Composer would skip it (see the module docstring)."""

    def __init__(self):
        self.pending = None
        self.at = Event.AFTER_DATALOADER

    def take_over(self, trainer) -> None:
        """Call after the Trainer is built: claim the RNG state Composer would drop (reads ``trainer._rng_state``)."""
        rng, state = getattr(trainer, "_rng_state", None), trainer.state
        batch_in_epoch = int(state.timestamp.batch_in_epoch)
        if rng is None or batch_in_epoch == 0 or "train" not in state.dataset_resumption:
            return  # nothing to restore, or Composer restores it itself at the start of fit
        self.pending = rng
        trainer._rng_state = None
        epoch_length = state.dataloader_len
        if epoch_length is not None and batch_in_epoch >= int(epoch_length):
            self.at = Event.EPOCH_START
            warnings.filterwarnings("ignore", message="No batches were trained for global rank")

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        if event == self.at and self.pending is not None:
            reproducibility.load_rng_state(self.pending)
            self.pending = None


def align_dataset_epoch(trainer) -> None:
    """After a checkpoint taken at an epoch boundary, start the dataset at Composer's epoch (see above)."""
    state = trainer.state
    epoch = int(state.timestamp.epoch)
    if int(state.timestamp.batch_in_epoch) != 0 or epoch == 0 or "train" not in state.dataset_resumption:
        return
    dataset = getattr(state.train_dataloader, "dataset", None)
    if not hasattr(dataset, "state_dict"):
        return
    saved = dataset.state_dict(0, True)  # the resume state loaded from the checkpoint, as Streaming reads it
    if saved["epoch"] < epoch:
        dataset.load_state_dict({**saved, "epoch": epoch, "sample_in_epoch": 0})


REMOTE_LATEST_CHECK_S = 2.0


def prompt_remote_latest(trainer) -> None:
    """Composer's checkpoint savers look for a remote checkpoint's files every 2 s, not 30 (see above)."""
    from composer.callbacks import CheckpointSaver

    for callback in trainer.state.callbacks:
        if isinstance(callback, CheckpointSaver) and callback.remote_uploader is not None:
            callback._symlink_upload_wait_before_next_try_in_seconds = REMOTE_LATEST_CHECK_S


def fsdp_full_params(model: torch.nn.Module):
    """A context in which every FSDP unit inside ``model`` holds its full (unsharded) weights."""
    if misc.is_model_fsdp(model):
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel.summon_full_params(model)
    return contextlib.nullcontext()


def fsdp_on_cpu() -> None:
    """Composer's FSDP preparation on CPU ranks (see above; idempotent). Within it ``torch.cuda.current_device``
    answers the CPU device, which PyTorch's FSDP takes as its ``device_id``."""
    import composer.checkpoint.load as composer_load
    import composer.distributed as composer_distributed

    original = composer_distributed.prepare_fsdp_module
    if getattr(original, "on_cpu", False):
        return

    @functools.wraps(original)
    def prepare(*args, **kwargs):
        if torch.cuda.is_available():
            return original(*args, **kwargs)
        asked = torch.cuda.current_device
        torch.cuda.current_device = lambda: torch.device("cpu")
        try:
            return original(*args, **kwargs)
        finally:
            torch.cuda.current_device = asked

    prepare.on_cpu = True
    composer_distributed.prepare_fsdp_module = prepare  # Composer's State imports it from here at call time
    composer_load.prepare_fsdp_module = prepare
    _keep_cpu_weights_when_offloading()
    _copy_gathered_optimizer_states()


def signal_files_per_node() -> None:
    """Composer 0.32.1 names the file by which a node's first process tells the others it has loaded a checkpoint
    after global rank 0's node (``._signal_file_node0_<random>``, broadcast to every node), so nodes sharing a
    save folder, as on a shared file system, wrote and deleted one file: node 0's first process found it gone
    (FileNotFoundError) when 2 nodes x 2 processes resumed. The random part still comes from rank 0; the node
    part is each node's own (idempotent)."""
    from composer.utils import dist as composer_dist

    original = composer_dist.get_node_signal_file_name
    if getattr(original, "per_node", False):
        return

    @functools.wraps(original)
    def name(rng=None) -> str:
        shared = original(rng)
        return f"._signal_file_node{composer_dist.get_node_rank()}_{shared.rsplit('_', 1)[1]}"

    name.per_node = True
    composer_dist.get_node_signal_file_name = name


def _copy_gathered_optimizer_states() -> None:
    """PyTorch 2.7.0's FSDP gathers each optimizer state (``exp_avg``, then ``exp_avg_sq``) into one buffer and
    hands out views of it, relying on the offload to the CPU to copy them before the next state overwrites the
    buffer. On a CPU rank nothing is copied: every saved ``exp_avg`` held the ``exp_avg_sq`` values, and a run
    resumed from a FULL_SHARD checkpoint drifted (0.006 in the weights two batches later). The views are
    copied on CPU ranks."""
    from torch.distributed.fsdp import _optim_utils

    original = _optim_utils._unflatten_orig_param_states
    if getattr(original, "copies", False):
        return

    @functools.wraps(original)
    def unflatten(fsdp_param_info, output_states, state_name, shard_state, to_save, cpu_offload):
        original(fsdp_param_info, output_states, state_name, shard_state, to_save, cpu_offload)
        if to_save and cpu_offload and not shard_state and fsdp_param_info.state.compute_device.type == "cpu":
            for states in output_states.values():
                if isinstance(states.get(state_name), torch.Tensor):
                    states[state_name] = states[state_name].clone()

    unflatten.copies = True
    _optim_utils._unflatten_orig_param_states = unflatten


def _keep_cpu_weights_when_offloading() -> None:
    """PyTorch 2.7.0's FSDP "offloads" a gathered flat parameter to the CPU by copying it there and freeing the
    original; on a CPU rank the copy is the original itself, and the freed storage then segfaulted the first
    full state dict (Composer asks for one, offloaded, at every checkpoint). Already on the CPU, nothing moves."""
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    original = FlatParamHandle.to_cpu
    if getattr(original, "keeps_cpu_weights", False):
        return

    @contextlib.contextmanager
    def to_cpu(self):
        if self.flat_param.device.type == "cpu":
            yield
            return
        with original(self):
            yield

    to_cpu.keeps_cpu_weights = True
    FlatParamHandle.to_cpu = to_cpu


def fsdp_weight_share(module: torch.nn.Module) -> tuple[int, int]:
    """(weights this rank holds, weights in all) of the FSDP units inside ``module``, from each unit's flat
    parameter (PyTorch 2.7.0's ``_handle``; padding counted out): how a run shows what its strategy shards."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    held = total = 0
    for unit in FullyShardedDataParallel.fsdp_modules(module):
        handle = getattr(unit, "_handle", None)
        if handle is None:
            continue
        flat = handle.flat_param
        held += flat.numel() - flat._shard_numel_padded
        total += flat._unpadded_unsharded_size.numel()
    return held, total


def patch_composer_ema() -> None:
    """Composer's EMA code gathers FSDP weights with ``fsdp_full_params`` (idempotent)."""
    import composer.algorithms.ema.ema as composer_ema

    composer_ema.get_model_context_manager = fsdp_full_params


def calm_gradio_queue(demo) -> None:
    """After ``demo.queue(...)`` and before ``demo.launch(..., enable_monitoring=False)`` (see above)."""
    import logging

    queue = demo._queue
    for name, value in (("sleep_when_free", GRADIO_EVENT_POLL_S),
                        ("progress_update_sleep_when_free", GRADIO_PROGRESS_INTERVAL_S)):
        if not hasattr(queue, name):
            raise RuntimeError(f"gradio's queue has no {name}: re-read train/common/compat.py against this gradio")
        setattr(queue, name, value)
    if hasattr(queue, "compute_analytics_summary") and hasattr(queue, "cached_event_analytics_summary"):
        queue.compute_analytics_summary = lambda event_analytics: queue.cached_event_analytics_summary
    else:
        logging.getLogger("app").warning("gradio's queue has no analytics summary to skip")


def serialize_queue_joins(demo) -> None:
    """After ``demo.queue(...)``: the queue's joins, validator and append, one at a time (see above)."""
    import asyncio

    queue = demo._queue
    push, lock = queue.push, asyncio.Lock()

    async def one_at_a_time(*args, **kwargs):
        async with lock:
            return await push(*args, **kwargs)

    queue.push = one_at_a_time


def serve_gradio_with(http) -> None:
    """Before ``demo.launch``: Gradio's uvicorn server speaks ``http`` (a protocol class or factory; see above)."""
    from gradio import http_server

    base = getattr(http_server.Server, "gradio_server", http_server.Server)  # once, however often it is called
    if not hasattr(base, "install_signal_handlers"):
        raise RuntimeError("gradio's http_server.Server is not the uvicorn server it was: re-read train/common/compat.py")

    class Server(base):
        gradio_server = base

        def __init__(self, config, *args, **kwargs):
            config.http = http
            super().__init__(config, *args, **kwargs)

    http_server.Server = Server


def upload_abort(message: str) -> Exception:
    """What to raise while Gradio's upload route reads a body, to end it with its partial files deleted (see above)."""
    from starlette.formparsers import MultiPartException

    return MultiPartException(message)


def queue_jobs(demo) -> list[tuple]:
    """(HTTP request, event function, raw inputs) of every event waiting in Gradio's queue or running from it."""
    queue = demo._queue
    waiting = [event for q in queue.event_queue_per_concurrency_id.values() for event in q.queue]
    running = [event for job in queue.active_jobs if job for event in job]
    return [(e.request, e.fn.fn, list(getattr(e.data, "data", None) or [])) for e in waiting + running]


@contextlib.contextmanager
def release_streaming_shared_memory():
    """Free the shared memory of the Streaming datasets made inside the context, when it ends (see above)."""
    import atexit

    from streaming.base.shared import memory

    created, original = [], memory.SharedMemory.__init__

    def tracking_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        created.append(self)

    memory.SharedMemory.__init__ = tracking_init
    try:
        yield
    finally:
        memory.SharedMemory.__init__ = original
        for shm in created:
            atexit.unregister(shm.cleanup)
            for block in (*shm.created_shms, *shm.opened_shms):
                try:
                    block.close()
                except (BufferError, OSError):
                    continue  # still referenced; freed at exit as before
                if block in shm.created_shms:
                    try:
                        block.unlink()
                    except (FileNotFoundError, OSError):
                        pass


def flux_single_file_widths() -> None:
    """Diffusers' Flux.1 transformer converter splits the fused single-block weights at the file's own widths
    (see above; idempotent)."""
    from diffusers.loaders import single_file_model

    entry = single_file_model.SINGLE_FILE_LOADABLE_CLASSES.get("FluxTransformer2DModel", {})
    original = entry.get("checkpoint_mapping_fn")
    if original is None:
        raise RuntimeError("diffusers has no Flux.1 single-file converter where it was: re-read train/common/compat.py")
    if getattr(original, "reads_widths", False):
        return

    @functools.wraps(original)
    def convert(checkpoint, **kwargs):
        prefix = "model.diffusion_model." if "model.diffusion_model.img_in.weight" in checkpoint else ""
        width = checkpoint[f"{prefix}img_in.weight"].shape[0]
        if width == FLUX_PUBLISHED_WIDTH:
            return original(checkpoint, **kwargs)
        fused = {key: checkpoint[key] for key in checkpoint
                 if key.startswith(f"{prefix}single_blocks.") and ".linear1." in key}
        published_rows = 3 * FLUX_PUBLISHED_WIDTH + 4 * FLUX_PUBLISHED_WIDTH
        for key, value in fused.items():  # the shape the converter splits, without memory: its parts are replaced
            checkpoint[key] = torch.empty((published_rows, *value.shape[1:]), device="meta")
        converted = original(checkpoint, **kwargs)
        for key, value in fused.items():
            block, kind = key[len(prefix):].split(".")[1], key.rsplit(".", 1)[1]
            mlp = value.shape[0] - 3 * width
            if mlp <= 0:
                raise ValueError(f"{key} has {value.shape[0]} rows, not q, k and v of width {width} and an MLP")
            names = [f"attn.to_{q}" for q in "qkv"] + ["proj_mlp"]
            for name, part in zip(names, torch.split(value, [width, width, width, mlp])):
                converted[f"single_transformer_blocks.{block}.{name}.{kind}"] = part.clone()  # own memory, as the converter's
        return converted

    convert.reads_widths = True
    entry["checkpoint_mapping_fn"] = convert
