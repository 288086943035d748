"""The results store: one JSON line per (checkpoint, guidance) score, appended and never rewritten.

JSONL keeps the store readable by anything and safe to append from the one process that scores;
``export_csv`` flattens it for spreadsheets. Scoring state for `watch` lives in the same file: a
checkpoint is done once a line with its path and file identity exists.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

RESULTS = "results.jsonl"
COLUMNS = ["model", "checkpoint", "step", "guidance", "fid", "kid_mean", "kid_std", "clip_score", "cmmd",
           "attr_object_color", "attr_object_shape", "attr_object_count", "attr_object_all",
           "attr_single_color", "attr_single_shape", "attr_single_count", "attr_single_all", "attr_pair_color",
           "attr_pair_shape", "attr_pair_count", "attr_pair_position", "attr_pair_all", "attr_all_all",
           "attr_n_object", "attr_n_single", "attr_n_pair", "n_images",
           "n_reference", "reference_skipped", "prompts", "scheduler", "steps", "size", "extractor", "resize",
           "seconds_generate", "seconds_metrics", "seconds_total", "seconds_checkpoint", "samples", "status", "error",
           "checkpoint_hash", "weights", "dtype", "file_size", "file_mtime_ns", "time"]


def checkpoint_identity(ckpt) -> dict:
    """``file_size`` and ``file_mtime_ns`` of a local checkpoint file (None for a folder, a hub id, or an s3
    object, whose reference carries its ETag): what `watch` compares to know a file was replaced."""
    remote = "://" in str(ckpt.ref)
    st = ckpt.path.stat() if ckpt.path is not None and ckpt.path.is_file() and not remote else None
    return {"file_size": st.st_size if st else None, "file_mtime_ns": st.st_mtime_ns if st else None}


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
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a crash: that score is redone
        return rows

    def append(self, row: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()

    def done(self, retry_unreadable: bool = False) -> set[tuple[str, int | None, int | None]]:
        """(path, size, mtime) of each checkpoint file with a finished record: scored, or refused as unreadable
        (those are left out with ``retry_unreadable``). A file replaced since its record is not done."""
        finished = ("ok",) if retry_unreadable else ("ok", "unreadable")
        return {(r["checkpoint"], r.get("file_size"), r.get("file_mtime_ns")) for r in self.rows()
                if r.get("status") in finished}

    def export_csv(self, path: str | Path | None = None) -> Path:
        path = Path(path) if path else self.folder / "results.csv"
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            writer.writeheader()
            for row in self.rows():
                writer.writerow(row)
        return path
