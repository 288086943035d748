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
from .model import FluxStyleTransformer, LatentDiffusion, MicroConditionedUNet, RectifiedFlowTransformer

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


def frozen_parts(cfg: TrainConfig):
    """The VAE, text encoder and tokenizer: from ``model.pretrained``, or random (``pretrained: null``)."""
    from models.checkpoints import load_frozen_parts, random_text_encoder, random_vae

    m = cfg.model
    if m.pretrained is not None:
        return load_frozen_parts(m.pretrained)
    if m.architecture.startswith("tiny"):
        raise WorkbenchError(f"config key 'model.pretrained' is required for {m.architecture} (run `dwb prepare` "
                             "and point it there)")
    return random_vae(m.architecture), random_text_encoder(m.architecture), None


def check_memory(cfg: TrainConfig, device: str) -> None:
    """One line, before any weight is made, where this machine (or GPU) cannot hold the run's model: its parts
    counted on the meta device (``models.checkpoints.check_training_memory``)."""
    from composer.utils import dist

    from models.checkpoints import check_training_memory

    with torch.device("meta"):
        trained = sum(p.numel() for p in build_denoiser(cfg).parameters())
        # the parts the run builds (``model.pretrained`` null); pretrained ones are not counted: the plan is a floor
        built = (*frozen_parts(cfg)[:2], *second_towers(cfg)) if cfg.model.pretrained is None else ()
        frozen = sum(p.numel() for part in built for p in part.parameters())
    sharded = cfg.fsdp and cfg.fsdp_sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD")
    check_training_memory(trained, frozen, ema=cfg.ema.enabled, shards=dist.get_world_size() if cfg.fsdp else 1,
                          weights_sharded=sharded, processes=dist.get_local_world_size(),
                          device=torch.device("cuda" if device == "gpu" else "cpu"),
                          what=f"'{cfg.model.architecture}' ({cfg.run_name})")


def denoiser_kind(architecture: str) -> str:
    """"unet" or "transformer": the part of the architecture's family that denoises."""
    from models.checkpoints import ARCHITECTURES

    return family_or_ours(ARCHITECTURES[architecture].get("family")).denoiser


def build_denoiser(cfg: TrainConfig):
    """The architecture's denoiser with random weights, ``model.unet`` or ``model.transformer`` over its config; a
    key the denoiser does not take is one line."""
    from models.checkpoints import build_transformer, build_unet

    m = cfg.model
    kind = denoiser_kind(m.architecture)
    build, overrides = {"unet": (build_unet, m.unet), "transformer": (build_transformer, m.transformer)}[kind]
    try:
        return build(m.architecture, overrides)
    except TypeError as e:
        raise WorkbenchError(f"config key 'model.{kind}': {e}") from None


def build_model(cfg: TrainConfig) -> LatentDiffusion:
    """The architecture's Composer model, by its family's pipeline: a UNet on the diffusion schedule (SD 2's, or
    SDXL's with two text towers and size conditioning), or a transformer on rectified flow."""
    from models.checkpoints import ARCHITECTURES

    family = family_or_ours(ARCHITECTURES[cfg.model.architecture].get("family"))
    return MODEL_BUILDERS[family.pipeline](cfg, *frozen_parts(cfg))


def second_towers(cfg: TrainConfig) -> tuple:
    """The second text tower of an architecture that has one (SDXL's), else none."""
    from models.checkpoints import ARCHITECTURES, second_text_encoder

    if "text_encoder_2" not in ARCHITECTURES[cfg.model.architecture]:
        return ()
    return (second_text_encoder(cfg.model.architecture, cfg.model.pretrained, None),)


def prepared_denoiser(cfg: TrainConfig, vae, packed: int = 1):
    """The run's denoiser, checked against the VAE's latent channels (``packed``: latents per token, Flux.1's 2x2
    patches take 4), with gradient checkpointing where configured."""
    m, denoiser = cfg.model, build_denoiser(cfg)
    channels, latent = denoiser.config.in_channels, vae.config.latent_channels
    if channels != packed * latent:
        raise WorkbenchError(f"the {DENOISER_WORDS[denoiser_kind(m.architecture)]} takes {channels} channels but the VAE from '{m.pretrained}' makes {latent}"
                             + (f", packed 2x2: {packed * latent}" if packed > 1 else ""))
    if m.gradient_checkpointing:
        denoiser.enable_gradient_checkpointing()
    return denoiser


def with_recorded_shift(vae):
    """The VAE with a latent shift in its config: SD's VAEs shift nothing and do not say so, and SD3's and Flux.1's
    pipelines read the key."""
    if getattr(vae.config, "shift_factor", None) is None:
        vae.register_to_config(shift_factor=0.0)
    return vae


def caption_options(cfg: TrainConfig) -> dict:
    """What every training model takes from the config about its captions and draws: dropout for guidance, the
    other phrasing's share, and the per-sample seed (``randomness: per_sample``)."""
    m = cfg.model
    return dict(caption_dropout=m.caption_dropout, other_phrasing=m.other_phrasing,
                per_sample_seed=cfg.seed if cfg.randomness == "per_sample" else None)


def build_unet_model(cfg: TrainConfig, vae, text_encoder, tokenizer) -> LatentDiffusion:
    m = cfg.model
    unet = prepared_denoiser(cfg, vae)
    if unet.config.cross_attention_dim != text_encoder.config.hidden_size:
        raise WorkbenchError(f"the UNet's cross_attention_dim ({unet.config.cross_attention_dim}) does not match the "
                             f"text encoder's width ({text_encoder.config.hidden_size}) from '{m.pretrained}'")
    return LatentDiffusion(unet, vae, text_encoder, tokenizer, prediction_type=m.prediction_type,
                           min_snr_gamma=m.min_snr_gamma, **caption_options(cfg))


def flow_of(cfg: TrainConfig):
    """The run's rectified flow: the configured draws, and the shift its resolution takes (SD3's sqrt rule)."""
    from models.checkpoints import ARCHITECTURES
    from models.families import RectifiedFlow, pixels_shift

    m = cfg.model
    base = ARCHITECTURES[m.architecture]["flow_base_resolution"]
    shift = m.flow_shift if m.flow_shift is not None else pixels_shift(cfg.data.resolution ** 2, base ** 2)
    return RectifiedFlow(logit_mean=m.logit_mean, logit_std=m.logit_std, shift=shift, weighting=m.loss_weighting)


def build_transformer_model(cfg: TrainConfig, vae, text_encoder, tokenizer) -> RectifiedFlowTransformer:
    from models.checkpoints import with_projection

    m = cfg.model
    if cfg.data.precomputed and m.other_phrasing > 0:
        raise WorkbenchError(f"config key 'model.other_phrasing': {m.architecture} on precomputed latents reads the "
                             "stored captions, not their other phrasings; set it to 0 or train from images")
    transformer = prepared_denoiser(cfg, with_recorded_shift(vae))
    slots = 2  # SD3's pipeline fills two CLIP slots; this model's one tower fills both
    width = slots * text_encoder.config.hidden_size
    if transformer.config.joint_attention_dim != width or transformer.config.pooled_projection_dim != width:
        raise WorkbenchError(f"the transformer's joint_attention_dim and pooled_projection_dim must be {width} (the "
                             f"text encoder's width {text_encoder.config.hidden_size} in {slots} CLIP slots)")
    return RectifiedFlowTransformer(transformer, vae, with_projection(text_encoder), tokenizer, flow=flow_of(cfg),
                                    clip_slots=slots, **caption_options(cfg))


def build_sdxl_model(cfg: TrainConfig, vae, text_encoder, tokenizer) -> MicroConditionedUNet:
    """SDXL's UNet with two text towers; the second reads its own tokenizer (``tokenizer_2/``) where it loads from
    ``model.pretrained``, the first tokenizer's ids where the architecture builds it."""
    from models.checkpoints import second_text_encoder, second_tokenizer

    m = cfg.model
    if cfg.data.precomputed:
        raise WorkbenchError(f"config key 'data.precomputed': {m.architecture} is conditioned on each image's original "
                             "size and crop, which precomputed latents do not store; train it from images")
    text_encoder_2 = second_text_encoder(m.architecture, m.pretrained, tokenizer)
    tokenizer_2 = second_tokenizer(m.architecture, m.pretrained)
    unet = prepared_denoiser(cfg, vae)
    width = text_encoder.config.hidden_size + text_encoder_2.config.hidden_size
    added = text_encoder_2.config.projection_dim + 6 * unet.config.addition_time_embed_dim
    if unet.config.cross_attention_dim != width or unet.config.projection_class_embeddings_input_dim != added:
        raise WorkbenchError(f"the UNet's cross_attention_dim and projection_class_embeddings_input_dim must be {width} "
                             f"(both text towers' widths) and {added} (the second's pooled output and 6 time ids)")
    return MicroConditionedUNet(unet, vae, text_encoder, text_encoder_2, tokenizer, tokenizer_2,
                                prediction_type=m.prediction_type, min_snr_gamma=m.min_snr_gamma,
                                **caption_options(cfg))


def build_flux_model(cfg: TrainConfig, vae, text_encoder, tokenizer) -> FluxStyleTransformer:
    """A Flux.1-style transformer on rectified flow at Flux.1's resolution shift (``flux_shift``): its T5 built here
    and reading the CLIP tokenizer's ids (the tiny architecture), or pretrained with T5's own tokenizer."""
    from models.checkpoints import ARCHITECTURES, T5_TOKENS, load_t5_parts, random_t5_encoder

    m = cfg.model
    if cfg.data.precomputed:
        raise WorkbenchError(f"config key 'data.precomputed': {m.architecture} reads its T5 states from the captions, "
                             "which precomputed latents do not carry for it; train it from images")
    if ARCHITECTURES[m.architecture].get("builds_t5_encoder"):
        text_encoder_2, tokenizer_2 = random_t5_encoder(m.architecture, len(tokenizer), tokenizer.pad_token_id), None
    elif m.pretrained is None:
        raise WorkbenchError(f"config key 'model.pretrained': {m.architecture} loads its T5 encoder and T5's tokenizer "
                             "from a FLUX.1 diffusers folder or hub id (text_encoder_2/, tokenizer_2/); set it")
    else:  # T5-XXL and its own tokenizer, pretrained
        text_encoder_2, tokenizer_2 = load_t5_parts(m.pretrained)
    transformer = prepared_denoiser(cfg, with_recorded_shift(vae), packed=4)
    c = transformer.config
    if c.joint_attention_dim != text_encoder_2.config.d_model or c.pooled_projection_dim != text_encoder.config.hidden_size:
        raise WorkbenchError(f"the transformer's joint_attention_dim and pooled_projection_dim must be "
                             f"{text_encoder_2.config.d_model} (T5's width) and {text_encoder.config.hidden_size} "
                             "(the CLIP tower's)")
    return FluxStyleTransformer(transformer, vae, text_encoder, tokenizer, text_encoder_2, flow=flux_flow(cfg, vae),
                                text_tokens=T5_TOKENS, tokenizer_2=tokenizer_2, **caption_options(cfg))


def flux_flow(cfg: TrainConfig, vae):
    """The run's rectified flow at Flux.1's shift for its images' tokens (2x2 patches of latents), as FluxPipeline
    shifts its sampling schedule at the same size."""
    from models.families import RectifiedFlow, patches_shift

    m = cfg.model
    latent_side = cfg.data.resolution // 2 ** (len(vae.config.block_out_channels) - 1)
    shift = m.flow_shift if m.flow_shift is not None else patches_shift((latent_side // 2) ** 2)
    return RectifiedFlow(logit_mean=m.logit_mean, logit_std=m.logit_std, shift=shift, weighting=m.loss_weighting)


DENOISER_WORDS = {"unet": "UNet", "transformer": "transformer"}
# The Composer model each family's pipeline is trained as
MODEL_BUILDERS = {"StableDiffusionPipeline": build_unet_model, "StableDiffusion3Pipeline": build_transformer_model,
                  "StableDiffusionXLPipeline": build_sdxl_model, "FluxPipeline": build_flux_model}


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
    """
    from composer.utils import dist

    if not cfg.autoresume:
        return None
    found = problem = None
    if dist.get_global_rank() == 0:
        try:
            found = _newest_remote(save_folder) if "://" in save_folder else _newest_local(cfg, save_folder)
        except WorkbenchError as e:
            problem = str(e)  # said by every rank: the others wait in the broadcast
    box = [found, problem]
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    if box[1]:
        raise WorkbenchError(box[1])
    return box[0]


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
    """Precomputed data: refuse latents of another VAE/text encoder, and hand the model the empty caption."""
    if not cfg.data.precomputed:
        return None
    from .data import check_compatible, decode_array, latent_meta

    meta = latent_meta(cfg.data)
    check_compatible(meta, vae=model.vae, text_encoder=None if model.reads_captions else model.text_encoder,
                     resolution=cfg.data.resolution, where="config key 'data.precomputed'")
    if not model.reads_captions:
        model.set_empty_text(torch.from_numpy(decode_array(meta["empty_text"])))
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


def make_algorithms(cfg: TrainConfig) -> list:
    """The guard against non-finite steps, gradient clipping, EMA and low-precision norms, as configured."""
    from composer.algorithms import GradientClipping, LowPrecisionGroupNorm, LowPrecisionLayerNorm

    from .ema import FusedEMA
    from .guard import NonFiniteGuard

    algorithms = [NonFiniteGuard(cfg.max_consecutive_nonfinite)]  # before clipping, at the same event
    if cfg.grad_clip_norm is not None:
        algorithms.append(GradientClipping(clipping_type="norm", clipping_threshold=cfg.grad_clip_norm))
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
                                        v.max_samples, v.seed, v.batch_size))
    if cfg.preview_interval:
        p = cfg.previews
        callbacks.append(Previews(run_dir / "previews", batch_count(cfg.preview_interval), p.prompts, p.seeds,
                                  steps=p.steps, guidance=p.guidance, size=cfg.data.resolution, sampler=p.sampler,
                                  ema=p.ema and cfg.ema.enabled))
    return callbacks


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
        dist.initialize_dist(DeviceGPU() if device == "gpu" else DeviceCPU())
    return device, precision


def build_trainer(cfg: TrainConfig):
    """Composer's Trainer for one phase: every check that can fail runs before it is built."""
    from composer import Trainer
    from composer.callbacks import LRMonitor, SpeedMonitor
    from composer.utils import dist, reproducibility

    from .callbacks import ModelSpec
    from .patches.composer import RestoreRNG, align_dataset_epoch, prompt_remote_latest

    device, precision = start_processes(cfg)
    save_folder = cfg.resolved_save_folder()
    for key, url, needed in (("load_path", cfg.load_path, True), ("save_folder", save_folder, cfg.autoresume)):
        if needed and url and "://" in url:
            check_remote_folder(url, key)
    reproducibility.seed_all(cfg.seed)  # the UNet's initial weights follow the run's seed
    check_memory(cfg, device)
    model = build_model(cfg)
    check_save_folder(save_folder, estimate_checkpoint_bytes(model, cfg.ema.enabled))
    attention = set_attention(model.denoiser, cfg.model.attention, device)
    spec = make_spec(model, cfg.model.architecture, cfg.data.resolution, training_record(cfg), cfg.previews.recommended())
    load_path = checked_load_path(cfg, spec)
    attach_latents(cfg, model)
    resume_from = resolve_resume(cfg, save_folder)
    remote_resume = resume_from is not None and "://" in save_folder
    run_dir = run_dir_of(cfg)
    restore_rng = RestoreRNG()
    trainer = Trainer(
        model=model,
        train_dataloader=training_dataloader(cfg, model),
        max_duration=cfg.max_duration,
        optimizers=torch.optim.AdamW(model.denoiser.parameters(), lr=cfg.optimizer.lr, betas=tuple(cfg.optimizer.betas),
                                     eps=cfg.optimizer.eps, weight_decay=cfg.optimizer.weight_decay),
        schedulers=make_scheduler(cfg), step_schedulers_every_batch=True,
        algorithms=make_algorithms(cfg),
        callbacks=[SpeedMonitor(window_size=20), LRMonitor(), ModelSpec(spec), restore_rng, EpochInBatch(),
                   *make_run_callbacks(cfg, run_dir, load_path)],
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
        parallelism_config=parallelism_config(cfg),
        seed=cfg.seed, python_log_level=None,
    )
    restore_rng.take_over(trainer)
    align_dataset_epoch(trainer)
    prompt_remote_latest(trainer)
    say_fsdp_share(cfg, model)
    log.info("attention backend: %s, device: %s, precision: %s", attention, device, precision)
    write_run_config(cfg, run_dir)
    return trainer


def training_dataloader(cfg: TrainConfig, model: LatentDiffusion):
    """The phase's training data, tokenized as ``model``'s towers read it (each with its own tokenizer)."""
    from composer.utils import dist

    from .data import build_dataloader

    return build_dataloader(cfg.data, model.tokenizer, cfg.global_train_batch_size // dist.get_world_size(), cfg.seed,
                            other_phrasings=cfg.model.other_phrasing > 0, with_ids=cfg.randomness == "per_sample",
                            captions=model.reads_captions, tokenizer_2=model.tokenizer_2,
                            max_length_2=model.max_length_2)


class EpochInBatch(Callback):
    """Each sample's epoch beside its dataset index, for draws per sample (``randomness: per_sample``)."""

    def after_dataloader(self, state, logger) -> None:
        if isinstance(state.batch, dict) and "sample_id" in state.batch:
            state.batch["epoch"] = torch.full_like(state.batch["sample_id"], int(state.timestamp.epoch))


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
