"""What a part's config may ask for, held before any class is built from it, and what it then builds.

A config from elsewhere (a diffusers folder's ``config.json``, a checkpoint's spec, a single file's parts folder)
builds whatever it says: an MMDiT of 10^9 blocks took 108 s and 3 GiB to build without a single weight, one of -1
blocks drew an image from no blocks at all. Every number that sizes a part (``Part.sizes``: its layers, widths,
heads, sample size) is held to a whole number from 1 to ``SIZE_FACTOR`` times the largest any family's published part
of its class gives it, and a list of them (one per level) to as many levels as the longest published list of that
class. What a held config builds is then counted on the meta device (``built_on_meta``), nothing allocated, for the
door to set against the weights there are (``models.checkpoints.memory``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..common import shown
from ..errors import CheckpointError, first_line
from .family import SIZE_FACTOR, Part
from .full_size import build_on_meta
from .registry import FAMILIES


@dataclass(frozen=True)
class SizeLimits:
    """What a config of one class may say: each size key's largest value (None for a list of block names, whose
    length alone is held), the most levels one of its lists may hold, and the keys published as lists."""

    library: str
    largest: dict
    levels: int
    listed: frozenset = frozenset()


def _numbers(value, depth: int = 2) -> list:
    """A size's numbers: itself, or a list's, and its lists' (per-level lists of per-layer counts); a list nested
    deeper stays a list, which no size is."""
    if not isinstance(value, (list, tuple)) or not depth:
        return [value]
    return [n for item in value for n in _numbers(item, depth - 1)]


@functools.cache
def size_limits() -> dict[str, SizeLimits]:
    """Per class any family builds (``CLIPTextModel``, ``UNet2DConditionModel``...), from its published parts."""
    largest: dict[str, dict] = {}
    levels: dict[str, int] = {}
    listed: dict[str, set] = {}
    libraries: dict[str, str] = {}
    for part in (p for f in FAMILIES for v in f.variants for p in v.parts.values()):
        libraries[part.cls] = part.library
        keys = largest.setdefault(part.cls, {})
        for key in part.sizes:
            value = part.config.get(key)
            if isinstance(value, (list, tuple)):
                levels[part.cls] = max(levels.get(part.cls, 0), len(value))
                listed.setdefault(part.cls, set()).add(key)
            numbers = [n for n in _numbers(value) if isinstance(n, int) and not isinstance(n, bool)]
            if numbers or isinstance(value, (list, tuple)):  # block names alone: None
                keys[key] = max([keys.get(key) or 0, *numbers]) or None
    return {cls: SizeLimits(libraries[cls], keys, levels.get(cls, 0), frozenset(listed.get(cls, ())))
            for cls, keys in largest.items()}


def size_problem(value, largest: int | None, levels: int, listed: bool = False) -> str | None:
    """What keeps ``value`` from being a held size of a key whose published largest is ``largest`` (None: block
    names), in lists of up to ``levels`` (``listed``: as published), or None where nothing does."""
    if largest is None:  # block names: their number alone is a size (anything else, the class refuses)
        named = isinstance(value, (list, tuple))
        return f"must list from 1 to {levels} levels" if named and not 1 <= len(value) <= levels else None
    whole = f"must be a whole number from 1 to {SIZE_FACTOR * largest}" + (
        f" (or a list of up to {levels} of them)" if listed else "")
    if isinstance(value, (list, tuple)) and not 1 <= len(value) <= levels:
        return whole
    if any(isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= SIZE_FACTOR * largest
           for n in _numbers(value)):
        return whole
    return None


def check_part_config(cls: str, config, where: str) -> SizeLimits:
    """A one-line CheckpointError naming ``where`` (the config's file) and the key unless ``config`` is a config of a
    class the families build whose every size is held; the class's limits otherwise."""
    limits = size_limits().get(cls)
    if limits is None:
        raise CheckpointError(f"{where}: a {cls}; the workbench builds {', '.join(sorted(size_limits()))}")
    if not isinstance(config, dict):
        raise CheckpointError(f"{where} is no config (a JSON object) of a {cls}, got {type(config).__name__}")
    for key, largest in limits.largest.items():
        problem = None if config.get(key) is None else size_problem(config[key], largest, limits.levels,
                                                                     key in limits.listed)
        if problem:
            raise CheckpointError(f"{where}: {key} {problem}, got {shown(config[key])}")
    return limits


def built_on_meta(cls: str, config, where: str) -> tuple[int, int]:
    """(parameters, buffer values) of the ``cls`` that ``config`` builds, held (``check_part_config``) and built on
    the meta device: nothing is allocated. A config its class refuses is one line naming ``where``."""
    limits = check_part_config(cls, config, where)
    try:
        model = build_on_meta(Part(limits.library, cls, config))
    except Exception as e:  # noqa: BLE001 - a config from elsewhere: the class's own check of it
        raise CheckpointError(f"{where} does not build a {cls} ({first_line(e)})") from None
    return sum(p.numel() for p in model.parameters()), sum(b.numel() for b in model.buffers())
