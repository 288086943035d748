"""Typed training configuration: YAML on disk, ``key=value`` overrides, unknown keys rejected by name, every
number and duration within the range on its field (the machinery: ``models.common.typed_config``).

Top-level keys follow Composer's Trainer argument names where one exists (``max_duration``,
``save_folder``, ``save_interval``, ``device_train_microbatch_size``, ``seed``, ``load_path`` ...).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from models.checkpoints import ARCHITECTURES, T5_TOKENS
from models.families import SAMPLINGS, WEIGHTINGS
from models.errors import WorkbenchError
from models.common import (Duration, Each, MAX_TIME, PROBABILITY, Range, SEED, build_config, check_rules, checked,
                           merge_config, one_of, parse_overrides, read_config_file, shown)

from models.datasets import StreamConfig

ARCHITECTURE_NAMES = tuple(ARCHITECTURES)  # the architectures a config may name
PREDICTION_TYPES = ("epsilon", "v_prediction")


MAX_RESOLUTION = 4096  # SDXL-class models train at 1024; a 65536 side asked for 2^32 pixels per image
MAX_BATCH = 1 << 20  # 512x SD2's 2048; a batch of 1e12 hung while the first one was gathered
MAX_STEPS = 1000  # a preview's sampling steps: samplers gain nothing past a few hundred
MAX_SAMPLES = 1 << 24  # held-out samples, workers' prefetch and the like


def multiple_of_8(side: int) -> Optional[str]:
    """Image sides the VAE's 8x downsampling maps to whole latents."""
    return None if 0 < side <= MAX_RESOLUTION and side % 8 == 0 else \
        f"must be a positive multiple of 8 up to {MAX_RESOLUTION}, got {side}"


def microbatch(size: Union[int, str]) -> Optional[str]:
    return None if size == "auto" or (isinstance(size, int) and 1 <= size <= MAX_BATCH) else \
        f"must be an integer in [1, {MAX_BATCH}] or 'auto', got {size!r}"


def torch_device(name: str) -> Optional[str]:
    """torch's device names, as `dwb evaluate`, `dwb app` and `dwb data precompute` take them."""
    if name == "gpu":
        return "must be auto, cpu or cuda (torch's device names), got 'gpu': write cuda"
    return None if name in ("auto", "cpu", "cuda") else f"must be auto, cpu or cuda, got {name!r}"


BATCH = Range(1, MAX_BATCH)
COUNT = Range(1, MAX_SAMPLES)


SHUFFLE_ALGOS = ("py1e", "py1br", "py1b", "py1s", "py2s", "naive")
LOGGERS = ("file", "tensorboard", "wandb")


@dataclass
class ModelConfig:
    architecture: str = checked("tiny", one_of(*ARCHITECTURE_NAMES))
    # Folder or hub id with vae/, text_encoder/ and tokenizer/ (a diffusers layout). For `tiny`,
    # `dwb prepare` builds one; for `sd2-base`, stabilityai/stable-diffusion-2-base or a local copy; for `sdxl-base`,
    # stabilityai/stable-diffusion-xl-base-1.0 (text_encoder_2/ too; `tiny-sdxl` builds its second tower).
    # None builds every component with random weights (benchmarks, shape tests).
    pretrained: Optional[str] = None
    # Fine-tune a model the checkpoint door opens (a diffusers folder, a hub id, a single file or one of our Composer
    # checkpoints), of any family the workbench trains: its denoiser's weights, frozen parts, tokenizers and noise
    # schedule (prediction type) come from it, and architecture, pretrained, unet, transformer and prediction_type
    # are not read. null: the architecture, random or from load_path.
    init_from: Optional[str] = None
    prediction_type: str = checked("epsilon", one_of(*PREDICTION_TYPES))
    # 1 would drop every caption: the model would never see one
    caption_dropout: float = checked(0.1, Range(0, 1, high_open=True))
    # <= 0 weighs every timestep's loss by zero or less (training stands still or runs uphill)
    min_snr_gamma: Optional[float] = checked(None, Range(0, 1000, low_open=True, note="null turns the weighting off"))
    # Probability of training a sample under its caption's other phrasing, where the data lists
    # phrasings ("A above B" / "B below A" in the shapes data): teaches that both mean one scene.
    other_phrasing: float = checked(0.0, PROBABILITY)
    attention: str = checked("auto", one_of("auto", "sdpa", "xformers"))
    gradient_checkpointing: bool = False
    unet: dict = field(default_factory=dict)  # overrides of the architecture's UNet config
    transformer: dict = field(default_factory=dict)  # overrides of a transformer architecture's config
    # Rectified flow (transformer architectures): t = shifted(sigmoid(logit_mean + logit_std n), flow_shift), n
    # standard normal (SD3's logit-normal draws; 0 and 1 were its best), or with timestep_sampling uniform
    # t = shifted(u, flow_shift), u uniform in [0, 1) (MLPerf's Flux.1 reference, with flow_shift 1: logit-normal
    # shifted by 1.65 put 0.73% of the draws below t = 1/8, uniform 12.5%). flow_shift null: 1 at the architecture's
    # base side and sqrt(pixels / its pixels) above it (SD3's resolution shift); samplers use the same shift.
    timestep_sampling: str = checked("logit_normal", one_of(*SAMPLINGS))
    logit_mean: float = checked(0.0, Range(-10, 10))
    logit_std: float = checked(1.0, Range(0, 10, low_open=True))
    flow_shift: Optional[float] = checked(None, Range(0.01, 100, note="null follows the resolution"))
    loss_weighting: str = checked("none", one_of(*WEIGHTINGS))
    # Flux.1 and SD3 (its own T5): the T5 tokens each caption is padded or cut to. 512 is FluxPipeline's default
    # max_sequence_length, which a plain pipeline call draws with; MLPerf's reference reads 256;
    # StableDiffusion3Pipeline draws with 256; diffusers' train_dreambooth_lora_sd3.py (0185674) tokenizes 77.
    # FluxPipeline refuses more than 512.
    text_tokens: int = checked(T5_TOKENS, Range(1, 512))
    # A guidance-distilled transformer (Flux.1-dev's guidance_embeds): the guidance it is told in training. 3.5 is
    # what diffusers' examples/dreambooth/train_dreambooth_flux.py passes (its --guidance_scale default, "the FLUX.1
    # dev variant is a guidance distilled model") and what Flux.1-dev samples at; unused without guidance_embeds.
    guidance_scale: float = checked(3.5, Range(0, 100))


ADAPTER_TYPES = ("lora", "dora", "loha", "lokr")  # models.adapters.KINDS, through peft


@dataclass
class AdapterConfig:
    """An adapter trained on the denoiser of ``model.init_from`` instead of the denoiser itself (docs/adapters.md):
    the base frozen and never saved; checkpoints hold the adapter, its optimizer state and EMA, and name the base
    by its content hash. null values take the family's preset (``models.adapters.PRESETS``)."""
    type: Optional[str] = checked(None, one_of(*ADAPTER_TYPES, None))  # null: no adapter, the whole denoiser trains
    rank: Optional[int] = checked(None, Range(1, 4096, note="null takes the family's preset"))
    alpha: Optional[float] = checked(None, Range(0, 1e6, low_open=True, note="null takes the family's preset"))
    dropout: Optional[float] = checked(None, Range(0, 0.99, note="null takes the family's preset"))
    targets: Optional[list[str]] = None  # peft's target_modules; null: the family's preset
    # a LoRA of the same rank and alpha on the text towers too: the CLIP towers diffusers' LoRA loader adapts
    # (models.adapters.adaptable_text_encoders), on their attention's q_proj, k_proj, v_proj, out_proj
    text_encoders: bool = False


@dataclass
class DataConfig:
    path: Optional[str] = ""  # an MDS folder written by `dwb data shapes`, `convert` or `precompute` (the cache, with `remote`)
    remote: Optional[str] = None
    # Several datasets mixed by proportion or repeat, instead of path/remote (resolution buckets, sources).
    streams: list[StreamConfig] = field(default_factory=list)
    # True: the datasets hold VAE latents and text hidden states from `dwb data precompute`.
    precomputed: bool = False
    resolution: int = checked(256, multiple_of_8)
    num_workers: int = checked(0, Range(0, 256))  # 0: samples are read in the training process
    shuffle: bool = True
    center_crop: bool = True  # False: random crop
    # Where a dataset holds aspect-ratio buckets (`dwb data convert --aspect-buckets`): one stream per bucket, every
    # global batch from one bucket, images at their stored size (data.resolution must be the buckets' budget).
    # False: square crops at data.resolution, as from any other dataset.
    aspect_buckets: bool = True
    # Samples Streaming's background threads may prepare ahead of the reader. None: Streaming's
    # default (8 batches) for remote data; for local data the whole epoch, so those threads finish
    # at once instead of stepping in lockstep with every sample (3.2x the read rate measured).
    predownload: Optional[int] = checked(None, Range(0, MAX_SAMPLES))
    # Streaming shuffles within this many canonical nodes; kept fixed, the global sample order is
    # the same whatever the number of nodes and ranks (elastic determinism). Must divide or be
    # divisible by the number of nodes.
    num_canonical_nodes: int = checked(1, Range(1, 65536))
    shuffle_algo: str = checked("py1e", one_of(*SHUFFLE_ALGOS))
    # DreamBooth data (`dwb data dreambooth`): each class image's loss counts this many times an instance image's
    # (prior preservation; 1.0 is diffusers' and kohya's default); 0 trains on the instance images alone.
    prior_loss_weight: float = checked(1.0, Range(0, 1000))
    # Where the data holds masks (`dwb data dreambooth`, from masks/ or the alpha channel): each latent cell's loss
    # weighed by the mask over its pixels, each sample's loss their weighted mean. False: masks are not read.
    masked_loss: bool = True


@dataclass
class OptimizerConfig:
    # < 0 trains uphill; 0 keeps the weights (a loss-only pass); AdamW moves each weight by about lr per step,
    # so above 1 no weight of a network keeps its scale
    lr: float = checked(1.0e-4, Range(0, 1))
    # AdamW multiplies each weight by 1 - lr x weight_decay per step: past 1/lr it flips the weights' sign
    weight_decay: float = checked(0.01, Range(0, 10))
    # AdamW's moment decay rates: 1 or more never forgets (or grows without bound)
    betas: list[float] = checked(rule=Each(Range(0, 1, high_open=True), length=2), factory=lambda: [0.9, 0.999])
    eps: float = checked(1.0e-8, Range(0, 1, low_open=True))  # 0 divides by zero where a weight's gradient vanishes


SCHEDULERS = ("constant_with_warmup", "linear_with_warmup", "cosine_with_warmup")


@dataclass
class SchedulerConfig:
    # Composer's warm-up schedulers: linear warm-up over t_warmup, then constant (the SD2 recipe), or a
    # linear / cosine decay to alpha_f x lr at max_duration.
    name: str = checked("constant_with_warmup", one_of(*SCHEDULERS))
    t_warmup: str = checked("10000ba", Duration(positive=False))  # 0ba: no warm-up
    alpha_f: float = checked(0.0, Range(0, 1))


@dataclass
class EMAConfig:
    enabled: bool = False
    # 0 copies the weights (no averaging); 1 never moves; above 1 grows without bound (2 reached 6.5e4 in 30
    # batches, and a checkpoint stores the EMA weights as the model's)
    smoothing: float = checked(0.9999, Range(0, 1, low_open=True, high_open=True))
    ema_start: str = checked("0ba", Duration(positive=False))
    update_interval: str = checked("1ba", Duration(units=("ba", "ep")))  # Composer's EMA takes no other unit


def batches(text: str) -> Optional[str]:
    """Intervals the callbacks count in batches, up to the longest run (``MAX_TIME``: int() raised Python's own
    error on 5,000 digits)."""
    import re

    m = re.fullmatch(r"(\d{1,20})ba", str(text))
    return None if m and 0 < int(m.group(1)) <= MAX_TIME["ba"] else \
        f"must be a positive number of batches up to {MAX_TIME['ba']}ba, such as 500ba, got {shown(text)}"


def non_empty_text(text: str) -> Optional[str]:
    return None if isinstance(text, str) and text.strip() else f"must be non-empty text, got {text!r}"


def timestep(t: int) -> Optional[str]:
    return None if isinstance(t, int) and 0 <= t <= 999 else f"must be a timestep from 0 to 999, got {t!r}"


@dataclass
class ValidationConfig:
    # A held-out MDS dataset of images and captions on the local disk (`dwb data shapes OUT` writes OUT/eval/<size>);
    # null: no validation loss. Read at the training resolution, every `eval_interval`.
    path: Optional[str] = None
    # Each held-out sample is noised to every one of these timesteps with its own fixed noise; reported overall
    # and per band (low < 333 <= mid < 667 <= high), as the unweighted MSE to the target whatever the training
    # loss's weighting. Five timesteps and 64 samples: one pass (raw and EMA) costs about 3 training batches of 64
    # (bench/run_overhead.py).
    timesteps: list[int] = checked(rule=Each(timestep, min_length=1), factory=lambda: [100, 300, 500, 700, 900])
    # all_timesteps: every sample at every timestep. one_timestep: held-out sample i at timesteps[i mod len(timesteps)]
    # only, as MLPerf's text_to_image reference evaluates (1/len(timesteps) of the denoiser calls).
    each_sample_at: str = checked("all_timesteps", one_of("all_timesteps", "one_timestep"))
    max_samples: int = checked(64, COUNT)  # the first this many of the split
    seed: int = checked(0, SEED)  # of the fixed noise
    batch_size: int = checked(64, BATCH)  # held-out samples per UNet call


@dataclass
class PreviewConfig:
    # The grid drawn every `preview_interval`: these prompts x these seeds, as `dwb sample` draws them. Its guidance,
    # steps and sampler are also what every checkpoint of the run recommends it is sampled at (the spec's
    # "recommended"), so they are held to what `dwb sample` and the app take: guidance to 30, steps to 150.
    prompts: list[str] = checked(rule=Each(non_empty_text, min_length=1), factory=lambda: [
        "a red circle", "two blue squares", "a white square above a purple triangle"])
    seeds: list[int] = checked(rule=Each(SEED, min_length=1), factory=lambda: [0, 1])
    steps: int = checked(20, Range(1, MAX_STEPS))
    guidance: float = checked(5.0, Range(0, 100))
    sampler: Optional[str] = None  # null: the checkpoint's own (as `dwb sample` without --sampler)
    ema: bool = False  # the EMA weights (`dwb sample --ema`) instead of the raw ones

    def recommended(self) -> dict:
        """What every checkpoint of the run recommends it is sampled at (``models.checkpoints.recommended_settings``):
        the guidance, steps and sampler its previews draw with."""
        return {"guidance": self.guidance, "steps": self.steps, **({"sampler": self.sampler} if self.sampler else {})}


@dataclass
class CostConfig:
    # the dearest cloud GPU rents for about $15 an hour; 10,000 leaves room for any currency's numbers
    usd_per_gpu_hour: Optional[float] = checked(None, Range(0, 10_000, note="null leaves dollars out"))


@dataclass
class TrainConfig:
    run_name: str = "run"
    seed: int = checked(17, SEED)
    model: ModelConfig = field(default_factory=ModelConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    global_train_batch_size: int = checked(2048, BATCH)
    device_train_microbatch_size: Union[int, str] = checked(16, microbatch)  # divides each process's batch
    # A negative threshold flips every clipped gradient (loss 4.92 -> 8.40 at -1); 0 zeroes them
    grad_clip_norm: Optional[float] = checked(1.0, Range(0, 1e6, low_open=True, note="null turns clipping off"))
    # Composer refuses 'dur' here: a run's length is what 'dur' is a fraction of
    max_duration: str = checked("550000ba", Duration(units=("ba", "ep", "sp", "tok")))
    save_folder: str = "runs/{run_name}/checkpoints"
    save_interval: str = checked("10000ba", Duration())  # 0ba saved nothing, silently
    # -1 keeps every checkpoint; 0 keeps none on the local disk (only for a remote save_folder)
    save_num_checkpoints_to_keep: int = checked(-1, Range(-1, MAX_SAMPLES, note="-1 keeps every checkpoint"))
    autoresume: bool = False
    load_path: Optional[str] = None  # phase 2: phase 1's final checkpoint; weights only, fresh optimizer
    load_weights_only: bool = True
    device: str = checked("auto", torch_device)
    # auto (amp_bf16 on GPU, fp32 on CPU) | fp32 | amp_bf16 | amp_fp16
    precision: str = checked("auto", one_of("auto", "fp32", "amp_bf16", "amp_fp16"))
    # The UNet sharded by FSDP through Composer's parallelism config, on GPUs or CPU ranks (docs/scale.md):
    # SHARD_GRAD_OP shards gradients and optimizer state (the weights stay whole between forward and backward),
    # FULL_SHARD the weights too, HYBRID_SHARD shards within a node and replicates across nodes
    # per_rank: Composer's, each rank draws noise, timesteps and caption dropout from its own generator (seeded
    # seed + rank), so the draws of a sample depend on the number of ranks; per_sample: from one generator per
    # sample (seed, epoch, index), the same on any number of ranks, nodes or microbatches, which an elastic
    # resume (4 ranks to 2) needs to end where an uninterrupted run does (docs/scale.md)
    randomness: str = checked("per_rank", one_of("per_rank", "per_sample"))
    fsdp: bool = False
    fsdp_sharding_strategy: str = checked("SHARD_GRAD_OP", one_of("SHARD_GRAD_OP", "FULL_SHARD", "HYBRID_SHARD"))
    # full: each checkpoint one file, the UNet's state gathered on rank 0; sharded: a folder of
    # torch.distributed.checkpoint parts, each rank writing its own shard (no gather; docs/scale.md)
    fsdp_state_dict_type: str = checked("full", one_of("full", "sharded"))
    # Seconds a collective may wait for the other ranks before the run is aborted (Composer's dist_timeout; NCCL's
    # watchdog ends the waiting ranks). The longest such wait is for rank 0 alone writing a full checkpoint while
    # the others go on to the next step's collective: sdxl-base's is 45 GB (its parts, AdamW's two moments, EMA),
    # 450 s at a network disk's 100 MB/s, past Composer's default of 300 s; 1800 s is four times that. Autoresume's
    # check on rank 0 is waited for outside it (docs/scale.md).
    dist_timeout: float = checked(1800.0, Range(10, 86400))

    low_precision_norms: bool = False  # Composer's LowPrecisionGroupNorm + LowPrecisionLayerNorm (GPU)
    # Batches whose loss is NaN or infinite are skipped (no update) and counted; this many in a row abort.
    max_consecutive_nonfinite: int = checked(10, Range(1, MAX_SAMPLES))
    loggers: list = checked(rule=Each(one_of(*LOGGERS)), factory=lambda: ["file"])
    log_interval: str = checked("10ba", Duration())
    progress_bar: bool = True
    # Validation loss on `validation.path` every this many batches (Composer's name); null: none.
    eval_interval: Optional[str] = checked("5000ba", batches)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    # A grid of `previews.prompts` x `previews.seeds` every this many batches (beside the checkpoints); null: none.
    preview_interval: Optional[str] = checked(None, batches)
    previews: PreviewConfig = field(default_factory=PreviewConfig)
    cost: CostConfig = field(default_factory=CostConfig)

    def resolved_save_folder(self) -> str:
        return self.save_folder.replace("{run_name}", self.run_name)


def validate(cfg: TrainConfig) -> TrainConfig:
    """Every key within its field's rule (``check_rules``), then the rules that tie keys together."""
    check_rules(cfg)
    _check_data(cfg.data)
    _check_adapter(cfg)
    _check_batch_split(cfg)
    from models.generation import check_recommended

    # what every checkpoint will recommend: values `dwb sample` and the app take (a sampler by name, steps <= 150)
    check_recommended(cfg.previews.recommended(), "config section 'previews'")
    if cfg.fsdp_state_dict_type == "sharded" and not cfg.fsdp:
        raise WorkbenchError("config key 'fsdp_state_dict_type' is sharded, which needs fsdp=true (without FSDP "
                             "the weights are whole on every rank and a checkpoint is one file)")
    if cfg.fsdp_state_dict_type == "sharded" and "://" in cfg.save_folder:
        raise WorkbenchError(f"config key 'fsdp_state_dict_type' is sharded, whose checkpoints are folders of parts "
                             f"that autoresume and the readers find on a local or shared file system only; give a "
                             f"local save_folder, not {cfg.save_folder}")
    if cfg.save_num_checkpoints_to_keep == 0 and "://" not in cfg.save_folder:
        raise WorkbenchError(f"config key 'save_num_checkpoints_to_keep' is 0, which deletes every checkpoint from "
                             f"the local save_folder {cfg.resolved_save_folder()} as soon as it is written; 0 is for a remote "
                             f"save_folder (s3://...), -1 keeps all")
    return cfg


def _check_adapter(cfg: TrainConfig) -> None:
    """An adapter adapts a model the run starts from (``model.init_from``); its text towers' LoRA trains on captions
    in one process."""
    a = cfg.adapter
    if a.type is None:
        return
    if cfg.model.init_from is None:
        raise WorkbenchError("config key 'adapter.type': an adapter adapts a model you hold; set model.init_from to "
                             "its folder, hub id, single file or checkpoint")
    if a.text_encoders and (a.type != "lora" or cfg.data.precomputed or cfg.fsdp):
        why = ("is LoRA (the kind diffusers' and kohya's readers load on a tower)" if a.type != "lora" else
               "trains on captions, not precomputed text states" if cfg.data.precomputed else
               "trains in one process here (its towers are outside FSDP's units)")
        raise WorkbenchError(f"config key 'adapter.text_encoders': the text towers' adapter {why}")
    if cfg.load_path:
        raise WorkbenchError("config key 'load_path': an adapter run starts from model.init_from and resumes by "
                             "autoresume; leave load_path empty")


def _check_batch_split(cfg: TrainConfig) -> None:
    """The global batch splits evenly over the processes (``composer -n N`` sets WORLD_SIZE before any config
    is read), and each process's batch into whole microbatches: a microbatch larger than the process's batch
    or not dividing it is a global and a per-device size taken for each other."""
    from composer.utils import dist

    world, batch, micro = dist.get_world_size(), cfg.global_train_batch_size, cfg.device_train_microbatch_size
    if batch % world:
        raise WorkbenchError(f"config key 'global_train_batch_size' ({batch}) must divide by the number of "
                             f"processes ({world})")
    if micro != "auto" and (batch // world) % micro:
        raise WorkbenchError(f"config key 'device_train_microbatch_size' ({micro}) must divide each process's batch "
                             f"(global_train_batch_size {batch} over {world} process{'es' if world > 1 else ''}: "
                             f"{batch // world})")


def _check_data(d: DataConfig) -> None:
    d.path = d.path or ""  # `data.path=` on the command line clears it (for data.streams)
    if d.streams and (d.path or d.remote):
        raise WorkbenchError("config keys 'data.streams' and 'data.path'/'data.remote' exclude each other: "
                             "put every dataset in data.streams")
    if not d.streams and not d.path and not d.remote:
        raise WorkbenchError("config key 'data.path' is empty: give an MDS folder (or data.remote, or data.streams)")
    for i, s in enumerate(d.streams):
        key = f"data.streams[{i}]"
        if not s.path and not s.remote:
            raise WorkbenchError(f"config key '{key}' needs a path or a remote")
        given = [k for k in ("proportion", "repeat", "choose") if getattr(s, k) is not None]
        if len(given) > 1:
            raise WorkbenchError(f"config key '{key}' sets {' and '.join(given)}: give at most one of proportion, "
                                 f"repeat, choose")
    if not d.streams:
        return
    with_prop = [s.proportion is not None for s in d.streams]
    absolute = [s.repeat is not None or s.choose is not None for s in d.streams]
    if any(with_prop) and not all(with_prop):
        raise WorkbenchError("config key 'data.streams': give a proportion for every stream or for none")
    if any(with_prop) and any(absolute):
        raise WorkbenchError("config key 'data.streams': proportions cannot be mixed with repeat or choose")
    if all(with_prop):
        total = sum(s.proportion for s in d.streams)
        if abs(total - 1.0) > 1e-3:
            parts = " + ".join(f"{s.proportion:g}" for s in d.streams)
            raise WorkbenchError(f"config key 'data.streams': proportions {parts} sum to {total:g}; they are shares "
                                 f"of each epoch and must sum to 1")


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    """Read a YAML config, apply ``key=value`` overrides and validate every key and type."""
    data = merge_config(read_config_file(path), parse_overrides(list(overrides)))
    return validate(build_config(TrainConfig, data))


def config_to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)
