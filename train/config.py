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
from typing import Any, Callable, Optional, Union

import yaml

from .errors import WorkbenchError, first_line
from .architectures import ARCHITECTURES

ARCHITECTURE_NAMES = tuple(ARCHITECTURES)  # the architectures a config may name
PREDICTION_TYPES = ("epsilon", "v_prediction")

# ---------------------------------------------------------------------------------------------
# Value rules: each key's allowed values sit on its dataclass field (``checked(default, rule)``) and are
# checked for every key of every section by ``check_rules``, before anything is built or trained. A rule
# takes a value and answers None when it is fine, else what is wrong ("must be > 0, got -1.0"). Values
# outside these ranges ran without a word: grad_clip_norm=-1 trained uphill (loss 4.92 -> 8.40),
# ema.smoothing=2 grew the stored EMA weights to 6.5e4 in 30 batches, save_interval=0ba wrote no checkpoint.

RULE = "rule"  # the key of a field's metadata that holds its rule


def checked(default: Any = dataclasses.MISSING, rule: Callable[[Any], Optional[str]] | None = None, *,
            factory: Any = dataclasses.MISSING):
    """A dataclass field whose values ``rule`` admits (None, where the type allows it, always passes)."""
    return field(default=default, default_factory=factory, metadata={RULE: rule})


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


@dataclass(frozen=True)
class Range:
    """Numbers from ``low`` to ``high`` (None: unbounded), each end included unless it is open; ``note`` says
    what to write instead of a value outside (grad_clip_norm: null turns clipping off)."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""

    def admits(self, x: float) -> bool:
        above = self.low is None or (x > self.low if self.low_open else x >= self.low)
        below = self.high is None or (x < self.high if self.high_open else x <= self.high)
        return above and below and x == x  # NaN is in no range

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {_number(self.low)}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {_number(self.high)}"
        return (f"in {'(' if self.low_open else '['}{_number(self.low)}, {_number(self.high)}"
                f"{')' if self.high_open else ']'}")

    def __call__(self, value: float) -> Optional[str]:
        if self.admits(value):
            return None
        return f"must be {self}{f' ({self.note})' if self.note else ''}, got {value!r}"


POSITIVE = Range(0, low_open=True)
AT_LEAST_ONE = Range(1)
NON_NEGATIVE = Range(0)
PROBABILITY = Range(0, 1)
SEED = Range(0, 2**32 - 1)  # numpy's and Composer's seed range


@dataclass(frozen=True)
class Each:
    """A list of ``length`` values (any length when None), each admitted by ``rule``."""

    rule: Callable[[Any], Optional[str]]
    length: Optional[int] = None

    def __call__(self, values: list) -> Optional[str]:
        if (self.length is not None and len(values) != self.length) or any(self.rule(v) for v in values):
            count = f"{self.length} values" if self.length is not None else "a list of values"
            return f"must be {count}, each {self.rule}, got {list(values)!r}"
        return None


@dataclass(frozen=True)
class OneOf:
    choices: tuple

    def __str__(self) -> str:
        return f"one of {', '.join(map(str, self.choices))}"

    def __call__(self, value: Any) -> Optional[str]:
        return None if value in self.choices else f"must be {self}, got {value!r}"


def one_of(*choices: Any) -> OneOf:
    return OneOf(tuple(choices))


@dataclass(frozen=True)
class Duration:
    """A Composer time string ('1000ba', '2ep'). ``positive``: more than zero, where zero means never (a
    save_interval of 0ba saves nothing); else at least zero (a warm-up of 0ba is none). ``units``: the units
    the key's consumer takes (Composer's EMA updates per batch or epoch only); empty: any."""

    positive: bool = True
    units: tuple[str, ...] = ()

    def __call__(self, value: Any) -> Optional[str]:
        from composer.core import Time, TimeUnit

        example = "'1000ba' or '1ep'" if self.positive else "'0ba' or '1ep'"
        try:
            t = Time.from_timestring(str(value))
        except Exception:  # noqa: BLE001 - Composer raises ValueError or TypeError ('1.5ba')
            return f"must be a Composer time string such as {example}, got {value!r}"
        if self.units and t.unit.value not in self.units:
            return f"must be a Composer time in {', '.join(self.units)}, got {value!r}"
        if t.unit == TimeUnit.DURATION and t.value > 1:
            return f"must be a fraction of the run, at most 1dur, got {value!r}"
        if t.value < 0 or (self.positive and t.value == 0):
            return f"must be a Composer time {'> 0' if self.positive else '>= 0'} such as {example}, got {value!r}"
        return None


def check_rules(cfg: Any, prefix: str = "") -> Any:
    """Every key of a config dataclass (sections and lists of them too) within its field's rule; the first
    one outside is a one-line WorkbenchError naming the key, the value and what is allowed."""
    for f in dataclasses.fields(cfg):
        value, key = getattr(cfg, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            check_rules(value, f"{key}.")
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            for i, item in enumerate(value):
                check_rules(item, f"{key}[{i}].")
        elif f.metadata.get(RULE) is not None and value is not None:
            problem = f.metadata[RULE](value)
            if problem:
                raise WorkbenchError(f"config key '{key}' {problem}")
    return cfg


def multiple_of_8(side: int) -> Optional[str]:
    """Image sides the VAE's 8x downsampling maps to whole latents."""
    return None if side > 0 and side % 8 == 0 else f"must be a positive multiple of 8, got {side}"


def microbatch(size: Union[int, str]) -> Optional[str]:
    return None if size == "auto" or (isinstance(size, int) and size >= 1) else \
        f"must be an integer >= 1 or 'auto', got {size!r}"


SHUFFLE_ALGOS = ("py1e", "py1br", "py1b", "py1s", "py2s", "naive")
LOGGERS = ("file", "tensorboard", "wandb")


@dataclass
class ModelConfig:
    architecture: str = checked("tiny", one_of(*ARCHITECTURE_NAMES))
    # Folder or hub id with vae/, text_encoder/ and tokenizer/ (a diffusers layout). For `tiny`,
    # `dwb prepare` builds one; for `sd2-base`, stabilityai/stable-diffusion-2-base or a local copy.
    # None builds every component with random weights (benchmarks, shape tests).
    pretrained: Optional[str] = None
    prediction_type: str = checked("epsilon", one_of(*PREDICTION_TYPES))
    # 1 would drop every caption: the model would never see one
    caption_dropout: float = checked(0.1, Range(0, 1, high_open=True))
    # <= 0 weighs every timestep's loss by zero or less (training stands still or runs uphill)
    min_snr_gamma: Optional[float] = checked(None, Range(0, low_open=True, note="null turns the weighting off"))
    # Probability of training a sample under its caption's other phrasing, where the data lists
    # phrasings ("A above B" / "B below A" in the shapes data): teaches that both mean one scene.
    other_phrasing: float = checked(0.0, PROBABILITY)
    attention: str = checked("auto", one_of("auto", "sdpa", "xformers"))
    gradient_checkpointing: bool = False
    unet: dict = field(default_factory=dict)  # overrides of the architecture's UNet config


@dataclass
class StreamConfig:
    """One MDS dataset in a mixture (Streaming's ``Stream``): local, or remote with a local cache."""

    path: str = ""  # the local folder, or the cache folder of a remote (empty: a temporary cache)
    remote: Optional[str] = None  # s3://bucket/prefix or any remote Streaming reads
    proportion: Optional[float] = checked(None, NON_NEGATIVE)  # share of each epoch (all streams or none; they sum to 1)
    repeat: Optional[float] = checked(None, NON_NEGATIVE)  # or: how many times each sample is seen per epoch
    choose: Optional[int] = checked(None, NON_NEGATIVE)  # or: how many samples this stream gives per epoch


@dataclass
class DataConfig:
    path: Optional[str] = ""  # an MDS folder written by `dwb data shapes`, `convert` or `precompute` (the cache, with `remote`)
    remote: Optional[str] = None
    # Several datasets mixed by proportion or repeat, instead of path/remote (resolution buckets, sources).
    streams: list[StreamConfig] = field(default_factory=list)
    # True: the datasets hold VAE latents and text hidden states from `dwb data precompute`.
    precomputed: bool = False
    resolution: int = checked(256, multiple_of_8)
    num_workers: int = checked(0, NON_NEGATIVE)  # 0: samples are read in the training process
    shuffle: bool = True
    center_crop: bool = True  # False: random crop
    # Samples Streaming's background threads may prepare ahead of the reader. None: Streaming's
    # default (8 batches) for remote data; for local data the whole epoch, so those threads finish
    # at once instead of stepping in lockstep with every sample (3.2x the read rate measured).
    predownload: Optional[int] = checked(None, NON_NEGATIVE)
    # Streaming shuffles within this many canonical nodes; kept fixed, the global sample order is
    # the same whatever the number of nodes and ranks (elastic determinism). Must divide or be
    # divisible by the number of nodes.
    num_canonical_nodes: int = checked(1, AT_LEAST_ONE)
    shuffle_algo: str = checked("py1e", one_of(*SHUFFLE_ALGOS))


@dataclass
class OptimizerConfig:
    lr: float = checked(1.0e-4, POSITIVE)  # 0 trains nothing; < 0 trains uphill
    weight_decay: float = checked(0.01, NON_NEGATIVE)
    # AdamW's moment decay rates: 1 or more never forgets (or grows without bound)
    betas: list[float] = checked(rule=Each(Range(0, 1, high_open=True), length=2), factory=lambda: [0.9, 0.999])
    eps: float = checked(1.0e-8, POSITIVE)  # 0 divides by zero where a weight's gradient vanishes


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


@dataclass
class TrainConfig:
    run_name: str = "run"
    seed: int = checked(17, SEED)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    ema: EMAConfig = field(default_factory=EMAConfig)
    global_train_batch_size: int = checked(2048, AT_LEAST_ONE)
    device_train_microbatch_size: Union[int, str] = checked(16, microbatch)  # divides each process's batch
    # A negative threshold flips every clipped gradient (loss 4.92 -> 8.40 at -1); 0 zeroes them
    grad_clip_norm: Optional[float] = checked(1.0, Range(0, low_open=True, note="null turns clipping off"))
    # Composer refuses 'dur' here: a run's length is what 'dur' is a fraction of
    max_duration: str = checked("550000ba", Duration(units=("ba", "ep", "sp", "tok")))
    save_folder: str = "runs/{run_name}/checkpoints"
    save_interval: str = checked("10000ba", Duration())  # 0ba saved nothing, silently
    # -1 keeps every checkpoint; 0 keeps none on the local disk (only for a remote save_folder)
    save_num_checkpoints_to_keep: int = checked(-1, Range(-1, note="-1 keeps every checkpoint"))
    autoresume: bool = False
    load_path: Optional[str] = None  # phase 2: phase 1's final checkpoint; weights only, fresh optimizer
    load_weights_only: bool = True
    device: str = checked("auto", one_of("auto", "cpu", "gpu"))
    # auto (amp_bf16 on GPU, fp32 on CPU) | fp32 | amp_bf16 | amp_fp16
    precision: str = checked("auto", one_of("auto", "fp32", "amp_bf16", "amp_fp16"))
    fsdp: bool = False  # SHARD_GRAD_OP through Composer's parallelism config (GPU)
    low_precision_norms: bool = False  # Composer's LowPrecisionGroupNorm + LowPrecisionLayerNorm (GPU)
    # Batches whose loss is NaN or infinite are skipped (no update) and counted; this many in a row abort.
    max_consecutive_nonfinite: int = checked(10, AT_LEAST_ONE)
    loggers: list = checked(rule=Each(one_of(*LOGGERS)), factory=lambda: ["file"])
    log_interval: str = checked("10ba", Duration())
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
    if origin is list and typing.get_args(tp):  # list[float], list[StreamConfig]: each item of its type
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
    """Every key within its field's rule (``check_rules``), then the rules that tie keys together."""
    check_rules(cfg)
    _check_data(cfg.data)
    _check_batch_split(cfg)
    if cfg.save_num_checkpoints_to_keep == 0 and "://" not in cfg.save_folder:
        raise WorkbenchError(f"config key 'save_num_checkpoints_to_keep' is 0, which deletes every checkpoint from "
                             f"the local save_folder {cfg.resolved_save_folder()} as soon as it is written; 0 is for a remote "
                             f"save_folder (s3://...), -1 keeps all")
    return cfg


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
