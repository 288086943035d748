"""Prompt sets. Every loader returns ``list[Prompt]`` so sets can be swapped by name.

- ``drawbench`` / ``parti``: any CSV or TSV with a prompt column and a category column
  (DrawBench: ``prompt,category``; PartiPrompts: ``Prompt<TAB>Category<TAB>...``), matched by name.
- ``shapes``: captions of the shapes domain's held-out split (no files needed).
- ``reference``: the captions of the reference set (an MDS folder, or an image folder with ``.txt`` sidecars).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from train.errors import WorkbenchError


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str
    index: int  # position in the prompt set; with the image index it fixes the seed


def read_prompt_table(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Prompts from a CSV (``.csv``) or TSV (``.tsv``/``.txt``) file with ``prompt`` and ``category`` columns."""
    path = Path(path)
    if not path.is_file():
        raise WorkbenchError(f"prompt file not found: {path}")
    delimiter = "," if path.suffix.lower() == ".csv" else "\t"
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter=delimiter))
    except (UnicodeDecodeError, csv.Error) as e:
        raise WorkbenchError(f"cannot read prompt file {path}: {e}") from None
    if not rows:
        raise WorkbenchError(f"prompt file {path} is empty (expected a header with prompt and category columns)")
    header = [h.strip().lower() for h in rows[0]]
    col = {name: next((i for i, h in enumerate(header) if h in names), None)
           for name, names in (("prompt", ("prompt", "prompts", "text", "caption")), ("category", ("category",)))}
    if col["prompt"] is None:
        raise WorkbenchError(f"prompt file {path} has no prompt column (header: {', '.join(rows[0]) or 'empty'})")
    prompts = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) <= col["prompt"] or not row[col["prompt"]].strip():
            raise WorkbenchError(f"{path}, line {line}: no prompt")
        category = row[col["category"]].strip() if col["category"] is not None and len(row) > col["category"] else ""
        prompts.append(Prompt(row[col["prompt"]].strip(), category or "uncategorised", len(prompts)))
    if not prompts:
        raise WorkbenchError(f"prompt file {path} holds a header but no prompts")
    return prompts[:limit] if limit else prompts


def shapes_prompts(limit: int | None = 64, seed: int = 0) -> list[Prompt]:
    """Captions of the shapes domain's held-out scenes (``train.shapes.prompts``); category = one group or two groups."""
    from train.shapes.prompts import shapes_prompts as held_out_captions

    return [Prompt(text, category, i) for i, (text, category) in enumerate(held_out_captions(limit or 64, seed))]


def reference_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """The captions of a reference set, in its order."""
    from .reference import iter_captions

    prompts = [Prompt(c, "reference", i) for i, c in enumerate(iter_captions(path, limit))]
    if not prompts:
        raise WorkbenchError(f"reference set {path} has no captions")
    return prompts


def load_prompts(name_or_path: str, limit: int | None = None, reference: str | Path | None = None) -> list[Prompt]:
    """``shapes``, ``reference`` (captions of ``reference``) or a CSV/TSV path (DrawBench, PartiPrompts, your own)."""
    if name_or_path == "shapes":
        return shapes_prompts(limit)
    if name_or_path == "reference":
        if reference is None:
            raise WorkbenchError("prompts 'reference' needs a reference set (--reference)")
        return reference_prompts(reference, limit)
    return read_prompt_table(name_or_path, limit)
