"""Prompt tables: DrawBench's CSV (``prompt,category``), PartiPrompts' TSV (``Prompt<TAB>Category<TAB>...``), or any
CSV/TSV with a prompt column (``prompt``, ``prompts``, ``text`` or ``caption``), an optional ``category`` column and,
where a caller names one, a column of each prompt's aspect ratio (``W:H``, evaluate's ``aspect_column``). One reader
for evaluate's prompt sets, human-eval's studies and the app's prompt files.

DrawBench (200 prompts, Imagen) and PartiPrompts (1,632, Parti) ship with the workbench (``prompt_sets/``,
provenance and checksums in its SOURCES.md): ``read_prompt_table("drawbench")`` and ``"parti"`` read them by name.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ..errors import WorkbenchError
from .defaults import MAX_SEED, parse_aspect, parse_size

PROMPT_HEADERS = ("prompt", "prompts", "text", "caption")
PROMPT_SETS = {"drawbench": "drawbench.csv", "parti": "parti_prompts.tsv"}  # the sets shipped in prompt_sets/


def prompt_set_path(name_or_path: str | Path) -> Path:
    """The file of a shipped prompt set named ``drawbench`` or ``parti``; any other name is a path."""
    if str(name_or_path) in PROMPT_SETS:
        return Path(__file__).with_name("prompt_sets") / PROMPT_SETS[str(name_or_path)]
    return Path(name_or_path)


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str
    index: int  # position in the prompt set; with the image index it fixes the seed
    aspect: tuple[float, float] | None = None  # (W, H) to draw it at, from the table's aspect column; None: square


def _read_rows(path: Path, shown: str) -> list[list[str]]:
    """The table's rows; TSV when the header line holds a tab, CSV otherwise."""
    if not path.is_file():
        raise WorkbenchError(f"prompt file not found: {shown}")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            header = f.readline()
            f.seek(0)
            rows = list(csv.reader(f, delimiter="\t" if "\t" in header else ","))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise WorkbenchError(f"cannot read prompt file {shown} ({type(e).__name__})") from None
    if not rows:
        raise WorkbenchError(f"prompt file {shown} is empty (expected a header with prompt and category columns)")
    return rows


def read_prompt_table(path: str | Path, limit: int | None = None, shown_as: str | None = None,
                      aspect_column: str | None = None) -> list[Prompt]:
    """The prompts of a CSV or TSV file (or of the shipped set ``drawbench`` or ``parti``), in order, each with its
    aspect from ``aspect_column`` where one is named (an empty cell: None; a value that is not W:H is a one-line
    error naming the line).
    Errors name the file as ``shown_as`` (default: its path; the app passes a name, so a server's paths never reach a
    browser)."""
    shown = shown_as or str(path)
    path = prompt_set_path(path)
    rows = _read_rows(path, shown)
    header = [h.strip().lower() for h in rows[0]]
    column = next((i for i, h in enumerate(header) if h in PROMPT_HEADERS), None)
    category = next((i for i, h in enumerate(header) if h == "category"), None)
    if column is None:
        raise WorkbenchError(f"prompt file {shown} has no prompt column (header: {', '.join(rows[0]) or 'empty'})")
    aspects = _aspect_column(header, aspect_column, shown, rows[0])
    prompts = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) <= column or not row[column].strip():
            raise WorkbenchError(f"{shown}, line {line}: no prompt")
        kind = row[category].strip() if category is not None and len(row) > category else ""
        aspect = _aspect_of(row[aspects] if aspects is not None and len(row) > aspects else "", f"{shown}, line {line}")
        prompts.append(Prompt(row[column].strip(), kind or "uncategorised", len(prompts), aspect))
    if not prompts:
        raise WorkbenchError(f"prompt file {shown} holds a header but no prompts")
    return prompts[:limit] if limit else prompts


# `dwb sample --prompts`' optional columns beside the prompt's: a row's own first seed, size and negative prompt
SEED_HEADERS, SIZE_HEADERS, NEGATIVE_HEADERS = ("seed",), ("size",), ("negative_prompt", "negative prompt", "negative")
TABLE_SUFFIXES = (".csv", ".tsv")


@dataclass(frozen=True)
class PromptRow:
    """One row of a `dwb sample --prompts` file: its prompt and, where the file gives them, its own first seed, size
    (a side or (width, height), as `--size` takes it) and negative prompt; None where the command's apply."""

    prompt: str
    seed: int | None = None
    size: int | tuple[int, int] | None = None
    negative_prompt: str | None = None


def read_sample_prompts(path: str | Path) -> list[PromptRow]:
    """The rows of a `dwb sample --prompts` file: a CSV or TSV (by its suffix) with a prompt column as
    ``read_prompt_table`` reads it and optional ``seed``, ``size`` and ``negative_prompt`` columns (an empty cell:
    the command's value); any other file one prompt per line (blank lines and lines starting with # skipped). A
    value that is not one is a one-line error naming the line."""
    path = Path(path)
    if path.suffix.lower() not in TABLE_SUFFIXES:
        return _prompt_lines(path)
    prompts = read_prompt_table(path)
    table = _read_rows(path, str(path))
    rows = [row for row in table[1:] if any(cell.strip() for cell in row)]  # the rows read_prompt_table keeps
    header = [h.strip().lower() for h in table[0]]
    columns = [next((i for i, h in enumerate(header) if h in names), None)
               for names in (SEED_HEADERS, SIZE_HEADERS, NEGATIVE_HEADERS)]
    found = []
    for prompt, row in zip(prompts, rows):
        seed, size, negative = (row[i].strip() if i is not None and len(row) > i else "" for i in columns)
        where = f"{path}, prompt {prompt.index + 1} ({prompt.text[:40]!r})"
        found.append(PromptRow(prompt.text, _seed_of(seed, where) if seed else None,
                               _size_of(size, where) if size else None, negative or None))
    return found


def _prompt_lines(path: Path) -> list[PromptRow]:
    if not path.is_file():
        raise WorkbenchError(f"prompt file not found: {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise WorkbenchError(f"cannot read prompt file {path} ({type(e).__name__})") from None
    rows = [PromptRow(line.strip()) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not rows:
        raise WorkbenchError(f"prompt file {path} holds no prompt (one a line; lines starting with # are skipped)")
    return rows


def _seed_of(cell: str, where: str) -> int:
    if not (cell.isascii() and cell.isdigit() and len(cell) <= len(str(MAX_SEED))) or int(cell) > MAX_SEED:
        raise WorkbenchError(f"{where}: seed must be a whole number from 0 to {MAX_SEED}, got {cell[:40]!r}")
    return int(cell)


def _size_of(cell: str, where: str) -> int | tuple[int, int]:
    try:
        return parse_size(cell)
    except WorkbenchError as e:
        raise WorkbenchError(f"{where}: {e}") from None


def _aspect_column(header: list[str], name: str | None, shown: str, raw: list[str]) -> int | None:
    """The index of the aspect column ``name`` (matched as the other headers are, case and spaces aside)."""
    if name is None:
        return None
    found = next((i for i, h in enumerate(header) if h == name.strip().lower()), None)
    if found is None:
        raise WorkbenchError(f"prompt file {shown} has no aspect column {name!r} (header: {', '.join(raw)})")
    return found


def _aspect_of(cell: str, where: str) -> tuple[float, float] | None:
    if not cell.strip():
        return None
    try:
        return parse_aspect(cell)
    except WorkbenchError as e:
        raise WorkbenchError(f"{where}: {e}") from None
