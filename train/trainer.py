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
from pathlib import Path

import torch

from .config import TrainConfig, config_to_dict
from .errors import WorkbenchError
from .model import LatentDiffusion
from .spec import ModelSpec, make_spec

log = logging.getLogger(__name__)


def resolve_device(cfg: TrainConfig) -> str:
    if cfg.device == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    if cfg.device == "gpu" and not torch.cuda.is_available():
        raise WorkbenchError("config key 'device' is 'gpu' but no CUDA GPU is visible")
    return cfg.device


def resolve_precision(cfg: TrainConfig, device: str) -> str:
    if cfg.precision == "auto":
        return "amp_bf16" if device == "gpu" else "fp32"
    if device == "cpu" and cfg.precision == "amp_fp16":
        raise WorkbenchError("config key 'precision': amp_fp16 needs a GPU (use fp32 or amp_bf16 on CPU)")
    return cfg.precision


def check_gpu_features(cfg: TrainConfig, device: str) -> None:
    """Features that need a GPU are refused on CPU, never silently ignored."""
    if device == "gpu":
        return
    for key, on in (("fsdp", cfg.fsdp), ("low_precision_norms", cfg.low_precision_norms)):
        if on:
            raise WorkbenchError(f"config key '{key}' needs a CUDA GPU; set {key}=false to train on CPU")
    if cfg.model.attention == "xformers":
        raise WorkbenchError("config key 'model.attention' is 'xformers', which needs a CUDA GPU; use sdpa or auto")


def set_attention(unet, backend: str, device: str) -> str:
    """'auto' picks xformers on a GPU when it is installed, else PyTorch SDPA (diffusers' default)."""
    if backend in ("auto", "xformers") and device == "gpu":
        try:
            import xformers  # noqa: F401

            unet.enable_xformers_memory_efficient_attention()
            return "xformers"
        except ImportError:
            if backend == "xformers":
                raise WorkbenchError("config key 'model.attention' is 'xformers' but xformers is not installed "
                                     "(pip install 'diffusion-workbench[gpu]')") from None
    from diffusers.models.attention_processor import AttnProcessor2_0

    unet.set_attn_processor(AttnProcessor2_0())
    return "sdpa"


def build_model(cfg: TrainConfig) -> LatentDiffusion:
    from .components import build_unet, load_frozen_parts, random_text_encoder, random_vae

    m = cfg.model
    if m.pretrained is None:
        if m.architecture == "tiny":
            raise WorkbenchError("config key 'model.pretrained' is required for tiny (run `dwb prepare` and point it there)")
        vae, text_encoder, tokenizer = random_vae(m.architecture), random_text_encoder(m.architecture), None
    else:
        vae, text_encoder, tokenizer = load_frozen_parts(m.pretrained)
    try:
        unet = build_unet(m.architecture, m.unet)
    except TypeError as e:
        raise WorkbenchError(f"config key 'model.unet': {e}") from None
    if unet.config.cross_attention_dim != text_encoder.config.hidden_size:
        raise WorkbenchError(f"the UNet's cross_attention_dim ({unet.config.cross_attention_dim}) does not match the "
                             f"text encoder's width ({text_encoder.config.hidden_size}) from '{m.pretrained}'")
    if unet.config.in_channels != vae.config.latent_channels:
        raise WorkbenchError(f"the UNet takes {unet.config.in_channels} channels but the VAE from '{m.pretrained}' "
                             f"makes {vae.config.latent_channels}")
    if m.gradient_checkpointing:
        unet.enable_gradient_checkpointing()
    return LatentDiffusion(unet, vae, text_encoder, tokenizer, prediction_type=m.prediction_type,
                           caption_dropout=m.caption_dropout, min_snr_gamma=m.min_snr_gamma)


def check_load_path(cfg: TrainConfig, spec: dict) -> None:
    """Refuse a checkpoint of another architecture before Composer tries to load it."""
    if not cfg.load_path or "://" in cfg.load_path:
        return
    from .checkpoint import read_checkpoint

    other = read_checkpoint(cfg.load_path)["spec"]
    if other["architecture"] != spec["architecture"] or other["unet"] != spec["unet"]:
        raise WorkbenchError(f"config key 'load_path': {cfg.load_path} holds a '{other['architecture']}' model whose "
                             f"UNet differs from this run's '{spec['architecture']}' UNet")


def check_save_folder(folder: str) -> None:
    """An unwritable or full save folder fails now, not at the first checkpoint hours later."""
    if "://" in folder:
        return
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_bytes(b"0")
        probe.unlink()
    except OSError as e:
        raise WorkbenchError(f"config key 'save_folder': cannot write to {folder} ({e.strerror})") from None
    if shutil.disk_usage(path).free < 64 * 2**20:
        raise WorkbenchError(f"config key 'save_folder': less than 64 MiB free at {folder}")


def build_trainer(cfg: TrainConfig):
    from composer import Trainer
    from composer.algorithms import GradientClipping, LowPrecisionGroupNorm, LowPrecisionLayerNorm
    from composer.callbacks import LRMonitor, SpeedMonitor
    from composer.loggers import FileLogger
    from composer.optim import ConstantWithWarmupScheduler
    from composer.utils import dist

    from .data import build_dataloader
    from .ema import FusedEMA

    device = resolve_device(cfg)
    check_gpu_features(cfg, device)
    precision = resolve_precision(cfg, device)
    save_folder = cfg.resolved_save_folder()
    check_save_folder(save_folder)
    model = build_model(cfg)
    attention = set_attention(model.unet, cfg.model.attention, device)
    spec = make_spec(model, cfg.model.architecture, cfg.data.resolution)
    check_load_path(cfg, spec)

    world = dist.get_world_size()
    if cfg.global_train_batch_size % world:
        raise WorkbenchError(f"config key 'global_train_batch_size' ({cfg.global_train_batch_size}) must divide by "
                             f"the number of processes ({world})")
    dataloader = build_dataloader(cfg.data, model.tokenizer, cfg.global_train_batch_size // world, cfg.seed)

    o = cfg.optimizer
    optimizer = torch.optim.AdamW(model.unet.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                                  weight_decay=o.weight_decay)
    algorithms = []
    if cfg.grad_clip_norm is not None:
        algorithms.append(GradientClipping(clipping_type="norm", clipping_threshold=cfg.grad_clip_norm))
    if cfg.ema.enabled:
        algorithms.append(FusedEMA(half_life=None, smoothing=cfg.ema.smoothing, ema_start=cfg.ema.ema_start,
                              update_interval=cfg.ema.update_interval))
    if cfg.low_precision_norms:
        algorithms += [LowPrecisionGroupNorm(), LowPrecisionLayerNorm()]

    run_dir = Path(save_folder).parent if "://" not in save_folder else Path("runs") / cfg.run_name
    loggers = []
    for name in cfg.loggers:
        if name == "file":
            run_dir.mkdir(parents=True, exist_ok=True)
            loggers.append(FileLogger(filename=str(run_dir / "log-rank{rank}.txt"), flush_interval=50))
        elif name == "tensorboard":
            from composer.loggers import TensorboardLogger

            try:
                loggers.append(TensorboardLogger(log_dir=str(run_dir / "tensorboard"), flush_interval=50))
            except Exception as e:
                raise WorkbenchError(f"config key 'loggers': tensorboard is not usable ({e}); pip install tensorboard") from None
        elif name == "wandb":
            from composer.loggers import WandBLogger

            loggers.append(WandBLogger(project=os.environ.get("WANDB_PROJECT", "diffusion-workbench"), name=cfg.run_name))

    parallelism = None
    if cfg.fsdp:
        parallelism = {"fsdp": {"sharding_strategy": "SHARD_GRAD_OP", "mixed_precision": "PURE"}}

    trainer = Trainer(
        model=model,
        train_dataloader=dataloader,
        max_duration=cfg.max_duration,
        optimizers=optimizer,
        schedulers=ConstantWithWarmupScheduler(t_warmup=cfg.scheduler.t_warmup),
        step_schedulers_every_batch=True,
        algorithms=algorithms,
        callbacks=[SpeedMonitor(window_size=20), LRMonitor(), ModelSpec(spec)],
        loggers=loggers,
        run_name=cfg.run_name,
        progress_bar=cfg.progress_bar,
        log_to_console=False,
        console_log_interval=cfg.log_interval,
        save_folder=save_folder,
        save_filename="ep{epoch}-ba{batch}-rank{rank}.pt",
        save_latest_filename="latest-rank{rank}.pt",
        save_interval=cfg.save_interval,
        save_num_checkpoints_to_keep=cfg.save_num_checkpoints_to_keep,
        save_overwrite=not cfg.autoresume,
        autoresume=cfg.autoresume,
        load_path=None if cfg.autoresume and _has_checkpoint(save_folder) else cfg.load_path,
        load_weights_only=cfg.load_weights_only,
        device=device,
        precision=precision,
        device_train_microbatch_size=cfg.device_train_microbatch_size,
        parallelism_config=parallelism,
        seed=cfg.seed,
        python_log_level=None,
    )
    log.info("attention backend: %s, device: %s, precision: %s", attention, device, precision)
    if dist.get_global_rank() == 0:
        import yaml

        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    return trainer


def _has_checkpoint(folder: str) -> bool:
    return "://" not in folder and any(Path(folder).glob("ep*-ba*-rank0.pt"))


def train(cfg: TrainConfig) -> Path:
    """Run one phase; returns the folder its checkpoints are in."""
    trainer = build_trainer(cfg)
    trainer.fit()
    trainer.close()
    return Path(cfg.resolved_save_folder())
