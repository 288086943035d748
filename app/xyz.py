"""The X/Y/Z plot's plan, without Gradio: axes, the cells they make, and the batches those are generated in.

Up to three axes, each over one setting: checkpoint, guidance, steps, sampler, seed, prompt, denoising strength
(of the Generate tab's mode: its init image, or its hires fix) or LoRA (a ``<lora:NAME:STRENGTH>`` tag of the prompt:
its strength, or which file, such as a run's adapter checkpoints).
Every other setting comes from the base request. A cell is one image; one grid is drawn per Z value (``app.grid``).

**Order.** Checkpoint is always the outer loop (each is loaded once, whatever the axes' order); within a
checkpoint, cells that share every setting of a pipeline call (weights, steps, sampler, guidance, size,
negative prompt) go into calls of up to ``batch_size`` cells, prompts and seeds varying inside a call.
**Equality.** A cell's noise comes from its own seed (``models.generation``), so a cell equals the image a
single generation makes with its settings: bit for bit with ``batch_size`` 1, and up to float rounding in
batched kernels otherwise (measured: at most 1 level of 255, in under 1% of values; tests/app/test_xyz.py).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from models.errors import WorkbenchError
from models.generation import check_sampler, check_strength, lora_tags, with_lora

from .generate import (MAX_SEED, GenerationParams, Limits, check_pixel_steps, checkpoint_name, pixel_steps, shown, text,
                       validate, whole_number)
from .modes import with_strength

AXES = ("checkpoint", "guidance", "steps", "sampler", "seed", "prompt", "strength", "lora")
NONE = "none"
WEIGHTS_SUFFIXES = ("(ema)", "(raw)")  # "label (raw)": one checkpoint's raw weights


@dataclass(frozen=True)
class Axis:
    kind: str  # one of AXES, or NONE
    values: tuple  # checkpoint: (label, weights or None); guidance: float; steps, seed: int; sampler, prompt: str
    labels: tuple[str, ...]  # how the grid names each value

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class Cell:
    position: tuple[int, int, int]  # (x, y, z) indices
    checkpoint: str  # as typed or listed (a label, a path, a hub id)
    weights: str  # "ema" or "raw"
    params: GenerationParams  # validated; batch size 1, its own seed

    def call_key(self) -> tuple:
        """Cells with the same key can share one pipeline call."""
        p = self.params
        return (self.checkpoint, self.weights, p.steps, p.sampler, p.guidance, p.width, p.height, p.negative_prompt,
                None if p.init is None else p.init.strength, p.hires,
                tuple((t.name, t.strength) for t in lora_tags(p.prompt)[1]))  # a set of LoRAs is a pipeline


@dataclass(frozen=True)
class Plan:
    axes: tuple[Axis, Axis, Axis]  # x, y, z
    cells: list[Cell]  # z, then y, then x

    def pixel_steps(self) -> int:
        """What the plot costs: the sum of its cells' (``app.generate.pixel_steps``)."""
        return sum(pixel_steps(c.params) for c in self.cells)

    def batches(self, batch_size: int) -> list[list[Cell]]:
        """The pipeline calls: checkpoint by checkpoint (first appearance), then by call settings, each call
        at most ``batch_size`` cells."""
        order: dict[tuple[str, str], int] = {}
        for cell in self.cells:
            order.setdefault((cell.checkpoint, cell.weights), len(order))
        groups: dict[tuple, list[Cell]] = {}
        for cell in sorted(self.cells, key=lambda c: order[(c.checkpoint, c.weights)]):  # stable: plot order within
            groups.setdefault(cell.call_key(), []).append(cell)
        return [group[i:i + batch_size] for group in groups.values() for i in range(0, len(group), batch_size)]


def _items(name: str, values: str, by_line: bool) -> list[str]:
    """An axis's values: one per line; numbers and samplers may also be separated by commas."""
    lines = [line.strip() for line in values.splitlines() if line.strip()]
    if not by_line:
        lines = [item.strip() for line in lines for item in line.split(",") if item.strip()]
    if not lines:
        raise WorkbenchError(f"{name}: give at least one value")
    return lines


def parse_axis(name: str, kind, values, limits: Limits, weights: str = "ema") -> Axis:
    """One axis from its kind and its values' text; ``name`` ("X axis") starts every message."""
    kind = text(f"{name} type", kind, 20).strip().lower() or NONE
    if kind == NONE:
        return Axis(NONE, (None,), ("",))
    if kind not in AXES:
        raise WorkbenchError(f"{name}: unknown type {shown(kind)}; choose one of: {', '.join(AXES)}")
    items = _items(name, text(f"{name} values", values, limits.max_cells * (limits.max_prompt_chars + 1)),
                   by_line=kind in ("checkpoint", "prompt"))
    if len(items) > limits.max_cells:
        raise WorkbenchError(f"{name}: {len(items)} values; a plot has at most {limits.max_cells} cells")
    parsed = [_value(f"{name} ({kind})", kind, item, limits, weights) for item in items]
    return Axis(kind, tuple(parsed), tuple(_label(kind, v) for v in parsed))


def _value(name: str, kind: str, item: str, limits: Limits, weights: str):
    if kind == "checkpoint":
        return _with_weights(checkpoint_name(item))
    if kind == "guidance":
        try:
            value = float(item)
        except ValueError:
            raise WorkbenchError(f"{name}: not a number: {shown(item)}") from None
        if not 0 <= value <= limits.max_guidance:
            raise WorkbenchError(f"{name}: guidance scale must be between 0 and {limits.max_guidance:g}, got {item}")
        return value
    if kind == "steps":
        return whole_number(f"{name}: steps", item, 1, limits.max_steps)
    if kind == "seed":
        return whole_number(f"{name}: seed", item, 0, MAX_SEED)
    if kind == "sampler":
        check_sampler(item)
        return item
    if kind == "strength":
        try:
            return check_strength(item)
        except WorkbenchError as e:
            raise WorkbenchError(f"{name}: {e}") from None
    if kind == "lora":
        return lora_value(name, item)
    return text(f"{name}: prompt", item, limits.max_prompt_chars)


def _with_weights(item: str) -> tuple[str, str | None]:
    """``label (raw)`` as (label, "raw"), any other name as (name, None); read in one pass (a pattern for the same
    backtracked over long runs of spaces: 2.3 s on a name of 40,000)."""
    body = item.rstrip()
    suffix, label = body[-5:].lower(), body[:-5]
    if suffix in WEIGHTS_SUFFIXES and label != label.rstrip():
        return label.rstrip(), suffix[1:-1]
    return item, None


def lora_value(name: str, item: str) -> tuple[str | None, float | None]:
    """A LoRA axis's value: ``STRENGTH`` (of the prompt's one LoRA tag), ``NAME`` (that LoRA in its place) or
    ``NAME:STRENGTH``, as (name or None, strength or None)."""
    head, sep, tail = item.rpartition(":")
    number = tail if sep else item
    try:
        strength = float(number)
    except ValueError:
        strength = None
    if strength is not None and not math.isfinite(strength):
        raise WorkbenchError(f"{name}: not a finite strength: {shown(item)}")
    if strength is None:
        head = item
    elif not sep:
        head = None
    if head is not None and (not head.strip() or "<" in head or ">" in head):
        raise WorkbenchError(f"{name}: give STRENGTH, NAME or NAME:STRENGTH, got {shown(item)}")
    return (None if head is None else head.strip()), strength


def _label(kind: str, value) -> str:
    if kind == "checkpoint":
        label, weights = value
        return f"{label} ({weights})" if weights else label
    if kind == "lora":
        name, strength = value
        return " ".join(p for p in (name or "LoRA", "" if strength is None else f"{strength:g}") if p)
    return {"guidance": lambda: f"CFG {value:g}", "steps": lambda: f"{value} steps",
            "seed": lambda: f"seed {value}", "strength": lambda: f"strength {value:g}"}.get(kind, lambda: str(value))()


def plan(checkpoint: str, weights: str, base: GenerationParams, axes: tuple[Axis, Axis, Axis],
         limits: Limits) -> Plan:
    """Every cell of the plot, settings checked; one-line WorkbenchError for a plot that cannot be made."""
    kinds = [a.kind for a in axes if a.kind != NONE]
    if len(set(kinds)) < len(kinds):
        raise WorkbenchError("two axes take the same setting: give each axis a different type")
    n = len(axes[0]) * len(axes[1]) * len(axes[2])
    if n > limits.max_cells:
        raise WorkbenchError(f"the plot has {n} cells; at most {limits.max_cells} are allowed")
    base = validate(replace(base, batch_size=1), limits, need_prompt="prompt" not in kinds)
    cells = []
    for z, y, x in itertools.product(*(range(len(a)) for a in reversed(axes))):
        changes, ckpt, chosen = {}, checkpoint, weights
        for axis, i in zip(axes, (x, y, z)):
            if axis.kind == "checkpoint":
                ckpt, chosen = axis.values[i][0], axis.values[i][1] or weights
            elif axis.kind != NONE:
                changes[axis.kind] = axis.values[i]  # the axis kinds are GenerationParams' field names
        strength, lora = changes.pop("strength", None), changes.pop("lora", None)
        params = replace(base, **changes)
        if lora is not None:
            try:
                params = replace(params, prompt=with_lora(params.prompt, *lora))
            except WorkbenchError as e:
                raise WorkbenchError(f"LoRA axis: {e}") from None
        cells.append(Cell((x, y, z), ckpt, chosen, params if strength is None else with_strength(params, strength)))
    if "checkpoint" not in kinds and not (isinstance(checkpoint, str) and checkpoint.strip()):
        raise WorkbenchError("no checkpoint chosen: pick one, or put checkpoints on an axis")
    made = Plan(tuple(axes), cells)
    check_pixel_steps(made.pixel_steps(), limits)
    return made
