"""`dwb train CONFIG [key=value ...]`: one training phase through Composer's Trainer.

AdamW on the UNet, linear warm-up then constant lr, gradient clipping, EMA, checkpoints every
``save_interval``, autoresume, SpeedMonitor throughput, a progress bar and a file logger.
Phase 2 is the same command with ``load_path`` at phase 1's final checkpoint: weights only,
fresh optimizer and schedule.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from composer.core import Callback

from models.errors import WorkbenchError
from models.common import disk_full_error, is_disk_full
from models.checkpoints import make_spec
from models.families import family_or_ours

from .config import TrainConfig, config_to_dict
from .recipes import DENOISER_WORDS, LatentDiffusion, build_denoiser, build_model, frozen_parts

log = logging.getLogger(__name__)


def resolve_device(cfg: TrainConfig) -> str:
    """Composer's name ("gpu" or "cpu") for config key 'device' (``models.generation.pick_device``'s rule)."""
    from models.generation import pick_device

    try:
        chosen = pick_device(cfg.device)
    except WorkbenchError as e:
        raise WorkbenchError(f"config key 'device': {e}") from None
    return "gpu" if chosen.type == "cuda" else "cpu"


def resolve_precision(cfg: TrainConfig, device: str) -> str:
    if cfg.precision == "auto":
        return "amp_bf16" if device == "gpu" else "fp32"
    if device == "cpu" and cfg.precision != "fp32":
        raise WorkbenchError(f"config key 'precision': {cfg.precision} needs a CUDA GPU (Composer trains in fp32 on a CPU)")
    return cfg.precision


def check_gpu_features(cfg: TrainConfig, device: str) -> None:
    """Features that need a GPU are refused on CPU, never silently ignored."""
    if device == "gpu":
        return
    if cfg.device_train_microbatch_size == "auto":
        raise WorkbenchError("config key 'device_train_microbatch_size' is 'auto', which searches for the largest "
                             "microbatch that fits in GPU memory and needs a CUDA GPU; give an integer on CPU")
    for key, on in (("low_precision_norms", cfg.low_precision_norms),):
        if on:
            raise WorkbenchError(f"config key '{key}' needs a CUDA GPU; set {key}=false to train on CPU")
    if cfg.model.attention == "xformers":
        raise WorkbenchError("config key 'model.attention' is 'xformers', which needs a CUDA GPU; use sdpa or auto")


def set_attention(denoiser, backend: str, device: str) -> str:
    """'auto' picks xformers for a UNet on a GPU when it is installed, else PyTorch SDPA (diffusers' default). A
    transformer keeps its own SDPA processors (SD3's joint attention has no processor for the UNet's backends)."""
    from diffusers import UNet2DConditionModel

    if not isinstance(denoiser, UNet2DConditionModel):
        if backend == "xformers":
            raise WorkbenchError(f"config key 'model.attention': xformers is for UNets; a "
                                 f"{type(denoiser).__name__} attends through PyTorch SDPA (use sdpa or auto)")
        return "sdpa"
    if backend in ("auto", "xformers") and device == "gpu":
        try:
            import xformers  # noqa: F401

            denoiser.enable_xformers_memory_efficient_attention()
            return "xformers"
        except ImportError:
            if backend == "xformers":
                raise WorkbenchError("config key 'model.attention' is 'xformers' but xformers is not installed "
                                     "(pip install 'diffusion-workbench[gpu]')") from None
    from diffusers.models.attention_processor import AttnProcessor2_0

    denoiser.set_attn_processor(AttnProcessor2_0())
    return "sdpa"


def check_memory(cfg: TrainConfig, device: str):
    """One line, before any weight is made, where this machine (or GPU) cannot hold what the run's ranks on it hold:
    the denoiser counted on the meta device, the frozen parts as ``frozen_size`` counts them, each rank's share as
    its layout shards it (``models.checkpoints.rank_plan``). Returns this rank's plan (a ``RankPlan``)."""
    with torch.device("meta"):
        trained = sum(p.numel() for p in build_denoiser(cfg).parameters())
    return checked_plan(cfg, device, trained, *frozen_size(cfg))


def check_built_memory(cfg: TrainConfig, device: str, model: LatentDiffusion):
    """``check_memory`` for a model built from ``model.init_from`` (the door planned its loading): what it trains and
    what it holds frozen (an adapter's base denoiser too), counted from the model itself."""
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    frozen = [p for p in model.parameters() if not p.requires_grad]
    return checked_plan(cfg, device, trained, sum(p.numel() for p in frozen),
                        sum(p.numel() * p.element_size() for p in frozen))


def checked_plan(cfg: TrainConfig, device: str, trained: int, frozen: int, frozen_bytes: int):
    """This rank's plan (a ``RankPlan``), after one line where the ranks on this machine cannot hold theirs."""
    from composer.utils import dist

    from models.checkpoints import check_training_memory

    plan_of = rank_planner(cfg, device, trained, frozen_bytes)
    rank, local = dist.get_global_rank(), dist.get_local_rank()
    ranks = [rank] if device == "gpu" else [rank - local + r for r in range(dist.get_local_world_size())]
    check_training_memory([plan_of(r) for r in ranks], trained, frozen,
                          device=torch.device("cuda" if device == "gpu" else "cpu"),
                          what=f"'{cfg.model.init_from or cfg.model.architecture}' ({cfg.run_name})")
    return plan_of(rank)


def training_layout(cfg: TrainConfig) -> tuple[str, int]:
    """(layout, the ranks its FSDP shards over): the FSDP strategy over every rank, HYBRID_SHARD over a node's
    (``parallelism_config``'s device mesh); "DDP" on several ranks without FSDP, "one process" alone."""
    from composer.utils import dist

    if cfg.fsdp:
        hybrid = cfg.fsdp_sharding_strategy == "HYBRID_SHARD"
        return cfg.fsdp_sharding_strategy, dist.get_local_world_size() if hybrid else dist.get_world_size()
    return ("DDP" if dist.get_world_size() > 1 else "one process"), 1


def rank_planner(cfg: TrainConfig, device: str, trained: int, frozen_bytes: int):
    """rank -> what it holds (``models.checkpoints.rank_plan``). Under FSDP rank 0 draws previews with a full copy of
    the denoiser in the precision training computes in (``train.callbacks.previews.drawing_dtype``): half precision
    under a GPU's AMP (``auto`` is amp_bf16 there), float32 on a CPU."""
    from models.checkpoints import rank_plan

    from .recipes import frozen_dtype

    layout, shards = training_layout(cfg)
    copy = trained * frozen_dtype(device, cfg.precision).itemsize if cfg.fsdp and cfg.preview_interval else 0
    return lambda rank: rank_plan(trained, frozen_bytes, layout=layout, shards=shards, ema=cfg.ema.enabled,
                                  preview_bytes=copy if rank == 0 else 0)


def frozen_size(cfg: TrainConfig, dtype: torch.dtype | None = None) -> tuple[int, int]:
    """(values, bytes) of the frozen parts every rank holds whole, before any is made, in the dtype the run holds
    them in (``recipes.run_frozen_dtype``: a GPU's autocast precision, float32 on a CPU): the pretrained ones from
    their weight files' headers (``models.checkpoints.pretrained_part_values``), and the parts the run builds
    (``built_frozen_parts``) counted on the meta device (``models.checkpoints.held_bytes``). A hub id not in the
    local cache is counted as the architecture configures its parts (``architecture_part``), before anything is
    downloaded. T5's ``wo`` projections, which stay float32 under float16, are counted at float16 when loaded.
    ``dtype``: counted as held in that dtype instead."""
    from models.checkpoints import held_bytes, module_size, pretrained_part_values

    from .recipes import run_frozen_dtype

    m, dtype = cfg.model, dtype or run_frozen_dtype(cfg)
    built, loaded = built_frozen_parts(cfg)
    values = pretrained_part_values(m.pretrained, loaded) if loaded else 0
    with torch.device("meta"):
        parts = [make() for make in built]
        if values is None:
            parts, values = parts + [architecture_part(m.architecture, part) for part in loaded], 0
        sizes = [(module_size(part)[0], held_bytes(part, dtype)) for part in parts]
    return values + sum(v for v, _ in sizes), values * dtype.itemsize + sum(b for _, b in sizes)


def built_frozen_parts(cfg: TrainConfig) -> tuple[list, tuple[str, ...]]:
    """(makers of the frozen parts the run builds, the names of those it loads from ``model.pretrained``): the VAE
    and first text tower are loaded, or random without it; SDXL's second tower and Flux.1's T5 are built where the
    architecture builds them (with the first tokenizer's vocabulary and ids), else loaded (``text_encoder_2/``)."""
    from models.checkpoints import ARCHITECTURES, builds_second_tower, random_t5_encoder, second_text_encoder

    m, arch = cfg.model, ARCHITECTURES[cfg.model.architecture]
    builds_second = "text_encoder_2" in arch and builds_second_tower(m.architecture, m.pretrained)
    tokenizer = frozen_tokenizer(cfg) if builds_second or arch.get("builds_t5_encoder") else None
    built = [] if m.pretrained is not None else [lambda: frozen_parts(cfg)[0], lambda: frozen_parts(cfg)[1]]
    loaded = () if m.pretrained is None else ("vae", "text_encoder")
    if builds_second:
        built.append(lambda: second_text_encoder(m.architecture, None, tokenizer))
    elif "text_encoder_2" in arch:
        loaded += ("text_encoder_2",)
    if arch.get("builds_t5_encoder"):
        built.append(lambda: random_t5_encoder(m.architecture, len(tokenizer), tokenizer.pad_token_id))
    elif "t5_encoder" in arch and m.pretrained is not None:
        loaded += ("text_encoder_2",)
    return built, loaded


def architecture_part(architecture: str, part: str):
    """A frozen part as the architecture configures it (its published config for the full-size ones), random."""
    from transformers import T5Config, T5EncoderModel

    from models.checkpoints import ARCHITECTURES, random_text_encoder, random_vae

    arch = ARCHITECTURES[architecture]
    if part == "vae":
        return random_vae(architecture)
    if part == "text_encoder_2" and "t5_encoder" in arch:
        return T5EncoderModel(T5Config(**arch["t5_encoder"]))
    return random_text_encoder(architecture, part=part)


def frozen_tokenizer(cfg: TrainConfig):
    """The first tokenizer, whose vocabulary and ids the towers a run builds take (``model.pretrained``'s; none
    without it: the architecture's vocabulary)."""
    from transformers import CLIPTokenizer

    from models.checkpoints import load_part

    return None if cfg.model.pretrained is None else load_part(CLIPTokenizer, cfg.model.pretrained, "tokenizer",
                                                               "tokenizer")


def public_config(config: dict) -> dict:
    """A diffusers config without its bookkeeping keys: ``_use_default_values`` is built from a set, so its
    order changes from one process to the next and must not make two equal UNets look different."""
    return {k: v for k, v in config.items() if not k.startswith("_")}


def training_record(cfg: TrainConfig) -> dict:
    """The run's data and schedule as the spec keeps them (a model card shows them): sources, not credentials."""
    from dataclasses import asdict

    return {
        "data": {"path": cfg.data.path, "remote": cfg.data.remote, "streams": [asdict(s) for s in cfg.data.streams],
                 "resolution": cfg.data.resolution, "precomputed_latents": cfg.data.precomputed},
        "schedule": {"max_duration": cfg.max_duration, "global_train_batch_size": cfg.global_train_batch_size,
                     "optimizer": "AdamW", "lr": cfg.optimizer.lr, "weight_decay": cfg.optimizer.weight_decay,
                     "scheduler": cfg.scheduler.name, "t_warmup": cfg.scheduler.t_warmup,
                     "ema_smoothing": cfg.ema.smoothing if cfg.ema.enabled else None},
        "recipe": {"run_name": cfg.run_name, "seed": cfg.seed, "pretrained": cfg.model.pretrained,
                   "starting_point": cfg.load_path, "caption_dropout": cfg.model.caption_dropout,
                   "min_snr_gamma": cfg.model.min_snr_gamma, "precision": cfg.precision},
    }


def checked_load_path(cfg: TrainConfig, spec: dict) -> str | None:
    """``load_path`` as a local file Composer may unpickle: a remote one is fetched first, then it must read
    as plain data (``weights_only``) and hold this run's architecture, before Composer touches it."""
    if not cfg.load_path:
        return None
    from models.checkpoints import read_checkpoint

    local = cfg.load_path
    if "://" in local:
        from models.checkpoints import fetch

        local = str(fetch(local))
    if (Path(local) / "model_index.json").is_file() or Path(local).suffix in (".safetensors", ".ckpt"):
        raise WorkbenchError(f"config key 'load_path' takes a Composer checkpoint of this workbench (a .pt file or a "
                             f"sharded checkpoint folder); {cfg.load_path} is an exported model: start from it with "
                             f"model.init_from={cfg.load_path}")
    try:
        other = read_checkpoint(local)["spec"]
    except WorkbenchError as e:
        raise WorkbenchError(f"config key 'load_path': {e}") from None
    check_checkpoint_layout(cfg, Path(local), "config key 'load_path'")
    if Path(local).is_dir():  # Composer unpickles a folder's index and values: every one is read as plain data first
        from models.checkpoints import resume_problem

        if problem := resume_problem(local):
            raise WorkbenchError(f"config key 'load_path': {problem}")
    denoiser = family_or_ours(spec.get("family")).denoiser
    if other["architecture"] != spec["architecture"] or \
            public_config(other.get(denoiser) or {}) != public_config(spec[denoiser]):
        raise WorkbenchError(f"config key 'load_path': {cfg.load_path} holds a '{other['architecture']}' model whose "
                             f"{DENOISER_WORDS[denoiser]} differs from this run's '{spec['architecture']}' "
                             f"{DENOISER_WORDS[denoiser]}")
    return local


def estimate_checkpoint_bytes(model: LatentDiffusion, ema: bool) -> int:
    """Bytes of one checkpoint: the model's state, AdamW's two moments per trainable weight, the EMA copy."""
    state = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    trainable = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    return state + 2 * trainable + (trainable if ema else 0)


def check_save_folder(folder: str, need_bytes: int = 0) -> None:
    """An unwritable or full save folder fails now, not at the first checkpoint hours later."""
    if "://" in folder:
        check_remote_folder(folder, "save_folder")
        return
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        # a probe of this process's own: every rank checks the shared folder at once, and with one name a rank's
        # unlink found the file another had removed (ENOENT read as "cannot write")
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as e:
        raise WorkbenchError(f"config key 'save_folder': cannot write to {folder} ({e.strerror})") from None
    free = shutil.disk_usage(path).free
    need = int(need_bytes * 1.05) + 64 * 2**20
    if free < need:
        raise WorkbenchError(f"config key 'save_folder': {free / 2**30:.2f} GiB free at {folder}, but one checkpoint "
                             f"of this model needs about {need / 2**30:.2f} GiB")


def check_remote_folder(url: str, key: str) -> None:
    """Credentials for an s3:// save folder or load path, checked before the first step."""
    from .data import check_remote_access

    check_remote_access(url, key)


def resolve_resume(cfg: TrainConfig, save_folder: str) -> str | None:
    """With autoresume: the newest usable checkpoint of the save folder (chosen on rank 0), else None.

    Usable means whole and readable as plain data (``weights_only``): Composer unpickles with
    ``weights_only=False``, so nothing else reaches it. Locally the others are set aside
    (``select_resume_checkpoint``); in object storage they are passed over and the newest usable one is
    fetched into the local cache.

    Rank 0 reads every byte of the newest checkpoint (a file's CRCs, with its tensors memory-mapped and never
    loaded; a sharded folder's values one at a time), or fetches it: minutes at 45 GB, so the other ranks wait for
    it ``patient``ly (``models.common.broadcast_object``), outside the group's timeout.
    """
    from composer.utils import dist

    from models.common import broadcast_object

    if not cfg.autoresume:
        return None
    found = problem = None
    if dist.get_global_rank() == 0:
        try:
            found = _newest_remote(save_folder) if "://" in save_folder else _newest_local(cfg, save_folder)
        except WorkbenchError as e:
            problem = str(e)  # said by every rank: the others wait in the broadcast
    found, problem = broadcast_object((found, problem), patient=True)
    if problem:
        raise WorkbenchError(problem)
    return found


def _newest_local(cfg: TrainConfig, save_folder: str) -> str | None:
    from models.checkpoints import select_resume_checkpoint

    found = select_resume_checkpoint(save_folder)
    if found:
        check_checkpoint_layout(cfg, found, f"autoresume from {save_folder}")
    return str(found) if found else None


def check_checkpoint_layout(cfg: TrainConfig, path: Path, where: str) -> None:
    """Composer loads a sharded checkpoint's folder only with ``fsdp_state_dict_type: sharded``, and one file only
    with ``full``: the other way round it fails deep inside its loader."""
    from models.readers import is_sharded_folder

    sharded = is_sharded_folder(path)
    if sharded == (cfg.fsdp and cfg.fsdp_state_dict_type == "sharded"):
        return
    if sharded:
        raise WorkbenchError(f"{where}: {path.name} is a sharded checkpoint folder, which only a run with fsdp=true "
                             f"fsdp_state_dict_type=sharded loads (on any number of ranks)")
    raise WorkbenchError(f"{where}: {path.name} is a full checkpoint file, which a run with "
                         f"fsdp_state_dict_type=sharded does not load (Composer's sharded loader reads folders); "
                         f"load it with fsdp_state_dict_type=full")


def _newest_remote(save_folder: str) -> str | None:
    from models.checkpoints import fetch, list_checkpoints, resume_problem

    for remote in reversed(list_checkpoints(save_folder)):
        local = fetch(remote.ref)
        problem = resume_problem(local)
        if problem is None:
            return str(local)
        log.warning("warning: checkpoint %s is unusable (%s); resuming from an earlier one", remote.ref, problem)
    return None


def attach_latents(cfg: TrainConfig, model: LatentDiffusion) -> dict | None:
    """Precomputed data: refuse latents of another VAE, text tower or family's conditioning, and hand the model the
    empty caption's states and pooled output."""
    if not cfg.data.precomputed:
        return None
    from .data import check_compatible, decode_array, latent_meta

    meta = latent_meta(cfg.data)
    towers = {name: part for name, part in model.frozen_components().items() if name != "vae"}
    check_compatible(meta, vae=model.vae, resolution=cfg.data.resolution, where="config key 'data.precomputed'",
                     **({} if model.reads_captions else {"towers": towers, "family": model.family}))
    if not model.reads_captions:
        pooled = meta.get("empty_pooled")
        model.set_empty_text(torch.from_numpy(decode_array(meta["empty_text"])),
                             None if pooled is None else torch.from_numpy(decode_array(pooled)))
    return meta


def make_scheduler(cfg: TrainConfig):
    from composer.optim import (ConstantWithWarmupScheduler, CosineAnnealingWithWarmupScheduler,
                                LinearWithWarmupScheduler)

    sc = cfg.scheduler
    if sc.name == "linear_with_warmup":
        return LinearWithWarmupScheduler(t_warmup=sc.t_warmup, alpha_f=sc.alpha_f)
    if sc.name == "cosine_with_warmup":
        return CosineAnnealingWithWarmupScheduler(t_warmup=sc.t_warmup, alpha_f=sc.alpha_f)
    return ConstantWithWarmupScheduler(t_warmup=sc.t_warmup)


def make_optimizer(cfg: TrainConfig, model: LatentDiffusion) -> torch.optim.AdamW:
    """AdamW on the denoiser, fused: one kernel per step instead of a dozen foreach ops, and the non-finite guard's
    skip reaches it as a device flag (``found_inf``) instead of a read on the host every step (``train.guard``).
    What trains: the denoiser's weights, or an adapter's where the base is frozen (the text towers' adapters after
    the denoiser's, in the model's order)."""
    o = cfg.optimizer
    trained = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(trained, lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                             weight_decay=o.weight_decay, fused=True)


def make_algorithms(cfg: TrainConfig) -> list:
    """The guard against non-finite steps (which clips the gradients: the norm it checks is clipping's), EMA and
    low-precision norms, as configured."""
    from composer.algorithms import LowPrecisionGroupNorm, LowPrecisionLayerNorm

    from .ema import FusedEMA
    from .guard import NonFiniteGuard

    # the guard's counters are read once a log interval (in batches; 100 where it is in other units)
    read_every = batch_count(cfg.log_interval) if cfg.log_interval.endswith("ba") else 100
    algorithms = [NonFiniteGuard(cfg.max_consecutive_nonfinite, clip_norm=cfg.grad_clip_norm, read_every=read_every)]
    if cfg.ema.enabled:
        algorithms.append(FusedEMA(half_life=None, smoothing=cfg.ema.smoothing, ema_start=cfg.ema.ema_start,
                                   update_interval=cfg.ema.update_interval))
    if cfg.low_precision_norms:
        algorithms += [LowPrecisionGroupNorm(), LowPrecisionLayerNorm()]
    return algorithms


def make_loggers(cfg: TrainConfig, run_dir: Path) -> list:
    """Composer loggers by name (config key 'loggers'): file, tensorboard, wandb."""
    loggers = []
    for name in cfg.loggers:
        if name == "file":
            from composer.loggers import FileLogger

            # flushed every batch: a killed run keeps its log up to its last batch (one short write a batch)
            loggers.append(FileLogger(filename=str(log_file_of_this_start(run_dir)), flush_interval=1))
        elif name == "tensorboard":
            from composer.loggers import TensorboardLogger

            try:
                loggers.append(TensorboardLogger(log_dir=str(run_dir / "tensorboard"), flush_interval=50))
            except Exception as e:  # noqa: BLE001 - tensorboard missing or broken
                raise WorkbenchError(f"config key 'loggers': tensorboard is not usable ({e}); pip install tensorboard") from None
        elif name == "wandb":
            from composer.loggers import WandBLogger

            loggers.append(WandBLogger(project=os.environ.get("WANDB_PROJECT", "diffusion-workbench"), name=cfg.run_name))
    return loggers


def log_file_of_this_start(run_dir: Path) -> Path:
    """``logs/start{n}-rank{rank}.txt``, n counting this rank's earlier starts: one file per process start, so a
    resume never overwrites the log before it and every later file marks a restart (``train.callbacks.curves``)."""
    from composer.utils import dist

    rank = dist.get_global_rank()
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"start{len(list(logs.glob(f'start*-rank{rank}.txt')))}-rank{rank}.txt"


def batch_count(interval: str) -> int:
    return int(interval[:-2])


def make_run_callbacks(cfg: TrainConfig, run_dir: Path, load_path: str | None) -> list:
    """Validation loss, previews and cost (``train.callbacks``), as configured."""
    from models.checkpoints import checkpoint_cost

    from .callbacks import Previews, RunCost, ValidationLoss

    carried = checkpoint_cost(load_path) if load_path and cfg.load_weights_only else None
    callbacks = [RunCost(cfg.cost.usd_per_gpu_hour, carried=carried)]
    v = cfg.validation
    if cfg.eval_interval and v.path:
        callbacks.append(ValidationLoss(v.path, cfg.data.resolution, batch_count(cfg.eval_interval), v.timesteps,
                                        v.max_samples, v.seed, v.batch_size,
                                        one_timestep=v.each_sample_at == "one_timestep"))
    if cfg.preview_interval:
        p = cfg.previews
        callbacks.append(Previews(run_dir / "previews", batch_count(cfg.preview_interval), p.prompts, p.seeds,
                                  steps=p.steps, guidance=p.guidance, size=cfg.data.resolution, sampler=p.sampler,
                                  ema=p.ema and cfg.ema.enabled))
    return callbacks


def memory_report(run_dir: Path, plan) -> Callback:
    """Each rank's tensors counted beside its plan, in ``memory/rank{r}.json`` (``train.callbacks.memory``): last
    among the callbacks, after the previews' copy is made."""
    from .callbacks import MemoryReport

    return MemoryReport(run_dir / "memory", plan.as_dict())


def start_processes(cfg: TrainConfig) -> tuple[str, str]:
    """(device, precision) for Composer; joins the process group `composer -n N` set up (gloo on CPU, NCCL on GPU)."""
    from composer.devices import DeviceCPU, DeviceGPU
    from composer.utils import dist

    from .patches.composer import signal_files_per_node
    from .patches.fsdp_cpu_ranks import fsdp_on_cpu

    device = resolve_device(cfg)
    check_gpu_features(cfg, device)
    precision = resolve_precision(cfg, device)
    if cfg.fsdp and device == "cpu":
        fsdp_on_cpu()
    signal_files_per_node()
    if dist.get_world_size() > 1 and not dist.is_initialized():
        dist.initialize_dist(DeviceGPU() if device == "gpu" else DeviceCPU(), timeout=cfg.dist_timeout)
    return device, precision


def build_trainer(cfg: TrainConfig):
    """Composer's Trainer for one phase: every check that can fail runs before it is built."""
    from composer import Trainer
    from composer.callbacks import LRMonitor, SpeedMonitor
    from composer.utils import reproducibility

    from .callbacks import ModelSpec
    from .patches.composer import RestoreRNG, align_dataset_epoch, prompt_remote_latest

    device, precision = start_processes(cfg)
    save_folder = cfg.resolved_save_folder()
    for key, url, needed in (("load_path", cfg.load_path, True), ("save_folder", save_folder, cfg.autoresume)):
        if needed and url and "://" in url:
            check_remote_folder(url, key)
    reproducibility.seed_all(cfg.seed)  # the UNet's initial weights follow the run's seed
    plan = check_memory(cfg, device) if cfg.model.init_from is None else None
    model = build_model(cfg)
    plan = plan or check_built_memory(cfg, device, model)
    check_save_folder(save_folder, estimate_checkpoint_bytes(model, cfg.ema.enabled))
    attention = set_attention(model.denoiser, cfg.model.attention, device)
    spec = run_spec(cfg, model)
    load_path = checked_load_path(cfg, spec)
    attach_latents(cfg, model)
    resume_from = resolve_resume(cfg, save_folder)
    check_resumed_base(resume_from, spec)
    remote_resume = resume_from is not None and "://" in save_folder
    run_dir = run_dir_of(cfg)
    restore_rng = RestoreRNG()
    trainer = Trainer(
        model=model,
        train_dataloader=training_dataloader(cfg, model),
        max_duration=cfg.max_duration,
        optimizers=make_optimizer(cfg, model),
        schedulers=make_scheduler(cfg), step_schedulers_every_batch=True,
        algorithms=make_algorithms(cfg),
        callbacks=[SpeedMonitor(window_size=20), LRMonitor(), ModelSpec(spec), restore_rng, EpochInBatch(),
                   *make_run_callbacks(cfg, run_dir, load_path), memory_report(run_dir, plan)],
        loggers=make_loggers(cfg, run_dir), run_name=cfg.run_name, progress_bar=cfg.progress_bar,
        log_to_console=False, console_log_interval=cfg.log_interval,
        save_folder=save_folder, save_filename="ep{epoch}-ba{batch}-rank{rank}.pt",
        save_latest_filename="latest-rank{rank}.pt", save_interval=cfg.save_interval,
        save_num_checkpoints_to_keep=cfg.save_num_checkpoints_to_keep, save_overwrite=not cfg.autoresume,
        # Composer's own autoresume reads the local save folder's latest link, which points at the file chosen
        # above; from object storage it would pick its own, so the checked local copy is loaded instead.
        autoresume=cfg.autoresume and not remote_resume,
        load_path=resume_from if remote_resume else (None if resume_from else load_path),
        load_weights_only=False if remote_resume else cfg.load_weights_only,
        device=device, precision=precision, device_train_microbatch_size=cfg.device_train_microbatch_size,
        parallelism_config=parallelism_config(cfg), dist_timeout=cfg.dist_timeout,
        seed=cfg.seed, python_log_level=None,
    )
    restore_rng.take_over(trainer)
    align_dataset_epoch(trainer)
    prompt_remote_latest(trainer)
    say_fsdp_share(cfg, model)
    log.info("attention backend: %s, device: %s, precision: %s", attention, device, precision)
    write_run_config(cfg, run_dir)
    return trainer


def run_spec(cfg: TrainConfig, model: LatentDiffusion) -> dict:
    """The spec every checkpoint carries: a run from ``model.init_from`` names its source (kind, family, content hash)
    and its family for the architecture; an adapter run adds its adapter (kind, rank, alpha, targets, peft's
    config), its base being the source by that hash."""
    source = getattr(model, "source", None)
    architecture = cfg.model.architecture if source is None else source["family"]
    spec = make_spec(model, architecture, cfg.data.resolution, training_record(cfg), cfg.previews.recommended(),
                     family=None if source is None else source["family"])
    if source is not None:
        spec["source"] = dict(source)
    if getattr(model, "adapter", None) is not None:
        spec["adapter"] = {**model.adapter, "base": dict(source)}
    return spec


def check_resumed_base(resume_from: str | None, spec: dict) -> None:
    """An adapter run resumes only on the base it was trained on: its checkpoint holds the adapter alone, and the
    base it names by content hash must be the one ``model.init_from`` opens now."""
    if resume_from is None or "adapter" not in spec:
        return
    from models.checkpoints import read_summary

    saved = (read_summary(resume_from)["spec"].get("adapter") or {}).get("base") or {}
    if saved.get("content_hash") != spec["adapter"]["base"]["content_hash"]:
        raise WorkbenchError(f"autoresume: {resume_from} holds an adapter of the base with content hash "
                             f"{saved.get('content_hash')}, and model.init_from {spec['source']['init_from']} is "
                             f"{spec['source']['content_hash']}: resume with the base it was trained on")


def training_dataloader(cfg: TrainConfig, model: LatentDiffusion):
    """The phase's training data, tokenized as ``model``'s towers read it (each with its own tokenizer)."""
    from composer.utils import dist

    from .data import build_dataloader

    return build_dataloader(cfg.data, model.tokenizer, cfg.global_train_batch_size // dist.get_world_size(), cfg.seed,
                            other_phrasings=cfg.model.other_phrasing > 0, with_ids=cfg.randomness == "per_sample",
                            captions=model.reads_captions, tokenizer_2=model.tokenizer_2,
                            max_length_2=model.max_length_2, pin_memory=resolve_device(cfg) == "gpu")


class EpochInBatch(Callback):
    """Each sample's epoch beside its dataset index, for draws per sample (``randomness: per_sample``)."""

    def after_dataloader(self, state, logger) -> None:
        if isinstance(state.batch, dict) and "sample_id" in state.batch:
            ids = state.batch["sample_id"]
            epoch = torch.full_like(ids, int(state.timestamp.epoch))
            # pinned as the loader pinned the ids: a copy from pageable memory is staged by the driver, which may wait
            # for the work queued on the GPU before it
            state.batch["epoch"] = epoch.pin_memory() if ids.is_pinned() else epoch


def parallelism_config(cfg: TrainConfig) -> dict | None:
    """Composer's FSDP settings for the config's keys; HYBRID_SHARD shards over a node's processes and
    replicates over the nodes (a 2-D device mesh: nodes x local processes)."""
    from composer.utils import dist

    if not cfg.fsdp:
        return None
    # full: one file gathered on rank 0; sharded: a folder ep{epoch}-ba{batch}/ of torch.distributed.checkpoint
    # parts, one per saving rank, which the readers consolidate (models.checkpoints.composer.load_state)
    fsdp = {"sharding_strategy": cfg.fsdp_sharding_strategy, "state_dict_type": cfg.fsdp_state_dict_type,
            "mixed_precision": "PURE"}
    if cfg.fsdp_sharding_strategy == "HYBRID_SHARD":
        fsdp.update(data_parallel_replicate_degree=dist.get_world_size() // dist.get_local_world_size(),
                    data_parallel_shard_degree=dist.get_local_world_size())
    return {"fsdp": fsdp}


def say_fsdp_share(cfg: TrainConfig, model: LatentDiffusion) -> None:
    """One line per node: the share of the denoiser's weights its ranks hold (1/4 on 4 ranks with FULL_SHARD, 1/2
    on 2 nodes x 2 with HYBRID_SHARD, which replicates across nodes)."""
    from composer.utils import dist

    from .patches.fsdp import fsdp_weight_share

    if cfg.fsdp and dist.get_local_rank() == 0:
        held, total = fsdp_weight_share(model.denoiser)
        name = type(getattr(model.denoiser, "module", model.denoiser)).__name__  # inside FSDP's wrapper
        print(f"FSDP {cfg.fsdp_sharding_strategy}: node {dist.get_node_rank()}'s rank {dist.get_global_rank()} holds "
              f"{held:,} of the {name}'s {total:,} weights (1/{round(total / max(held, 1))})", flush=True)


def write_run_config(cfg: TrainConfig, run_dir: Path) -> None:
    """The run's whole config beside its checkpoints (rank 0), so a run says how it was made."""
    from composer.utils import dist

    if dist.get_global_rank() == 0:
        import yaml

        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def train(cfg: TrainConfig) -> Path:
    """Run one phase; returns the folder its checkpoints are in."""
    from composer.utils import dist

    trainer = build_trainer(cfg)
    if int(trainer.state.timestamp.batch) > 0 and dist.get_global_rank() == 0:
        print(f"resuming at batch {int(trainer.state.timestamp.batch)} from {cfg.resolved_save_folder()}", flush=True)
    try:
        trainer.fit()
    except Exception as e:
        if is_disk_full(e):
            raise checkpoint_disk_full(cfg.resolved_save_folder(), e) from None
        raise
    trainer.close()
    if "file" in cfg.loggers and dist.get_global_rank() == 0:
        plot_run_curves(run_dir_of(cfg))
    return Path(cfg.resolved_save_folder())


def run_dir_of(cfg: TrainConfig) -> Path:
    save_folder = cfg.resolved_save_folder()
    return Path(save_folder).parent if "://" not in save_folder else Path("runs") / cfg.run_name


def plot_run_curves(run_dir: Path) -> None:
    """``curves.png`` in the run folder: this run's figure (`dwb runs plot` draws several phases in one)."""
    from .callbacks import plot_runs

    out = plot_runs([run_dir], run_dir / "curves.png")
    print(f"curves in {out}", flush=True)


def checkpoint_disk_full(save_folder: str, e: BaseException) -> WorkbenchError:
    """A checkpoint cut short by a full disk: Composer writes it in place, so the torn file is set aside as
    ``*.corrupt`` now (as autoresume would) and ``latest`` points at the newest whole one; one line says so."""
    from composer.utils import dist

    if "://" not in save_folder and dist.get_global_rank() == 0:
        from models.checkpoints import select_resume_checkpoint

        select_resume_checkpoint(save_folder)
    return disk_full_error(save_folder, "a checkpoint (the cut-short file is set aside as *.corrupt)", e)
