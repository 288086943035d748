"""Typed training configuration: YAML on disk, ``key=value`` overrides, unknown keys rejected by name.

Top-level keys follow Composer's Trainer argument names where one exists (``max_duration``,
``save_folder``, ``save_interval``, ``device_train_microbatch_size``, ``seed``, ``load_path`` ...).
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from .errors import WorkbenchError, first_line
from .checkpoints import ARCHITECTURES
from .data import StreamConfig

ARCHITECTURE_NAMES = tuple(ARCHITECTURES)  # the architectures a config may name
PREDICTION_TYPES = ("epsilon", "v_prediction")


@dataclass
class ModelConfig:
    architecture: str = "tiny"
    # Folder or hub id with vae/, text_encoder/ and tokenizer/ (a diffusers layout). For `tiny`,
    # `dwb prepare` builds one; for `sd2-base`, stabilityai/stable-diffusion-2-base or a local copy.
    # None builds every component with random weights (benchmarks, shape tests).
    pretrained: Optional[str] = None
    prediction_type: str = "epsilon"
    caption_dropout: float = 0.1
    min_snr_gamma: Optional[float] = None
    # Probability of training a sample under its caption's other phrasing, where the data lists
    # phrasings ("A above B" / "B below A" in the shapes data): teaches that both mean one scene.
    other_phrasing: float = 0.0
    attention: str = "auto"  # auto | sdpa | xformers
    gradient_checkpointing: bool = False
    unet: dict = field(default_factory=dict)  # overrides of the architecture's UNet config


@dataclass
class DataConfig:
    path: Optional[str] = ""  # an MDS folder written by `dwb data shapes`, `convert` or `precompute` (the cache, with `remote`)
    remote: Optional[str] = None
    # Several datasets mixed by proportion or repeat, instead of path/remote (resolution buckets, sources).
    streams: list[StreamConfig] = field(default_factory=list)
    # True: the datasets hold VAE latents and text hidden states from `dwb data precompute`.
    precomputed: bool = False
    resolution: int = 256
    num_workers: int = 0
    shuffle: bool = True
    center_crop: bool = True  # False: random crop
    # Samples Streaming's background threads may prepare ahead of the reader. None: Streaming's
    # default (8 batches) for remote data; for local data the whole epoch, so those threads finish
    # at once instead of stepping in lockstep with every sample (3.2x the read rate measured).
    predownload: Optional[int] = None
    # Streaming shuffles within this many canonical nodes; kept fixed, the global sample order is
    # the same whatever the number of nodes and ranks (elastic determinism). Must divide or be
    # divisible by the number of nodes.
    num_canonical_nodes: int = 1
    shuffle_algo: str = "py1e"


@dataclass
class OptimizerConfig:
    lr: float = 1.0e-4
    weight_decay: float = 0.01
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1.0e-8


SCHEDULERS = ("constant_with_warmup", "linear_with_warmup", "cosine_with_warmup")


@dataclass
class SchedulerConfig:
    # Composer's warm-up schedulers: linear warm-up over t_warmup, then constant (the SD2 recipe), or a
    # linear / cosine decay to alpha_f x lr at max_duration.
    name: str = "constant_with_warmup"
    t_warmup: str = "10000ba"
    alpha_f: float = 0.0


@dataclass
class EMAConfig:
    enabled: bool = False
    smoothing: float = 0.9999
    ema_start: str = "0ba"
    update_interval: str = "1ba"


@dataclass
class TrainConfig:
    run_name: str = "run"
    seed: int = 17
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    global_train_batch_size: int = 2048
    device_train_microbatch_size: Union[int, str] = 16
    grad_clip_norm: Optional[float] = 1.0
    max_duration: str = "550000ba"
    save_folder: str = "runs/{run_name}/checkpoints"
    save_interval: str = "10000ba"
    save_num_checkpoints_to_keep: int = -1
    autoresume: bool = False
    load_path: Optional[str] = None  # phase 2: phase 1's final checkpoint; weights only, fresh optimizer
    load_weights_only: bool = True
    device: str = "auto"  # auto | cpu | gpu
    precision: str = "auto"  # auto (amp_bf16 on GPU, fp32 on CPU) | fp32 | amp_bf16 | amp_fp16
    fsdp: bool = False  # SHARD_GRAD_OP through Composer's parallelism config (GPU)
    low_precision_norms: bool = False  # Composer's LowPrecisionGroupNorm + LowPrecisionLayerNorm (GPU)
    # Batches whose loss is NaN or infinite are skipped (no update) and counted; this many in a row abort.
    max_consecutive_nonfinite: int = 10
    loggers: list = field(default_factory=lambda: ["file"])  # file | tensorboard | wandb
    log_interval: str = "10ba"
    progress_bar: bool = True

    def resolved_save_folder(self) -> str:
        return self.save_folder.replace("{run_name}", self.run_name)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp``; ints are accepted for floats. Raises on mismatch."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            if arg is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(value, arg, key)
            except WorkbenchError as e:
                errors.append(e)
        names = " or ".join(_type_name(a) for a in typing.get_args(tp))
        raise WorkbenchError(f"config key '{key}' must be {names}, got {value!r}")
    if origin is tuple and typing.get_args(tp)[1:] == (Ellipsis,):  # tuple[float, ...]: a YAML list
        if not isinstance(value, (list, tuple)):
            raise WorkbenchError(f"config key '{key}' must be a list, got {value!r}")
        return tuple(_coerce(v, typing.get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value))
    if origin is list and typing.get_args(tp) and dataclasses.is_dataclass(typing.get_args(tp)[0]):
        if not isinstance(value, list):
            raise WorkbenchError(f"config key '{key}' must be a list, got {value!r}")
        return [_coerce(v, typing.get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise WorkbenchError(f"config key '{key}' must be a mapping, got {value!r}")
        return build_config(tp, value, prefix=f"{key}.")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads "1e-4" as a string
            return float(value)
        except ValueError:
            pass
    expected = origin or tp
    if expected is bool and not isinstance(value, bool):
        raise WorkbenchError(f"config key '{key}' must be true or false, got {value!r}")
    if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise WorkbenchError(f"config key '{key}' must be an integer, got {value!r}")
    if not isinstance(value, expected):
        raise WorkbenchError(f"config key '{key}' must be {_type_name(expected)}, got {value!r}")
    return value


def build_config(cls: type, data: dict, prefix: str = "") -> Any:
    """Dataclass ``cls`` from a mapping: every key known, every value of its field's type, every field without
    a default given; each problem a one-line WorkbenchError naming the key."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    names = {f.name for f in fields}
    for key in data:
        if key not in names:
            raise WorkbenchError(f"unknown config key '{prefix}{key}' (known: {', '.join(sorted(names))})")
    for f in fields:
        if f.name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise WorkbenchError(f"config key '{prefix}{f.name}' is required")
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    return cls(**kwargs)


def _set_dotted(data: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise WorkbenchError(f"override '{dotted}': '{part}' is not a mapping")
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> dict:
    """``["a.b=1", "c=[2, 3]"]`` -> ``{"a": {"b": 1}, "c": [2, 3]}``: each value read as YAML, empty as null."""
    out: dict = {}
    for item in overrides:
        if "=" not in item:
            raise WorkbenchError(f"override '{item}' is not of the form key=value")
        key, raw = item.split("=", 1)
        _set_dotted(out, key.strip(), yaml.safe_load(raw) if raw != "" else None)
    return out


def merge_config(base: dict, extra: dict) -> dict:
    """``base`` with ``extra``'s keys on top, nested mappings merged key by key."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge_config(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def validate(cfg: TrainConfig) -> TrainConfig:
    m = cfg.model
    if m.architecture not in ARCHITECTURE_NAMES:
        raise WorkbenchError(f"config key 'model.architecture' must be one of {', '.join(ARCHITECTURE_NAMES)}, got {m.architecture!r}")
    if m.prediction_type not in PREDICTION_TYPES:
        raise WorkbenchError(f"config key 'model.prediction_type' must be one of {', '.join(PREDICTION_TYPES)}, got {m.prediction_type!r}")
    if not 0.0 <= m.caption_dropout < 1.0:
        raise WorkbenchError(f"config key 'model.caption_dropout' must be in [0, 1), got {m.caption_dropout}")
    if m.attention not in ("auto", "sdpa", "xformers"):
        raise WorkbenchError(f"config key 'model.attention' must be auto, sdpa or xformers, got {m.attention!r}")
    if cfg.data.resolution <= 0 or cfg.data.resolution % 8:
        raise WorkbenchError(f"config key 'data.resolution' must be a positive multiple of 8, got {cfg.data.resolution}")
    if cfg.device not in ("auto", "cpu", "gpu"):
        raise WorkbenchError(f"config key 'device' must be auto, cpu or gpu, got {cfg.device!r}")
    if cfg.precision not in ("auto", "fp32", "amp_bf16", "amp_fp16"):
        raise WorkbenchError(f"config key 'precision' must be auto, fp32, amp_bf16 or amp_fp16, got {cfg.precision!r}")
    mb = cfg.device_train_microbatch_size
    if isinstance(mb, str) and mb != "auto":
        raise WorkbenchError(f"config key 'device_train_microbatch_size' must be an integer or 'auto', got {mb!r}")
    _check_data(cfg.data)
    if cfg.max_consecutive_nonfinite < 1:
        raise WorkbenchError(f"config key 'max_consecutive_nonfinite' must be at least 1, got {cfg.max_consecutive_nonfinite}")
    for key in ("max_duration", "save_interval", "log_interval"):
        _check_time(key, getattr(cfg, key))
    _check_time("scheduler.t_warmup", cfg.scheduler.t_warmup)
    if cfg.scheduler.name not in SCHEDULERS:
        raise WorkbenchError(f"config key 'scheduler.name' must be one of {', '.join(SCHEDULERS)}, got {cfg.scheduler.name!r}")
    if not 0.0 <= cfg.scheduler.alpha_f <= 1.0:
        raise WorkbenchError(f"config key 'scheduler.alpha_f' must be between 0 and 1, got {cfg.scheduler.alpha_f}")
    _check_time("ema.ema_start", cfg.ema.ema_start)
    for name in cfg.loggers:
        if name not in ("file", "tensorboard", "wandb"):
            raise WorkbenchError(f"config key 'loggers' has unknown logger {name!r} (file, tensorboard, wandb)")
    return cfg


def _check_data(d: DataConfig) -> None:
    d.path = d.path or ""  # `data.path=` on the command line clears it (for data.streams)
    if d.streams and (d.path or d.remote):
        raise WorkbenchError("config keys 'data.streams' and 'data.path'/'data.remote' exclude each other: "
                             "put every dataset in data.streams")
    if not d.streams and not d.path and not d.remote:
        raise WorkbenchError("config key 'data.path' is empty: give an MDS folder (or data.remote, or data.streams)")
    if d.num_canonical_nodes < 1:
        raise WorkbenchError(f"config key 'data.num_canonical_nodes' must be at least 1, got {d.num_canonical_nodes}")
    if d.shuffle_algo not in ("py1e", "py1br", "py1b", "py1s", "py2s", "naive"):
        raise WorkbenchError(f"config key 'data.shuffle_algo' must be one of py1e, py1br, py1b, py1s, py2s, naive, "
                             f"got {d.shuffle_algo!r}")
    for i, s in enumerate(d.streams):
        key = f"data.streams[{i}]"
        if not s.path and not s.remote:
            raise WorkbenchError(f"config key '{key}' needs a path or a remote")
        given = [k for k in ("proportion", "repeat", "choose") if getattr(s, k) is not None]
        if len(given) > 1:
            raise WorkbenchError(f"config key '{key}' sets {' and '.join(given)}: give at most one of proportion, "
                                 f"repeat, choose")
        for k in given:
            if getattr(s, k) < 0:
                raise WorkbenchError(f"config key '{key}.{k}' must not be negative, got {getattr(s, k)}")
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


def _check_time(key: str, value: str) -> None:
    from composer.core import Time

    try:
        Time.from_timestring(str(value))
    except Exception:
        raise WorkbenchError(f"config key '{key}' must be a Composer time string such as '1000ba' or '1ep', got {value!r}") from None


def read_config_file(path: str | Path | None) -> dict:
    """The mapping a YAML config file holds ({} for no file); a missing or malformed file is a one-line error."""
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise WorkbenchError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise WorkbenchError(f"config file {path} is not valid YAML: {first_line(e)}") from None
    if not isinstance(data, dict):
        raise WorkbenchError(f"config file {path} must hold a mapping at the top level")
    return data


def load_config(path: str | Path | None, overrides: list[str] = ()) -> TrainConfig:
    """Read a YAML config, apply ``key=value`` overrides and validate every key and type."""
    data = merge_config(read_config_file(path), parse_overrides(list(overrides)))
    return validate(build_config(TrainConfig, data))


def config_to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)
