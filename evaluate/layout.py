"""The names evaluate gives folders and files under OUT, made from model labels, sampler names and categories.

Two rules, each kept as it has always written names, so folders already on disk keep their meaning:
a label or sampler name keeps its case, dots and dashes (``safe_path_part``: ``DPM++ 2M`` -> ``DPM_2M``);
a category becomes a lower-case, dashed file stem (``category_file_stem``: ``Gary Marcus et al.`` ->
``gary-marcus-et-al``).
"""
from __future__ import annotations

import re
from pathlib import Path


def safe_path_part(name: str) -> str:
    """``name`` as one path component: each run of characters outside ``[A-Za-z0-9_.-]`` becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def category_file_stem(category: str) -> str:
    """``category`` lower-cased, each run of characters outside ``[a-z0-9]`` a dash, no dash at either end;
    ``uncategorised`` when nothing is left."""
    return re.sub(r"[^a-z0-9]+", "-", category.lower()).strip("-") or "uncategorised"


def samples_folder(model: str, guidance: float, sampler: str | None = None, aspect: str | None = None) -> Path:
    """``samples/<model>/cfg<g>`` under OUT, ``cfg<g>-<sampler>`` for a sampler asked for by name and
    ``...-aspect-<aspect>`` for images drawn at an aspect (a row's ``aspect``: "16:9", "column NAME"), so a sweep of
    samplers or aspects into one results folder keeps every set."""
    leaf = (f"cfg{guidance:g}" + (f"-{safe_path_part(sampler)}" if sampler else "")
            + (f"-aspect-{safe_path_part(aspect)}" if aspect else ""))
    return Path("samples") / safe_path_part(model) / leaf


def grid_file(samples: str | Path, category: str) -> Path:
    """A sample set's grid of one prompt category: ``<samples>/grids/<category>.png``."""
    return Path(samples) / "grids" / f"{category_file_stem(category)}.png"


def comparison_file(out: str | Path, a: str, b: str, guidance: float) -> Path:
    """``OUT/compare/<A>-vs-<B>-cfg<g>.json``: `dwb evaluate compare`'s result for models A and B."""
    return Path(out) / "compare" / f"{safe_path_part(a)}-vs-{safe_path_part(b)}-cfg{guidance:g}.json"


def comparison_page(out: str | Path, a: str, b: str) -> Path:
    """``OUT/compare/<A>-vs-<B>.html``: the page of models A and B's comparison, every guidance scale on it."""
    return Path(out) / "compare" / f"{safe_path_part(a)}-vs-{safe_path_part(b)}.html"


def comparison_pages(out: str | Path) -> list[Path]:
    """Every comparison page under ``OUT/compare``, by name."""
    return sorted((Path(out) / "compare").glob("*-vs-*.html"))
