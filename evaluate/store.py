"""The results store: one JSON line per (checkpoint, guidance) score, appended and never rewritten.

JSONL keeps the store readable by anything and safe to append from the one process that scores;
``export_csv`` flattens it for spreadsheets, and every append writes ``metrics.json`` beside it (each
column's display name, direction, family and range: ``names.py``). Scoring state for `watch` lives in
the same file: a checkpoint is done once a line with its path and file identity exists.

A checkpoint's rows are appended in one write and synced. A crash during a write can still leave the
file ending inside a line; the next append would be glued to that fragment and lost with it, so before
appending, a torn tail is cut off and kept in ``results.torn`` (nothing is thrown away).
"""
from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path

from models.common import disk_full_error, is_disk_full, loads_outside, spreadsheet_cell, whole_file
from models.errors import WorkbenchError
from models.generation import with_sampler_key

from .attribute_accuracy import ATTRIBUTE_COLUMNS, COUNT_COLUMNS
from .names import PREFERENCE_COLUMNS, write_metrics_table

log = logging.getLogger("evaluate.store")
RESULTS = "results.jsonl"
TORN = "results.torn"


def _with_interval(*names: str) -> list[str]:
    return [c for n in names for c in (n, f"{n}_lo", f"{n}_hi")]


COST_COLUMNS = ("gpu_hours", "usd")  # what reaching the checkpoint cost: GPU-hours, and dollars at its run's price
COLUMNS = ["model", "checkpoint", "step", *COST_COLUMNS, "guidance", *_with_interval("fid"), "fid_infinity",
           *_with_interval("kid_mean"), "kid_std", *_with_interval("clip_score", "cmmd", "fd_dinov2"),
           "precision", "recall", "density", "coverage", *_with_interval(*ATTRIBUTE_COLUMNS),
           *COUNT_COLUMNS, *_with_interval(*PREFERENCE_COLUMNS), "n_images", "bootstrap",
           "n_reference", "reference_skipped", "prompts", "sampler", "steps", "size", "aspect", "extractor", "dinov2", "resize",
           "seconds_generate", "seconds_metrics", "seconds_bootstrap", "seconds_total", "seconds_checkpoint", "samples",
           "status", "error",
           "checkpoint_hash", "base_checkpoint", "base_hash", "lora_hashes", "lora_strengths", "weights", "dtype",
           "file_size", "file_mtime_ns", "time"]
CATEGORY_KEYS = ["model", "checkpoint", "step", "guidance", "sampler"]
TEXT_COLUMNS = frozenset({"model", "checkpoint", "checkpoint_hash", "base_checkpoint", "base_hash", "lora_hashes",
                          "lora_strengths", "weights", "prompts", "sampler", "aspect",
                          "extractor", "dinov2", "resize", "samples", "status", "error", "dtype"})
NUMBER_COLUMNS = frozenset(COLUMNS) - TEXT_COLUMNS


def checkpoint_identity(ckpt) -> dict:
    """``file_size`` and ``file_mtime_ns`` of a local checkpoint file (None for a folder, a hub id, or an s3
    object, whose reference carries its ETag): what `watch` compares to know a file was replaced."""
    remote = "://" in str(ckpt.ref)
    st = ckpt.path.stat() if ckpt.path is not None and ckpt.path.is_file() and not remote else None
    return {"file_size": st.st_size if st else None, "file_mtime_ns": st.st_mtime_ns if st else None}


def checkpoint_cost_columns(path: str | Path | None) -> dict:
    """What reaching a checkpoint cost, as a results row's columns: ``gpu_hours`` (the checkpoint's
    ``gpu_hours_total``: every resume and the earlier phase included, ``train.callbacks.cost``) and, where its run
    set a price (``cost.usd_per_gpu_hour``), ``usd``; ``{}`` for one that records no cost (a diffusers folder, a
    single file, a hub model, a Composer checkpoint written without the cost callback)."""
    from models.checkpoints import checkpoint_cost

    if path is None or not Path(path).is_file():
        return {}
    try:
        cost = checkpoint_cost(path)
    except WorkbenchError:  # another kind of file: no cost inside
        return {}
    hours, price = cost.get("gpu_hours_total"), cost.get("usd_per_gpu_hour")
    if hours is None:
        return {}
    return {"gpu_hours": float(hours), **({"usd": float(hours) * float(price)} if price is not None else {})}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def inside_relative(value) -> bool:
    """Whether ``value`` is a relative path that stays inside its folder (no absolute path, no ``..``)."""
    return isinstance(value, str) and bool(value) and not Path(value).is_absolute() and ".." not in Path(value).parts


def row_problem(row) -> str | None:
    """Why a store line is not a row this package can show or compare (markup where a number goes, a samples
    folder outside the store), or None. Keys a row leaves out are not checked."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    for key, value in row.items():
        if value is None:
            continue
        if key in NUMBER_COLUMNS and not _is_number(value):
            return f"'{key}' must be a number, got {str(value)[:80]!r}"
        if key in TEXT_COLUMNS and not isinstance(value, str):
            return f"'{key}' must be a string, got {type(value).__name__}"
    if row.get("samples") is not None and not inside_relative(row["samples"]):
        return f"'samples' must be a folder inside the store, got {row['samples'][:80]!r}"
    categories = row.get("categories")
    if categories is not None and not (isinstance(categories, list) and all(isinstance(c, dict) for c in categories)):
        return "'categories' must be a list of objects"
    return None


_warned: set[tuple[str, int, str]] = set()


def _skip(path: Path, lineno: int, reason: str) -> None:
    """Say once per process why a store line is left out (the commands read the store several times)."""
    if (str(path), lineno, reason) not in _warned:
        _warned.add((str(path), lineno, reason))
        log.warning("warning: %s; the line is left out", reason)


class ResultsStore:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / RESULTS

    def rows(self) -> list[dict]:
        """Each line that is a row, its keys under their current names; a line nested too deep, too large, or
        holding values of the wrong kind is left out with a warning that names it."""
        if not self.path.is_file():
            return []
        rows, lines = [], self.path.read_text(errors="replace").split("\n")
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{self.path} line {lineno}"
            try:
                row = loads_outside(line, where)
            except WorkbenchError as e:
                if lineno < len(lines):  # else a line cut short by a crash: that score is redone
                    _skip(self.path, lineno, str(e))
                continue
            if problem := row_problem(row):
                _skip(self.path, lineno, f"{where}: {problem}")
                continue
            rows.append(with_sampler_key(row))  # an older store says "scheduler"
        return rows

    def append_rows(self, rows: list[dict]) -> None:
        """Append rows in one write, synced to disk. A write that fails partway (a full disk writes what fits,
        then fails) is cut back off, so the store never ends inside a line; a full disk is one line."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._cut_torn_tail()
        data = memoryview("".join(json.dumps(row) + "\n" for row in rows).encode())
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        try:
            while data:  # one write(2) for a regular file; the loop only covers an interrupted one
                data = data[os.write(fd, data):]
            os.fsync(fd)
        except OSError as e:
            os.ftruncate(fd, size)
            if is_disk_full(e):
                raise disk_full_error(self.folder, f"{RESULTS} rows ({len(rows)})", e) from None
            raise
        finally:
            os.close(fd)
        write_metrics_table(self.folder)  # what each column is, for readers that may not import evaluate

    def append(self, row: dict) -> None:
        self.append_rows([row])

    def _cut_torn_tail(self) -> None:
        if not self.path.is_file() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
            f.seek(0)
            data = f.read()
            cut = data.rfind(b"\n") + 1  # 0 when the only line is torn
            with open(self.folder / TORN, "ab") as torn:
                torn.write(data[cut:] + b"\n")
            f.truncate(cut)
        log.warning("warning: %s ended inside a line (a write cut short); moved those %d bytes to %s", self.path,
                    len(data) - cut, self.folder / TORN)

    def done(self, retry_unreadable: bool = False) -> set[tuple[str, int | None, int | None]]:
        """(path, size, mtime) of each checkpoint file with a finished record: scored, or refused as unreadable
        (those are left out with ``retry_unreadable``). A file replaced since its record is not done."""
        finished = ("ok",) if retry_unreadable else ("ok", "unreadable")
        return {(r.get("checkpoint"), r.get("file_size"), r.get("file_mtime_ns")) for r in self.rows()
                if r.get("status") in finished}

    def export_csv(self, path: str | Path | None = None) -> Path:
        """``results.csv`` (one line per row) and ``categories.csv`` (one line per row and prompt category)."""
        path = Path(path) if path else self.folder / "results.csv"
        rows = self.rows()
        _write_csv(path, COLUMNS, rows)
        categories = [{**{k: r.get(k) for k in CATEGORY_KEYS}, **c} for r in rows for c in r.get("categories") or []]
        keys = list(dict.fromkeys([*CATEGORY_KEYS, "category", *(k for c in categories for k in c)]))
        _write_csv(path.with_name("categories.csv"), keys, categories)
        return path


def _write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    with whole_file(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writerow({c: spreadsheet_cell(c) for c in columns})
        for row in rows:
            writer.writerow({k: spreadsheet_cell(v) for k, v in row.items()})
