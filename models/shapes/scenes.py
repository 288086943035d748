"""Shapes scenes: what a scene holds, how one is drawn at random, laid out and rendered.

A scene is one or two groups of identical shapes (colour, shape, count, size) and, for two groups, how
they are placed. Every image is drawn at 4x its size and downsampled with a box filter, so the 16-px and
32-px buckets of one sample show the same scene.

A scene is drawn in a frame (``FRAMES``): square, or wide (5:3) or tall (3:5), where a shape's size is a
fraction of the frame's shorter side and `regions` gives each group its part of the frame. Boxes are
fractions of the frame's width and height, whatever its shape.
"""
from __future__ import annotations

import math

import numpy as np
from PIL import Image, ImageDraw

COLORS = {
    "red": (220, 45, 45),
    "green": (45, 175, 70),
    "blue": (50, 90, 235),
    "yellow": (240, 215, 45),
    "purple": (155, 70, 205),
    "white": (240, 240, 240),
}
# Colours the captions and the renderer know but `sample_scene` never draws: the shapes data holds none of them, so
# each is a concept a model trained on it has never seen, to be taught from a few images (bench/adapter_concept.py).
# Append only: a scorer's colour head of n classes reads the first n colours of PALETTE (models/shapes/scorer.py).
NEW_COLORS = {"tangerine": (245, 140, 30), "cyan": (40, 205, 215)}
PALETTE = {**COLORS, **NEW_COLORS}  # every colour `render` draws: the drawn ones first, then the new ones
SHAPES = ("circle", "square", "triangle")
# Shapes the captions and the renderer know but `sample_scene` never draws, as ``NEW_COLORS`` are colours: a concept
# drawn in the data's own colours, which the demo's VAE was trained on (its 8x8 latents blur a star's points all the
# same: BENCHMARKS.md, "Teaching the demo's model a new shape or colour"). Append only, as ``NEW_COLORS``.
NEW_SHAPES = ("star",)
ALL_SHAPES = (*SHAPES, *NEW_SHAPES)  # every shape `render` draws: the drawn ones first, then the new ones
STAR_INNER = 0.5  # a star's inner radius over its outer one: chunky points, for 32 px
SIZES = {"small": 0.17, "large": 0.27}  # side of a shape as a fraction of the frame's shorter side
MAX_COUNT = 3  # shapes in a group: 1 to 3
PLACEMENTS = ("above", "left of")  # how two groups are placed: the first takes the top / left half
BACKGROUND = (30, 30, 34)
SUPERSAMPLE = 4
MARGIN = 0.04  # between the groups and from the frame's edges, as a fraction of the frame's shorter side
# Frames (width, height). 5:3 is the widest bucket of each default bucket set (320x192 at 256 px, 640x384 at 512,
# 40x24 at 32 on a step of 8), so `dwb data convert --aspect-buckets` resizes a wide scene into it whole.
FRAMES = {"square": (1, 1), "wide": (5, 3), "tall": (3, 5)}
# The frame of a non-square scene: side-by-side groups wide, groups one above the other tall (one group: either).
FRAME_OF = {"left of": "wide", "above": "tall"}


def sample_scene(rng: np.random.Generator) -> dict:
    """Draw a scene's attributes: one group (half the scenes) or two groups and their relation."""
    n_groups = 1 if rng.random() < 0.5 else 2
    groups = []
    for _ in range(n_groups):
        groups.append({
            "shape": SHAPES[rng.integers(len(SHAPES))],
            "color": list(COLORS)[rng.integers(len(COLORS))],
            "count": int(rng.integers(1, MAX_COUNT + 1)),
            "size": list(SIZES)[rng.integers(len(SIZES))],
        })
    if n_groups == 2 and (groups[0]["shape"], groups[0]["color"]) == (groups[1]["shape"], groups[1]["color"]):
        groups[1]["color"] = list(COLORS)[(list(COLORS).index(groups[0]["color"]) + 1) % len(COLORS)]
    relation = PLACEMENTS[rng.integers(2)] if n_groups == 2 else None
    return {"groups": groups, "relation": relation}


def _layout_group(rng: np.random.Generator, group: dict, region: tuple[float, float, float, float]) -> list[list[float]]:
    """Place ``count`` non-overlapping shapes inside ``region`` (x0, y0, x1, y1 in units of the frame's shorter
    side); boxes out, in the same units."""
    side, n, gap = SIZES[group["size"]], group["count"], 0.02
    x0, y0, x1, y1 = region
    boxes: list[list[float]] = []
    for _attempt in range(100 * n):
        if len(boxes) == n:
            return boxes
        x = x0 + rng.random() * max(x1 - x0 - side, 0.0)
        y = y0 + rng.random() * max(y1 - y0 - side, 0.0)
        box = [x, y, x + side, y + side]
        if all(box[2] + gap <= b[0] or b[2] + gap <= box[0] or box[3] + gap <= b[1] or b[3] + gap <= box[1] for b in boxes):
            boxes.append(box)
    if len(boxes) == n:
        return boxes
    # Too crowded for random placement: spread the group evenly along the region's longer side.
    if x1 - x0 >= y1 - y0:
        xs = [x0 + (i + 0.5) * (x1 - x0) / n - side / 2 for i in range(n)]
        return [[x, (y0 + y1 - side) / 2, x + side, (y0 + y1 + side) / 2] for x in xs]
    ys = [y0 + (i + 0.5) * (y1 - y0) / n - side / 2 for i in range(n)]
    return [[(x0 + x1 - side) / 2, y, (x0 + x1 + side) / 2, y + side] for y in ys]


def extent(frame: str) -> tuple[float, float]:
    """The frame's width and height in units of its shorter side: (1, 1), (5/3, 1), (1, 5/3)."""
    w, h = FRAMES[frame]
    return w / min(w, h), h / min(w, h)


def regions(relation: str | None, frame: str = "square") -> list[tuple[float, float, float, float]]:
    """Each group's part of the frame, (x0, y0, x1, y1) as fractions of its width and height: the whole frame
    (one group), or the top / left half for the first group and the other half for the second."""
    fw, fh = extent(frame)
    mx, my = MARGIN / fw, MARGIN / fh
    if relation is None:
        return [(mx, my, 1 - mx, 1 - my)]
    if relation == "above":
        return [(mx, my, 1 - mx, 0.5 - my / 2), (mx, 0.5 + my / 2, 1 - mx, 1 - my)]
    return [(mx, my, 0.5 - mx / 2, 1 - my), (0.5 + mx / 2, my, 1 - mx, 1 - my)]  # "left of"


def layout(scene: dict, rng: np.random.Generator, frame: str = "square") -> list[list[list[float]]]:
    """Boxes per group, as fractions of the frame's width and height, each group inside its ``regions``."""
    fw, fh = extent(frame)
    boxes = []
    for group, (x0, y0, x1, y1) in zip(scene["groups"], regions(scene["relation"], frame)):
        placed = _layout_group(rng, group, (x0 * fw, y0 * fh, x1 * fw, y1 * fh))  # in units of the shorter side
        boxes.append([[a / fw, b / fh, c / fw, d / fh] for a, b, c, d in placed])
    return boxes


def frame_size(frame: str, side: int) -> tuple[int, int]:
    """(width, height) in pixels of a frame whose shorter side is ``side``."""
    fw, fh = extent(frame)
    return round(side * fw), round(side * fh)


def render(scene: dict, boxes: list[list[list[float]]], size: int, frame: str = "square") -> Image.Image:
    """Draw at ``SUPERSAMPLE * size`` (the frame's shorter side) and downsample with a box filter (anti-aliased
    edges)."""
    width, height = frame_size(frame, size)
    big_w, big_h = width * SUPERSAMPLE, height * SUPERSAMPLE
    img = Image.new("RGB", (big_w, big_h), BACKGROUND)
    draw = ImageDraw.Draw(img)
    for group, group_boxes in zip(scene["groups"], boxes):
        color = PALETTE[group["color"]]
        for x0, y0, x1, y1 in group_boxes:
            px = [x0 * big_w, y0 * big_h, x1 * big_w - 1, y1 * big_h - 1]
            if group["shape"] == "circle":
                draw.ellipse(px, fill=color)
            elif group["shape"] == "square":
                inset = (px[2] - px[0]) * (1 - 1 / math.sqrt(1.3)) / 2  # equal visual area to the circle
                draw.rectangle([px[0] + inset, px[1] + inset, px[2] - inset, px[3] - inset], fill=color)
            elif group["shape"] == "triangle":
                draw.polygon([((px[0] + px[2]) / 2, px[1]), (px[2], px[3]), (px[0], px[3])], fill=color)
            else:  # "star"
                draw.polygon(star_points(px), fill=color)
    return img.resize((width, height), Image.Resampling.BOX)


def star_points(box: list[float]) -> list[tuple[float, float]]:
    """A five-pointed star's outline, one point up, inside ``box`` (x0, y0, x1, y1) and centred in it: its outer
    points on a circle of the box's half width, its inner ones at ``STAR_INNER`` of that radius."""
    cx, cy, r = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2, (box[2] - box[0]) / 2
    cy += r * (1 - math.cos(math.pi / 5)) / 2  # the lowest points sit at cos(36 deg) r below the centre: centred
    return [(cx + r * k * math.sin(i * math.pi / 5), cy - r * k * math.cos(i * math.pi / 5))
            for i, k in zip(range(10), [1, STAR_INNER] * 5)]
