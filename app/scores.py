"""A checkpoint's scores, read from the files the workbench writes: evaluate's results store and human studies.

- ``results.jsonl`` (`dwb evaluate run` / `watch`): one JSON object per (checkpoint, guidance) row with
  ``checkpoint_hash``, ``model``, ``step``, ``guidance``, ``sampler``, ``weights`` and metrics, each with an
  optional 95% interval in ``<metric>_lo`` / ``<metric>_hi``. Found beside the checkpoints (their folder or
  a parent up to the root) and in the ``--results`` folders.
- ``STUDY/report/results.json`` (`dwb human-eval report`): ``model_info`` gives each model's
  ``checkpoint_hash``, ``comparisons`` each pair's win rate with its intervals; from ``--study`` folders.

Rows join checkpoints by content hash (``train.checkpoints.content_hash``), never by name or path. The files
are read as files: the app imports neither evaluate nor human_eval.
"""
from __future__ import annotations

import json
import logging
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from train.generation import with_sampler_key

log = logging.getLogger("app")
RESULTS = "results.jsonl"
STUDY_RESULTS = Path("report") / "results.json"
# metric column -> how the app names it; lower is better for the distances
METRICS = {"fid": "FID", "kid_mean": "KID", "clip_score": "CLIP score", "cmmd": "CMMD", "fd_dinov2": "FD-DINOv2",
           "attr_all_all": "attributes right"}
LOWER_IS_BETTER = {"fid", "kid_mean", "cmmd", "fd_dinov2"}


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else None


@dataclass(frozen=True)
class Score:
    metric: str  # a METRICS key
    value: float
    lo: float | None  # the 95% interval, where the row has one
    hi: float | None

    def text(self) -> str:
        interval = f" [{self.lo:.4g}, {self.hi:.4g}]" if self.lo is not None and self.hi is not None else ""
        return f"{METRICS[self.metric]} {self.value:.4g}{interval}"


def scores_of(row: dict) -> list[Score]:
    """The metrics a results row holds, each with its interval when the row has one."""
    out = []
    for metric in METRICS:
        value = _number(row.get(metric))
        if value is not None:
            out.append(Score(metric, value, _number(row.get(f"{metric}_lo")), _number(row.get(f"{metric}_hi"))))
    return out


def setting_text(row: dict) -> str:
    """The row's generation settings: guidance, sampler, steps, weights."""
    parts = [f"guidance {row['guidance']:g}" if _number(row.get("guidance")) is not None else "",
             str(row.get("sampler") or ""), f"{row['steps']} steps" if row.get("steps") else "",
             {"ema": "EMA", "raw": "raw"}.get(row.get("weights"), "")]
    return ", ".join(p for p in parts if p)


@dataclass(frozen=True)
class WinRate:
    study: str
    question: str
    opponent: str  # the other model's checkpoint hash (or its name when it has none)
    rate: float
    lo: float | None
    hi: float | None
    decisive: int


class ScoreFiles:
    """The results stores and studies the app reads, with each file's parse cached by (size, mtime)."""

    def __init__(self, roots: list[Path], results: list[Path] = (), studies: list[Path] = (),
                 checkpoints: Callable[[], list[Path]] = list):
        self.roots, self.results, self.studies = list(roots), list(results), list(studies)
        self.checkpoints = checkpoints  # the paths of the checkpoints under the roots, listed afresh each time
        self._cache: dict[Path, tuple[tuple[int, int], object]] = {}
        self._lock = threading.Lock()

    def results_files(self) -> list[Path]:
        """The --results folders' stores, and ``results.jsonl`` beside each checkpoint: in its folder or a parent
        of it up to its root (no walk of the roots: they may hold far more than checkpoints)."""
        found = [p / RESULTS if p.is_dir() else p for p in self.results]
        for path in self.checkpoints():
            root = next((r for r in self.roots if path.is_relative_to(r)), None)
            folder = path.parent
            while root is not None and folder.is_relative_to(root):
                found.append(folder / RESULTS)
                if folder == root:
                    break
                folder = folder.parent
        return [p for p in dict.fromkeys(found) if p.is_file()]

    def rows(self) -> list[dict]:
        """Every scored row (status ok) with a checkpoint hash, from every results file."""
        return [row for path in self.results_files() for row in self._read(path, _results_rows)]

    def rows_for(self, digest: str) -> list[dict]:
        return [row for row in self.rows() if row.get("checkpoint_hash") == digest]

    def win_rates(self, digest: str) -> list[WinRate]:
        """The checkpoint's human win rates against each other model of every study that rated it."""
        out = []
        for folder in self.studies:
            path = folder / STUDY_RESULTS if (folder / STUDY_RESULTS).is_file() else folder / "results.json"
            if path.is_file():
                out += _win_rates(self._read(path, _json_file), digest)
        return out

    def _read(self, path: Path, parse):
        try:
            st = path.stat()
            key = (st.st_size, st.st_mtime_ns)
            with self._lock:
                if path in self._cache and self._cache[path][0] == key:
                    return self._cache[path][1]
            value = parse(path)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            log.warning("cannot read %s: %s", path, e)
            return [] if parse is _results_rows else {}
        with self._lock:
            self._cache[path] = (key, value)
        return value


def _results_rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash of the scoring process
        if isinstance(row, dict) and row.get("status", "ok") == "ok" and isinstance(row.get("checkpoint_hash"), str):
            rows.append(with_sampler_key(row))
    return rows


def _json_file(path: Path) -> dict:
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def _interval(comparison: dict, flip: bool) -> tuple[float | None, float | None]:
    """The report's two-way (prompts and raters) interval, else its Wilson interval; for model_b, 1 - it."""
    for key in ("two_way", "wilson"):
        pair = comparison.get(key)
        if isinstance(pair, list) and len(pair) == 2 and all(_number(v) is not None for v in pair):
            lo, hi = pair
            return (1 - hi, 1 - lo) if flip else (lo, hi)
    return None, None


def _win_rates(results: dict, digest: str) -> list[WinRate]:
    info = results.get("model_info") if isinstance(results.get("model_info"), dict) else {}
    hashes = {m: (v.get("checkpoint_hash") or "") for m, v in info.items() if isinstance(v, dict)}
    mine = {m for m, h in hashes.items() if h == digest}
    out = []
    for c in results.get("comparisons") or []:
        if not isinstance(c, dict) or _number(c.get("rate_a")) is None:
            continue
        for side, other, flip in (("model_a", "model_b", False), ("model_b", "model_a", True)):
            if c.get(side) in mine:
                lo, hi = _interval(c, flip)
                rate = 1 - c["rate_a"] if flip else c["rate_a"]
                out.append(WinRate(str(results.get("study", "")), str(c.get("question", "")),
                                   hashes.get(c.get(other)) or str(c.get(other)), rate, lo, hi,
                                   int(_number(c.get("decisive")) or 0)))
    return out
