"""Shapes scenes: what a scene holds, how one is drawn at random, laid out and rendered.

A scene is one or two groups of identical shapes (colour, shape, count, size) and, for two groups, how
they are placed. Every image is drawn at 4x its size and downsampled with a box filter, so the 16-px and
32-px buckets of one sample show the same scene.
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
SHAPES = ("circle", "square", "triangle")
SIZES = {"small": 0.17, "large": 0.27}  # side of a shape as a fraction of the image side
MAX_COUNT = 3  # shapes in a group: 1 to 3
PLACEMENTS = ("above", "left of")  # how two groups are placed: the first takes the top / left half
BACKGROUND = (30, 30, 34)
SUPERSAMPLE = 4


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
    """Place ``count`` non-overlapping shapes inside ``region`` (x0, y0, x1, y1 in [0, 1]); boxes out."""
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


def layout(scene: dict, rng: np.random.Generator) -> list[list[list[float]]]:
    """Boxes per group. The first group takes the top (above) or left (left of) half."""
    margin = 0.04
    if scene["relation"] is None:
        regions = [(margin, margin, 1 - margin, 1 - margin)]
    elif scene["relation"] == "above":
        regions = [(margin, margin, 1 - margin, 0.5 - margin / 2), (margin, 0.5 + margin / 2, 1 - margin, 1 - margin)]
    else:  # "left of"
        regions = [(margin, margin, 0.5 - margin / 2, 1 - margin), (0.5 + margin / 2, margin, 1 - margin, 1 - margin)]
    return [_layout_group(rng, g, r) for g, r in zip(scene["groups"], regions)]


def render(scene: dict, boxes: list[list[list[float]]], size: int) -> Image.Image:
    """Draw at ``SUPERSAMPLE * size`` and downsample with a box filter (anti-aliased edges)."""
    big = size * SUPERSAMPLE
    img = Image.new("RGB", (big, big), BACKGROUND)
    draw = ImageDraw.Draw(img)
    for group, group_boxes in zip(scene["groups"], boxes):
        color = COLORS[group["color"]]
        for x0, y0, x1, y1 in group_boxes:
            px = [x0 * big, y0 * big, x1 * big - 1, y1 * big - 1]
            if group["shape"] == "circle":
                draw.ellipse(px, fill=color)
            elif group["shape"] == "square":
                inset = (px[2] - px[0]) * (1 - 1 / math.sqrt(1.3)) / 2  # equal visual area to the circle
                draw.rectangle([px[0] + inset, px[1] + inset, px[2] - inset, px[3] - inset], fill=color)
            else:
                draw.polygon([((px[0] + px[2]) / 2, px[1]), (px[2], px[3]), (px[0], px[3])], fill=color)
    return img.resize((size, size), Image.Resampling.BOX)
