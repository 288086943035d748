"""Shapes samples: a scene, its caption and its images, a pure function of (seed, split, index), and the prompt sets
of held-out captions drawn by the same function.

`sample_meta` makes every random draw of a sample (scene, frame, layout, phrasing) with no image drawn; `make_sample`
renders its images; the prompt sets (`framed_prompts`, `shapes_prompts`) call `sample_meta` itself, so a caption is the
same wherever it is asked for (training's datasets are written from `make_sample`: ``train/shapes``).
"""
from __future__ import annotations

import numpy as np

from models.errors import WorkbenchError

from .grammar import captions_for
from .scenes import FRAME_OF, NEW_COLORS, NEW_SHAPES, layout, render, sample_scene

# Stream ids keep the train and eval splits disjoint for the same seed.
SPLITS = {"train": 0, "eval": 1}
FRAME_STREAM = 1  # a sample's frame comes from a stream of its own: its scene and a square dataset stay as they were
# A sample holding a new colour or shape (or both) draws from streams of their own: other scenes than the dataset's
# at the same (seed, split, index).
CONCEPT_STREAMS = {"color": 2, "shape": 3}


def sample_frame(seed: int, split: str, index: int, relation: str | None, wide: float) -> str:
    """The sample's frame: with probability ``wide`` the one its relation takes (``FRAME_OF``; one group: wide or
    tall alike), else square."""
    if wide <= 0:
        return "square"
    rng = np.random.default_rng([seed, SPLITS[split], index, FRAME_STREAM])
    if rng.random() >= wide:
        return "square"
    return FRAME_OF[relation] if relation else ("wide", "tall")[int(rng.integers(2))]


def new_concept(new_color: str | None = None, new_shape: str | None = None) -> dict[str, str]:
    """The new attributes a sample is asked to hold, by attribute ({"color": "cyan"}, {"shape": "star"}, both or
    none), each one of the domain's (``NEW_COLORS``, ``NEW_SHAPES``)."""
    concept = {}
    for attribute, value, known, word in (("color", new_color, NEW_COLORS, "colour"),
                                          ("shape", new_shape, NEW_SHAPES, "shape")):
        if value is not None and value not in known:
            raise WorkbenchError(f"{value!r} is not a new {word} of the shapes domain: {', '.join(known)}")
        if value is not None:
            concept[attribute] = value
    return concept


def sample_meta(seed: int, split: str, index: int, wide: float = 0.0, new_color: str | None = None,
                new_shape: str | None = None) -> tuple[str, dict]:
    """A sample's caption and its stored attributes (``meta``: groups, relation, boxes, every phrasing,
    with_size, and ``frame`` where it is not square), with no image drawn. ``new_color`` (one of ``NEW_COLORS``)
    and ``new_shape`` (one of ``NEW_SHAPES``): a scene of a stream of its own with one of its groups, drawn at
    random, in that colour and of that shape (the other group keeps a drawn colour and shape)."""
    concept = new_concept(new_color, new_shape)
    rng = np.random.default_rng([seed, SPLITS[split], index, *(CONCEPT_STREAMS[a] for a in concept)])
    scene = sample_scene(rng)
    if concept:
        scene["groups"][int(rng.integers(len(scene["groups"])))].update(concept)
    frame = sample_frame(seed, split, index, scene["relation"], wide)
    boxes = layout(scene, rng, frame)
    with_size = bool(rng.random() < 0.5)
    phrasings = captions_for(scene, with_size)
    caption = phrasings[rng.integers(len(phrasings))]
    meta = {**scene, "boxes": boxes, "captions": phrasings, "with_size": with_size}
    return caption, meta if frame == "square" else {**meta, "frame": frame}


def framed_prompts(n: int, seed: int = 0, wide: float = 0.0) -> list[tuple[str, str, str]]:
    """The captions of the first ``n`` held-out samples, their category ("one group" or "two groups") and their
    frame ("square", "wide", "tall"; ``wide``: the dataset's share of wide and tall scenes)."""
    prompts = []
    for i in range(n):
        caption, meta = sample_meta(seed, "eval", i, wide)
        prompts.append((caption, "two groups" if meta["relation"] else "one group", meta.get("frame", "square")))
    return prompts


def make_sample(seed: int, split: str, index: int, sizes: tuple[int, ...], wide: float = 0.0,
                new_color: str | None = None, new_shape: str | None = None) -> dict:
    """One sample: images per size (the frame's shorter side), caption and attributes (``new_color``,
    ``new_shape``: as `sample_meta` draws them)."""
    caption, meta = sample_meta(seed, split, index, wide, new_color, new_shape)
    scene = {"groups": meta["groups"], "relation": meta["relation"]}
    frame = meta.get("frame", "square")
    return {"images": {s: render(scene, meta["boxes"], s, frame) for s in sizes}, "caption": caption, "meta": meta}


def shapes_prompts(n: int, seed: int = 0, wide: float = 0.0) -> list[tuple[str, str]]:
    """The captions of the first ``n`` held-out samples and their category ("one group" or "two groups")."""
    return [(caption, category) for caption, category, _ in framed_prompts(n, seed, wide)]
