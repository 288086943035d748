"""A grid image with labelled rows and columns: what the X/Y/Z plot shows for each Z value."""
from __future__ import annotations

import math
import textwrap

from PIL import Image, ImageDraw, ImageFont

MIN_CELL = 128  # small images (the tiny model's 16-32 px) are enlarged, pixel for pixel, so labels fit beside them
FONT_SIZE = 14
PAD = 6


def _font() -> ImageFont.ImageFont:
    return ImageFont.load_default(size=FONT_SIZE)  # Pillow's bundled font: nothing read from the system


def _wrap(label: str, width_px: int, max_lines: int = 4) -> list[str]:
    """``label`` in lines that fit ``width_px`` (a character is about 0.6 of the font size), the last one cut."""
    chars = max(8, width_px * 10 // (FONT_SIZE * 6))
    lines = textwrap.wrap(label, chars) or [""]
    if len(lines) > max_lines:
        rest = textwrap.shorten(" ".join(lines[max_lines - 1:]), chars, placeholder="...")
        lines = lines[:max_lines - 1] + [rest]
    return lines


def labelled_grid(images: list[list[Image.Image]], columns: list[str], rows: list[str], title: str = "") -> Image.Image:
    """``images[row][column]`` (all one size) under their column labels, beside their row labels, below ``title``."""
    w, h = images[0][0].size
    scale = max(1, math.ceil(MIN_CELL / min(w, h)))
    cw, ch = w * scale, h * scale
    font, line_h = _font(), FONT_SIZE + 4
    head_lines = [_wrap(c, cw) for c in columns] if any(columns) else [[]]
    row_w = 0 if not any(rows) else min(240, max(120, cw))
    row_lines = [_wrap(r, row_w - 2 * PAD) for r in rows] if row_w else [[] for _ in rows]
    title_h = line_h + PAD if title else 0
    head_h = max(len(lines) for lines in head_lines) * line_h + (PAD if any(columns) else 0)
    grid = Image.new("RGB", (row_w + len(columns) * cw, title_h + head_h + len(rows) * ch), (255, 255, 255))
    draw = ImageDraw.Draw(grid)
    if title:
        draw.text((PAD, PAD // 2), title, fill=(0, 0, 0), font=font)
    for j, lines in enumerate(head_lines):
        for k, line in enumerate(lines):
            draw.text((row_w + j * cw + cw // 2, title_h + k * line_h), line, fill=(0, 0, 0), font=font, anchor="ma")
    for i, row in enumerate(images):
        top = title_h + head_h + i * ch
        for k, line in enumerate(row_lines[i]):
            draw.text((PAD, top + ch // 2 - len(row_lines[i]) * line_h // 2 + k * line_h), line, fill=(0, 0, 0),
                      font=font)
        for j, image in enumerate(row):
            grid.paste(image.convert("RGB").resize((cw, ch), Image.Resampling.NEAREST), (row_w + j * cw, top))
    return grid
