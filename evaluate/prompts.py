"""Prompt sets. Every loader returns ``list[Prompt]`` so sets can be swapped by name.

- ``drawbench`` / ``parti``: the sets shipped with the workbench (``models.generation``), or any CSV or TSV
  with a prompt column and a category column (DrawBench: ``prompt,category``; PartiPrompts:
  ``Prompt<TAB>Category<TAB>...``), and where ``aspect_column`` names one, each prompt's aspect ratio (W:H).
- ``shapes``: captions of the shapes domain's held-out split (no files needed).
- ``reference``: the captions of the reference set (an MDS folder, or an image folder with ``.txt`` sidecars).
"""
from __future__ import annotations

from pathlib import Path

from models.errors import WorkbenchError
from models.generation import Prompt, read_prompt_table  # one table reader, shared with the app


def shapes_prompts(limit: int | None = 64, seed: int = 0) -> list[Prompt]:
    """Captions of the shapes domain's held-out scenes (``models.shapes.shapes_prompts``); category = one group or two groups."""
    from models.shapes import shapes_prompts as held_out_captions

    return [Prompt(text, category, i) for i, (text, category) in enumerate(held_out_captions(limit or 64, seed))]


def reference_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """The captions of a reference set, in its order."""
    from .reference import iter_captions

    prompts = [Prompt(c, "reference", i) for i, c in enumerate(iter_captions(path, limit))]
    if not prompts:
        raise WorkbenchError(f"reference set {path} has no captions")
    return prompts


def load_prompts(name_or_path: str, limit: int | None = None, reference: str | Path | None = None,
                 aspect_column: str | None = None) -> list[Prompt]:
    """``shapes``, ``reference`` (captions of ``reference``), ``drawbench``, ``parti`` or a CSV/TSV path (your own),
    each prompt with its aspect from ``aspect_column`` of a CSV/TSV where one is named."""
    if aspect_column is not None and name_or_path in ("shapes", "reference"):
        raise WorkbenchError(f"aspect_column {aspect_column!r} is read from a CSV/TSV prompts file; prompts "
                             f"{name_or_path!r} have no columns")
    if name_or_path == "shapes":
        return shapes_prompts(limit)
    if name_or_path == "reference":
        if reference is None:
            raise WorkbenchError("prompts 'reference' needs a reference set (--reference)")
        return reference_prompts(reference, limit)
    return read_prompt_table(name_or_path, limit, aspect_column=aspect_column)
