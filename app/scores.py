"""A checkpoint's scores, read from the files the workbench writes: evaluate's results store and human studies.

- ``results.jsonl`` (`dwb evaluate run` / `watch`): one JSON object per (checkpoint, guidance) row with
  ``checkpoint_hash``, ``model``, ``step``, ``guidance``, ``sampler``, ``weights`` and metrics, each with an
  optional 95% interval in ``<metric>_lo`` / ``<metric>_hi``. Found beside the checkpoints (their folder or
  a parent up to the root) and in the ``--results`` folders. Beside it, ``metrics.json`` (evaluate's names of
  its metric columns: ``{"fid": {"name": "FID", "lower_is_better": true, "family": "image quality"}}``), used
  where present over the app's own (``FALLBACK_METRICS``), and ``compare/*.html`` (`dwb evaluate compare`).
- ``STUDY/report/results.json`` (`dwb human-eval report`): ``model_info`` gives each model's
  ``checkpoint_hash``, ``comparisons`` each pair's win rate with its intervals; from ``--study`` folders.

Rows join checkpoints by content hash (``train.checkpoints.content_hash``), never by name or path. The files
are read as files: the app imports neither evaluate nor human_eval.
"""
from __future__ import annotations

import json
import logging
import math
import re
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from train.generation import with_sampler_key

log = logging.getLogger("app")
RESULTS = "results.jsonl"
METRICS_FILE = "metrics.json"  # evaluate's description of its metric columns, beside results.jsonl
COMPARE_PAGES = "compare"  # `dwb evaluate compare`'s pages: OUT/compare/<A>-vs-<B>*.html
STUDY_RESULTS = Path("report") / "results.json"
MAX_COMPARE_PAGE_BYTES = 64 * 2**20


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def significant(x: float, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits, with no exponent from 1 up (12345.6 -> 12350, 0.012345 -> 0.01235)."""
    text = f"{x:.{digits}g}"
    return f"{float(text):.0f}" if "e" in text and 1 <= abs(x) < 1e15 else text


@dataclass(frozen=True)
class Metric:
    """A metric column of results rows: its name, which way is better, and the `dwb evaluate run` options that
    measure it."""

    key: str
    name: str
    lower_is_better: bool | None = None
    family: str = ""
    options: str = ""  # what `dwb evaluate run` needs to measure it, besides the checkpoint, --out and --reference

    def title(self) -> str:
        """``FID (lower is better)``."""
        better = {True: "lower is better", False: "higher is better"}.get(self.lower_is_better)
        return f"{self.name} ({better})" if better else self.name

    def how_to_measure(self) -> str:
        options = f" {self.options}" if self.options else ""
        text = f"`dwb evaluate run CKPT --out OUT --reference REF{options}`"
        return text if self.options else f"{text} with the options that measure {self.name} (docs/evaluate.md)"


# The app's names for evaluate's metric columns where no metrics.json describes them (an older results folder).
FALLBACK_METRICS = {m.key: m for m in (
    Metric("fid", "FID", True, "image quality", "--inception-weights W"),
    Metric("kid_mean", "KID", True, "image quality", "--inception-weights W"),
    Metric("clip_score", "CLIP score", False, "text alignment", "--clip MODEL"),
    Metric("cmmd", "CMMD", True, "image quality", "--clip MODEL --cmmd"),
    Metric("fd_dinov2", "FD-DINOv2", True, "image quality", "--dinov2 MODEL"),
    Metric("attr_all_all", "attributes right", False, "text alignment", "--scorer S --prompts shapes"),
)}


def described_metric(key: str, entry) -> Metric | None:
    """A metrics.json entry (``{"name": "FID", "lower_is_better": true, "family": "image quality", ...}``) as a
    Metric; the app's own options to measure it where it knows them. None for an entry that is no object."""
    if not isinstance(entry, dict):
        return None
    known = FALLBACK_METRICS.get(key, Metric(key, key))
    name, lower, family = entry.get("name"), entry.get("lower_is_better"), entry.get("family")
    return replace(known, name=name if isinstance(name, str) and name.strip() else known.name,
                   lower_is_better=lower if isinstance(lower, bool) else known.lower_is_better,
                   family=family if isinstance(family, str) else known.family)


@dataclass(frozen=True)
class Score:
    metric: Metric
    value: float
    lo: float | None  # the 95% interval, where the row has one
    hi: float | None

    def interval_text(self) -> str:
        return f"[{significant(self.lo)}, {significant(self.hi)}]" if self.lo is not None and self.hi is not None \
            else ""

    def text(self) -> str:
        return " ".join(p for p in (self.metric.name, significant(self.value), self.interval_text()) if p)


def score_of(row: dict, metric: Metric) -> Score | None:
    """The row's value of ``metric`` with its interval when the row has one; None when it was not measured."""
    value = _number(row.get(metric.key))
    if value is None:
        return None
    lo, hi = _number(row.get(f"{metric.key}_lo")), _number(row.get(f"{metric.key}_hi"))
    return Score(metric, value, *((lo, hi) if lo is not None and hi is not None else (None, None)))


def scores_of(row: dict, metrics: dict[str, Metric]) -> list[Score]:
    """The metrics a results row holds, each with its interval when the row has one."""
    return [s for m in metrics.values() if (s := score_of(row, m)) is not None]


def setting_text(row: dict) -> str:
    """The row's generation settings: guidance, sampler, steps, weights."""
    parts = [f"guidance {row['guidance']:g}" if _number(row.get("guidance")) is not None else "",
             str(row.get("sampler") or ""), f"{row['steps']} steps" if row.get("steps") else "",
             {"ema": "EMA", "raw": "raw"}.get(row.get("weights"), "")]
    return ", ".join(p for p in parts if p)


def series_of(row: dict) -> str:
    """The plot series a row belongs to: its model and settings (``tiny-phase1 · guidance 5, DDIM, EMA``)."""
    return " · ".join(str(p) for p in (row.get("model") or "", setting_text(row)) if p)


@dataclass(frozen=True)
class ScorePoint:
    """One results row's value of one metric at its training step."""

    checkpoint: str | None  # the checkpoint's label under the app's folders; None when it is not there
    digest: str
    model: str
    series: str
    step: int
    score: Score


def points_of(rows: list[dict], metric: Metric, labels: dict[str, str]) -> list[ScorePoint]:
    """The rows that measured ``metric`` at a training step, by series and step; ``labels``: hash -> label."""
    points = [ScorePoint(labels.get(row["checkpoint_hash"]), row["checkpoint_hash"], str(row.get("model") or ""),
                         series_of(row), row["step"], score)
              for row in rows if (score := score_of(row, metric)) is not None
              and isinstance(row.get("step"), int) and not isinstance(row.get("step"), bool)]
    return sorted(points, key=lambda p: (p.series, p.step))


def names_model(page: str, model: str) -> bool:
    """Whether a compare page's file name (``<A>-vs-<B>.html``, ``<A>-vs-<B>-cfg5.html``) names ``model``, written
    the way evaluate writes labels into file names (each run of other characters than letters, digits, ``_.-``
    as ``_``)."""
    part = re.escape(re.sub(r"[^A-Za-z0-9_.-]+", "_", model))
    return bool(model) and re.search(rf"(?:^|-vs-){part}(?:-|\.html$)", page) is not None


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

    def metrics(self) -> dict[str, Metric]:
        """Every metric column the app knows: as evaluate describes them (``metrics.json`` beside a results file,
        the first description of a column winning), then the app's own for columns none describes."""
        described: dict[str, Metric] = {}
        for path in self.results_files():
            if (path.parent / METRICS_FILE).is_file():
                for key, entry in self._read(path.parent / METRICS_FILE, _json_file).items():
                    if key not in described and (metric := described_metric(key, entry)) is not None:
                        described[key] = metric
        return {**described, **{k: m for k, m in FALLBACK_METRICS.items() if k not in described}}

    def measured(self) -> list[Metric]:
        """The metrics some row measured, in the order ``metrics`` gives them."""
        rows = self.rows()
        return [m for m in self.metrics().values() if any(_number(row.get(m.key)) is not None for row in rows)]

    def compare_pages(self, models: set[str]) -> list[Path]:
        """`dwb evaluate compare`'s pages (``compare/*.html`` in a results folder) whose names name one of
        ``models``: plain files in that folder (no link, which could point anywhere), by name."""
        pages = []
        for path in self.results_files():
            folder = path.parent / COMPARE_PAGES
            if folder.is_dir() and not folder.is_symlink():
                pages += [p for p in folder.glob("*.html") if not p.is_symlink() and p.is_file()
                          and p.stat().st_size <= MAX_COMPARE_PAGE_BYTES and any(names_model(p.name, m) for m in models)]
        return sorted(dict.fromkeys(pages), key=lambda p: p.name)

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
