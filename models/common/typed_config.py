"""Typed configs: YAML files and ``key=value`` overrides read into dataclasses, every key known, every value
of its field's type and within its field's rule; each problem a one-line error naming the key.

One machinery for every stage's config (training's ``train.config``, evaluate's ``evaluate.config``).
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import yaml

from ..errors import WorkbenchError, first_line

# ---------------------------------------------------------------------------------------------
# Value rules: each key's allowed values sit on its dataclass field (``checked(default, rule)``) and are
# checked for every key of every section by ``check_rules``, before anything is built or trained. A rule
# takes a value and answers None when it is fine, else what is wrong ("must be > 0, got -1.0"). Values
# outside these ranges ran without a word: grad_clip_norm=-1 trained uphill (loss 4.92 -> 8.40),
# ema.smoothing=2 grew the stored EMA weights to 6.5e4 in 30 batches, save_interval=0ba wrote no checkpoint.
# No range admits infinity or NaN (weight_decay=.inf exited 0 with 58% of the weights non-finite), and every
# numeric key has an upper end: a batch of 1e12 hung while its first batch was gathered.

RULE = "rule"  # the key of a field's metadata that holds its rule


def checked(default: Any = dataclasses.MISSING, rule: Callable[[Any], Optional[str]] | None = None, *,
            factory: Any = dataclasses.MISSING):
    """A dataclass field whose values ``rule`` admits (None, where the type allows it, always passes)."""
    return field(default=default, default_factory=factory, metadata={RULE: rule})


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


SHOWN_CHARS = 120  # a value longer than this is shown by its ends and length: a 5,000-digit seed was echoed whole


def shown(value: Any) -> str:
    """``value`` as a message shows it (its repr), a long one by its ends and length; an int past Python's
    4,300-digit conversion limit by its number of digits (its repr would raise)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * SHOWN_CHARS:
        return f"a number of about {int(value.bit_length() * math.log10(2)) + 1:,} digits"
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:80]}...{text[-24:]} ({len(text):,} characters)"


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
        return above and below and math.isfinite(x)  # NaN and infinity are in no range

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
        return f"must be {self}{f' ({self.note})' if self.note else ''}, got {shown(value)}"


POSITIVE = Range(0, low_open=True)
AT_LEAST_ONE = Range(1)
NON_NEGATIVE = Range(0)
PROBABILITY = Range(0, 1)
SEED = Range(0, 2**32 - 1)  # numpy's and Composer's seed range


@dataclass(frozen=True)
class Each:
    """A list of ``length`` values (any length when None, at least ``min_length``), each admitted by ``rule``."""

    rule: Callable[[Any], Optional[str]]
    length: Optional[int] = None
    min_length: int = 0

    def __call__(self, values: list) -> Optional[str]:
        wrong_length = len(values) != self.length if self.length is not None else len(values) < self.min_length
        if wrong_length or any(self.rule(v) for v in values):
            count = (f"{self.length} values" if self.length is not None else
                     f"a list of at least {self.min_length} value{'s' * (self.min_length > 1)}" if self.min_length
                     else "a list of values")
            return f"must be {count}, each {self.rule}, got {shown(list(values))}"
        return None


@dataclass(frozen=True)
class OneOf:
    choices: tuple

    def __str__(self) -> str:
        return f"one of {', '.join(map(str, self.choices))}"

    def __call__(self, value: Any) -> Optional[str]:
        return None if value in self.choices else f"must be {self}, got {shown(value)}"


def one_of(*choices: Any) -> OneOf:
    return OneOf(tuple(choices))


# The longest time a Duration counts, per unit. No run reaches 10^10 batches (at 100 batches a second, 3 years);
# an epoch is at least a batch; a batch is at most about a million samples (train.config.MAX_BATCH, 2^20), so
# samples and tokens reach 10^16. max_duration=99999999999999999999999ba was taken (a run that never ends), and
# scheduler.t_warmup=1e23ba trained at a learning rate of about 0 and exited 0.
MAX_TIME = {"ba": 10**10, "ep": 10**10, "sp": 10**16, "tok": 10**16}
MAX_TIME_TEXT = "10000000000ba or ep, 10^16 sp or tok"


@dataclass(frozen=True)
class Duration:
    """A Composer time string ('1000ba', '2ep'). ``positive``: more than zero, where zero means never (a
    save_interval of 0ba saves nothing); else at least zero (a warm-up of 0ba is none). ``units``: the units
    the key's consumer takes (Composer's EMA updates per batch or epoch only); empty: any. At most
    ``MAX_TIME`` of its unit, or 1dur."""

    positive: bool = True
    units: tuple[str, ...] = ()

    def __call__(self, value: Any) -> Optional[str]:
        from composer.core import Time, TimeUnit

        example = "'1000ba' or '1ep'" if self.positive else "'0ba' or '1ep'"
        text = str(value).strip()
        if len(text) > SHOWN_CHARS and text[:1].isdigit():  # Composer's int() raised past 4,300 digits
            return f"must be a Composer time of at most {MAX_TIME_TEXT}, got {shown(value)}"
        try:
            t = Time.from_timestring(text)
        except Exception:  # noqa: BLE001 - Composer raises ValueError or TypeError ('1.5ba')
            return f"must be a Composer time string such as {example}, got {shown(value)}"
        if self.units and t.unit.value not in self.units:
            return f"must be a Composer time in {', '.join(self.units)}, got {shown(value)}"
        if t.unit == TimeUnit.DURATION and t.value > 1:
            return f"must be a fraction of the run, at most 1dur, got {shown(value)}"
        if t.value < 0 or (self.positive and t.value == 0):
            return f"must be a Composer time {'> 0' if self.positive else '>= 0'} such as {example}, got {value!r}"
        if t.unit.value in MAX_TIME and t.value > MAX_TIME[t.unit.value]:
            return (f"must be at most {MAX_TIME[t.unit.value]}{t.unit.value} (no run reaches more), "
                    f"got {shown(value)}")
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
        raise WorkbenchError(f"config key '{key}' must be {names}, got {shown(value)}")
    if origin is tuple and typing.get_args(tp)[1:] == (Ellipsis,):  # tuple[float, ...]: a YAML list
        if not isinstance(value, (list, tuple)):
            raise WorkbenchError(f"config key '{key}' must be a list, got {shown(value)}")
        return tuple(_coerce(v, typing.get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value))
    if origin is list and typing.get_args(tp):  # list[float], list[StreamConfig]: each item of its type
        if not isinstance(value, list):
            raise WorkbenchError(f"config key '{key}' must be a list, got {shown(value)}")
        return [_coerce(v, typing.get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise WorkbenchError(f"config key '{key}' must be a mapping, got {shown(value)}")
        return build_config(tp, value, prefix=f"{key}.")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > 10**300:  # float() raised OverflowError past 1.8e308; no float key's range comes near
            raise WorkbenchError(f"config key '{key}' must be a number of at most 300 digits, got {shown(value)}")
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads "1e-4" as a string
            return float(value)
        except ValueError:
            pass
    expected = origin or tp
    if expected is bool and not isinstance(value, bool):
        raise WorkbenchError(f"config key '{key}' must be true or false, got {shown(value)}")
    if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise WorkbenchError(f"config key '{key}' must be an integer, got {shown(value)}")
    if not isinstance(value, expected):
        raise WorkbenchError(f"config key '{key}' must be {_type_name(expected)}, got {shown(value)}")
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
        _set_dotted(out, key.strip(), _yaml_value(raw, "override", key.strip()) if raw != "" else None)
    return out


def _yaml_value(text: str, what: str, key: str = "") -> Any:
    """``text`` (the value of ``key``, or a whole file) read as YAML; a one-line WorkbenchError starting with
    ``what`` where it does not read. YAML's constructors raised Python's own ValueError on a number past 4,300
    digits (int()'s limit) and on a date that does not exist (2024-13-45)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise WorkbenchError(f"{what}{f' {key!r}' if key else ''} is not valid YAML: {first_line(e)}") from None
    except ValueError:
        inner, value = _unmade_value(text)
        full = key + ("." if key and inner and not inner.startswith("[") else "") + inner
        digits = sum(c.isdigit() for c in value)
        problem = (f"a number of {digits:,} digits, past Python's limit of 4,300" if digits > 4300 else
                   f"{shown(value)}, which YAML reads as a date or number that cannot be (quote it for text)")
        raise WorkbenchError(f"{what}{f' key {full!r}' if full else ''} holds {problem}") from None


def _unmade_value(text: str) -> tuple[str, str]:
    """(the dotted key, the text) of the first value of ``text`` (YAML) whose value cannot be made, found in YAML's
    node tree, which holds every value as text: each is made alone. ("", "") where none is found."""
    loader = yaml.SafeLoader(text)
    try:
        stack = [(loader.get_single_node(), "")]
        while stack:
            node, key = stack.pop()
            if isinstance(node, yaml.MappingNode):
                stack.extend((v, f"{key}.{k.value}" if key else str(k.value)) for k, v in reversed(node.value))
            elif isinstance(node, yaml.SequenceNode):
                stack.extend((v, f"{key}[{i}]") for i, v in reversed(list(enumerate(node.value))))
            elif isinstance(node, yaml.ScalarNode):
                try:
                    loader.construct_object(node)
                except ValueError:
                    return key, str(node.value)
    finally:
        loader.dispose()
    return "", ""


def merge_config(base: dict, extra: dict) -> dict:
    """``base`` with ``extra``'s keys on top, nested mappings merged key by key."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge_config(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_config_file(path: str | Path | None) -> dict:
    """The mapping a YAML config file holds ({} for no file); a missing or malformed file is a one-line error."""
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise WorkbenchError(f"config file not found: {path}")
    data = _yaml_value(path.read_text(), f"config file {path}") or {}
    if not isinstance(data, dict):
        raise WorkbenchError(f"config file {path} must hold a mapping at the top level")
    return data
