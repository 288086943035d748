"""The shapes captions, both ways, from one definition.

A caption names one group ("two small red circles") or two groups and their relation ("a blue square
left of three green triangles"). A group's phrase is the words of ``GROUP_SLOTS`` in order (the size is
optional, the shape takes a plural "s" above one); a relation joins two phrases. `captions_for` writes a
scene's phrasings from these tables and `parse_caption` builds its pattern from the same tables, so a word
added here is written and read alike.

What a caption asks for (``ATTRIBUTES``) and the kinds of caption (``KINDS``) are named here too: the
scorer is judged, and evaluate's ``attr_<kind>_<attribute>`` columns are named, after them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .scenes import ALL_SHAPES, MAX_COUNT, PALETTE, PLACEMENTS, SIZES

COUNTS = {1: "a", 2: "two", 3: "three"}
assert set(COUNTS) == set(range(1, MAX_COUNT + 1)), "a number word for every count a scene can hold"
# Each relation and its converse: "A above B" is "B below A". A scene's placements are the canonical ones.
RELATIONS = {"above": "below", "below": "above", "left of": "right of", "right of": "left of"}
CANONICAL = PLACEMENTS
# A group's phrase, slot by slot: (attribute, its words by value, whether a caption may leave it out).
GROUP_SLOTS = (("count", COUNTS, False), ("size", {s: s for s in SIZES}, True),
               ("color", {c: c for c in PALETTE}, False), ("shape", {s: s for s in ALL_SHAPES}, False))

ATTRIBUTES = ("color", "shape", "count", "position")  # what a caption asks for ("position": of two groups)
KINDS = ("object", "single", "pair")  # "a red circle" (one shape), one group of any count, two groups


@dataclass(frozen=True)
class Group:
    color: str
    shape: str
    count: int
    size: str | None = None  # None when the caption does not say


@dataclass(frozen=True)
class Scene:
    """A scene in canonical order: ``groups[0]`` is the only group, or the upper / left one."""

    layout: str  # "one group", "above", "left of" (or "empty": nothing drawn, as a scorer may see it)
    groups: tuple[Group, ...]


def describe_group(group: dict, with_size: bool) -> str:
    """One group's phrase: "a red circle", "three small blue squares"."""
    words = [table[group[name]] for name, table, optional in GROUP_SLOTS if with_size or not optional]
    return " ".join(words) + ("s" if group["count"] > 1 else "")


def captions_for(scene: dict, with_size: bool) -> list[str]:
    """Every phrasing of a scene: one for a single group, both directions for two groups."""
    groups = scene["groups"]
    if len(groups) == 1:
        return [describe_group(groups[0], with_size)]
    a, b = (describe_group(g, with_size) for g in groups)
    rel = scene["relation"]
    return [f"{a} {rel} {b}", f"{b} {RELATIONS[rel]} {a}"]


def _group_pattern(i: int) -> str:
    parts = []
    for name, table, optional in GROUP_SLOTS:
        words = "|".join(re.escape(w) for w in table.values())
        parts.append(f"(?:(?P<{name}{i}>{words}) )?" if optional else f"(?P<{name}{i}>{words}) ")
    return "".join(parts)[:-1] + "s?"  # no space after the last word; the plural "s"


_CAPTION = re.compile(rf"^{_group_pattern(0)}(?: (?P<rel>{'|'.join(RELATIONS)}) {_group_pattern(1)})?$")
_VALUES = {name: {w: v for v, w in table.items()} for name, table, _ in GROUP_SLOTS}


def parse_caption(text: str) -> Scene | None:
    """The scene a shapes caption asks for, in canonical order; ``None`` for any other text."""
    m = _CAPTION.match(text.strip().lower())
    if not m:
        return None
    groups = [Group(**{name: _VALUES[name].get(m[f"{name}{i}"]) for name, _, _ in GROUP_SLOTS})
              for i in range(2) if m[f"color{i}"]]
    rel = m["rel"]
    if rel is None:
        return Scene("one group", (groups[0],))
    if rel not in CANONICAL:
        groups.reverse()
    return Scene(rel if rel in CANONICAL else RELATIONS[rel], tuple(groups))


def scene_from_meta(meta: dict) -> Scene | None:
    """A dataset sample's stored attributes as a Scene: ``meta``'s groups (groups[0] takes the top / left half)
    and relation, or, in a dataset converted from a source folder (whose ``meta`` keeps scalars only), its
    ``scene``: the canonical caption with sizes (``dataset.source_fields``). None when it holds neither."""
    if "groups" not in meta:
        return parse_caption(meta["scene"]) if isinstance(meta.get("scene"), str) else None
    groups = tuple(Group(g["color"], g["shape"], int(g["count"]), g["size"]) for g in meta["groups"])
    return Scene(meta["relation"] or "one group", groups)


def kinds_of(scene: Scene) -> tuple[str, ...]:
    """The kinds of caption a scene belongs to: ("pair",), ("single",) or ("single", "object")."""
    if len(scene.groups) > 1:
        return ("pair",)
    return ("single", "object") if scene.groups[0].count == 1 else ("single",)


def asked_attributes(kind: str) -> tuple[str, ...]:
    """The attributes a caption of this kind asks for: position only between two groups."""
    return ATTRIBUTES if kind == "pair" else tuple(a for a in ATTRIBUTES if a != "position")
