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

from train.common import disk_full_error, is_disk_full, whole_file
from train.errors import WorkbenchError
from train.generation import with_sampler_key

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
           "n_reference", "reference_skipped", "prompts", "sampler", "steps", "size", "extractor", "dinov2", "resize",
           "seconds_generate", "seconds_metrics", "seconds_bootstrap", "seconds_total", "seconds_checkpoint", "samples",
           "status", "error",
           "checkpoint_hash", "weights", "dtype", "file_size", "file_mtime_ns", "time"]
CATEGORY_KEYS = ["model", "checkpoint", "step", "guidance", "sampler"]


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
    from train.callbacks import checkpoint_cost

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


class ResultsStore:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / RESULTS

    def rows(self) -> list[dict]:
        if not self.path.is_file():
            return []
        rows = []
        for line in self.path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash: that score is redone
            rows.append(with_sampler_key(row) if isinstance(row, dict) else row)  # an older store says "scheduler"
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
        return {(r["checkpoint"], r.get("file_size"), r.get("file_mtime_ns")) for r in self.rows()
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
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
