"""A checkpoint's scores, read from the files the workbench writes: evaluate's results store and human studies.

- ``results.jsonl`` (`dwb evaluate run` / `watch`): one JSON object per (checkpoint, guidance) row with
  ``checkpoint_hash``, ``model``, ``step``, ``guidance``, ``sampler``, ``weights`` and metrics, each with an
  optional 95% interval in ``<metric>_lo`` / ``<metric>_hi``, and, where the checkpoint records what it cost to
  reach, ``gpu_hours`` and (where its run set a price) ``usd`` (no metrics: an x axis of the Scores plot). Found
  beside the checkpoints (their folder or a parent up to the root) and in the ``--results`` folders. Beside it,
  ``metrics.json`` (evaluate's names of its metric columns: ``{"fid": {"name": "FID", "lower_is_better": true,
  "family": "image quality"}}``; a column none describes is shown by its key), and ``compare/*.html``
  (`dwb evaluate compare`'s pages).
- ``STUDY/report/results.json`` (`dwb human-eval report`): ``model_info`` gives each model's
  ``checkpoint_hash``, ``comparisons`` each pair's win rate with its intervals; from ``--study`` folders.

Rows join checkpoints by content hash (``models.checkpoints.content_hash``), never by name or path. The files
are read as files: the app imports neither evaluate nor human_eval.
"""
from __future__ import annotations

import logging
import math
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from models.common import MAX_TIME, load_outside, loads_outside
from models.errors import WorkbenchError, first_line
from models.generation import with_sampler_key

log = logging.getLogger("app")
RESULTS = "results.jsonl"
METRICS_FILE = "metrics.json"  # evaluate's description of its metric columns, beside results.jsonl
COMPARE_PAGES = "compare"  # `dwb evaluate compare`'s pages: OUT/compare/<A>-vs-<B>*.html
STUDY_RESULTS = Path("report") / "results.json"
WIN_RATE_INTERVALS = ("clustered_wilson", "two_way", "wilson")  # a study report's keys, the preferred first
FLOAT_MAX = sys.float_info.max


# The largest training step a row may place on the plot: as long as any run may be (models.common.typed_config's
# MAX_TIME, 10^10 batches); a step of 400 digits went whole into the page's table, which holds 64-bit numbers.
MAX_STEP = MAX_TIME["ba"]


def _number(value) -> float | None:
    """A finite float of a row's value; None for another value, or an int past the floats (10**400 raised
    OverflowError in float())."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    if isinstance(value, int) and abs(value) > FLOAT_MAX:
        return None
    return float(value) if math.isfinite(value) else None


def _step(value) -> int | None:
    """A row's training step: a whole number from 0 to MAX_STEP; None for any other value."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP else None


def significant(x: float, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits, with no exponent from 1 up (12345.6 -> 12350, 0.012345 -> 0.01235)."""
    text = f"{x:.{digits}g}"
    return f"{float(text):.0f}" if "e" in text and 1 <= abs(x) < 1e15 else text


@dataclass(frozen=True)
class Metric:
    """A metric column of results rows: its name for people and which way is better, as evaluate's
    ``metrics.json`` describes it; a column none describes keeps its key as its name."""

    key: str
    name: str
    lower_is_better: bool | None = None

    def title(self) -> str:
        """``FID (lower is better)``."""
        better = {True: "lower is better", False: "higher is better"}.get(self.lower_is_better)
        return f"{self.name} ({better})" if better else self.name


def described_metric(key: str, entry) -> Metric | None:
    """A metrics.json entry (``{"name": "FID", "lower_is_better": true, ...}``) as a Metric; None for an entry
    that is no object."""
    if not isinstance(entry, dict):
        return None
    name, lower = entry.get("name"), entry.get("lower_is_better")
    return Metric(key, name if isinstance(name, str) and name.strip() else key,
                  lower if isinstance(lower, bool) else None)


def interval_columns(row: dict) -> list[str]:
    """The columns a row gives a 95% interval (``<key>_lo`` and ``<key>_hi``): metrics, in a store written before
    evaluate wrote ``metrics.json`` beside it."""
    return [key[:-3] for key in row if key.endswith("_lo") and f"{key[:-3]}_hi" in row and key[:-3] in row]


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


def run_of(model: str) -> str:
    """The run a model label names: evaluate labels a checkpoint ``<run>/<name>`` by default
    (``tiny-phase1/ep0-ba2-rank0``, the demo ``phase1/ba2``), so each checkpoint is a model of its own; a label
    without a slash is its own run."""
    return model.rsplit("/", 1)[0] if "/" in model.strip("/") else model


def series_of(row: dict) -> str:
    """The plot series a row belongs to: its run and settings (``tiny-phase1 · guidance 5, DDIM, EMA``), so that a
    run's checkpoints scored alike make one line."""
    return " · ".join(str(p) for p in (run_of(str(row.get("model") or "")), setting_text(row)) if p)


@dataclass(frozen=True)
class XAxis:
    """What the Scores plot can put along its x axis: a row's training step, or what reaching its checkpoint cost
    (evaluate writes ``gpu_hours`` into the rows of checkpoints that record it, and ``usd`` where the run set a
    price)."""

    key: str  # the row's column
    choice: str  # the radio's label
    title: str  # the axis' title
    whole: bool  # ticks at whole numbers only
    missing: str  # why a row is left out of the plot


STEP_AXIS = XAxis("step", "training step", "training step", True, "")
X_AXES = {a.key: a for a in (
    STEP_AXIS,
    XAxis("gpu_hours", "GPU-hours", "GPU-hours to reach the checkpoint", False,
          "no GPU-hours recorded (only checkpoints dwb train wrote record them, and only rows scored since evaluate "
          "writes them carry them)"),
    XAxis("usd", "dollars", "dollars to reach the checkpoint", False,
          "no dollars recorded (their run set no cost.usd_per_gpu_hour, or their checkpoint records no cost)"))}


@dataclass(frozen=True)
class ScorePoint:
    """One results row's value of one metric at its training step, and what reaching its checkpoint cost."""

    checkpoint: str | None  # the checkpoint's label under the app's folders; None when it is not there
    digest: str
    model: str
    series: str
    step: int
    score: Score
    gpu_hours: float | None = None
    usd: float | None = None

    def x(self, axis: XAxis) -> float | None:
        """The point's value along ``axis``; None where its row has none."""
        return getattr(self, axis.key)

    def cost_text(self) -> str:
        """``0.01234 GPU-hours, 0.02468 dollars`` (what the row has of them)."""
        return ", ".join(f"{significant(v)} {a.choice}" for a in X_AXES.values()
                         if a is not STEP_AXIS and (v := self.x(a)) is not None)


def points_of(rows: list[dict], metric: Metric, labels: dict[str, str]) -> list[ScorePoint]:
    """The rows that measured ``metric`` at a training step, by series and step; ``labels``: hash -> label."""
    points = [ScorePoint(labels.get(row["checkpoint_hash"]), row["checkpoint_hash"], str(row.get("model") or ""),
                         series_of(row), row["step"], score, _number(row.get("gpu_hours")), _number(row.get("usd")))
              for row in rows if (score := score_of(row, metric)) is not None and _step(row.get("step")) is not None]
    return sorted(points, key=lambda p: (p.series, p.step))


def x_axes_of(points: list[ScorePoint]) -> list[XAxis]:
    """The x axes the points can be plotted against: training step always; GPU-hours where some point has them;
    dollars where some do and every point with GPU-hours has dollars too (a run without a price would otherwise
    drop out of a plot its GPU-hours place)."""
    hours = [p for p in points if p.gpu_hours is not None]
    priced = bool(hours) and all(p.usd is not None for p in hours)
    return [STEP_AXIS, *([X_AXES["gpu_hours"]] if hours else []), *([X_AXES["usd"]] if priced else [])]


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
    flip: int | None = None  # the leading side's votes whose removal makes the interval hold 50%, where it does not


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
        return [row for path in self.results_files() for row in self._read(path, _results_rows).rows]

    def skipped(self) -> list[str]:
        """Why each whole line of the results files that is not a readable row was skipped, one line each."""
        return [reason for path in self.results_files() for reason in self._read(path, _results_rows).skipped]

    def rows_for(self, digest: str) -> list[dict]:
        return [row for row in self.rows() if row.get("checkpoint_hash") == digest]

    def metrics(self) -> dict[str, Metric]:
        """Every metric column the app knows: as evaluate describes them (``metrics.json`` beside a results file,
        the first description of a column winning), then, by their keys, the columns with an interval in a store
        that no metrics.json describes (one written before evaluate wrote it)."""
        described: dict[str, Metric] = {}
        for path in self.results_files():
            described_here = path.parent / METRICS_FILE
            for key, entry in (self._read(described_here, _json_file) if described_here.is_file() else {}).items():
                if key not in described and (metric := described_metric(key, entry)) is not None:
                    described[key] = metric
        for row in self.rows():
            for key in interval_columns(row):
                described.setdefault(key, Metric(key, key))
        return described

    def measured(self) -> list[Metric]:
        """The metrics some row measured, in the order ``metrics`` gives them."""
        rows = self.rows()
        return [m for m in self.metrics().values() if any(_number(row.get(m.key)) is not None for row in rows)]

    def results_folders(self) -> list[Path]:
        """The folders of the results stores the app reads."""
        return list(dict.fromkeys(path.parent for path in self.results_files()))

    def compare_pages(self, models: set[str]) -> list[tuple[Path, Path]]:
        """(results folder, page) of each of `dwb evaluate compare`'s pages (``compare/*.html`` in a results
        folder) whose name names one of ``models``, by name; plain files only (a link could lead anywhere)."""
        pages = [(folder, page) for folder in self.results_folders() if (folder / COMPARE_PAGES).is_dir()
                 for page in (folder / COMPARE_PAGES).glob("*-vs-*.html")
                 if not page.is_symlink() and page.is_file() and any(names_model(page.name, m) for m in models)]
        return sorted(pages, key=lambda p: p[1].name)

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
        except (OSError, UnicodeDecodeError, ValueError, WorkbenchError) as e:
            log.warning("cannot read %s: %s", path, e)
            return ResultsRows([], [f"{path.name}: {first_line(e)}"]) if parse is _results_rows else {}
        with self._lock:
            self._cache[path] = (key, value)
        return value


@dataclass(frozen=True)
class ResultsRows:
    """What one results file gives: its scored rows, and why each whole line that is not one was skipped."""

    rows: list[dict]
    skipped: list[str]


def _results_rows(path: Path) -> ResultsRows:
    """Each line read as JSON from outside (``models.common.loads_outside``: a line nested 5,000 deep raised
    RecursionError, a 500 from the Scores tab); an unreadable whole line is skipped with its reason, and a last
    line without its line break (cut short by a crash of the scoring process) is skipped without one."""
    text = path.read_text()
    lines = text.splitlines()
    rows, skipped = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = loads_outside(line, f"{path.name} line {number}")
        except WorkbenchError as e:
            if number < len(lines) or text.endswith("\n"):
                skipped.append(str(e))
            continue
        if isinstance(row, dict) and row.get("status", "ok") == "ok" and isinstance(row.get("checkpoint_hash"), str):
            rows.append(with_sampler_key(row))
    return ResultsRows(rows, skipped)


def _json_file(path: Path) -> dict:
    data = load_outside(path, path.name)
    return data if isinstance(data, dict) else {}


def _interval(comparison: dict, flip: bool) -> tuple[float | None, float | None]:
    """The report's interval: Wilson's on the effective number of votes (human-eval's default), else, in a report
    written before it, the two-way (prompts and raters) bootstrap's, else plain Wilson's; for model_b, 1 - it."""
    for key in WIN_RATE_INTERVALS:
        pair = comparison.get(key)
        if isinstance(pair, list) and len(pair) == 2 and all(_number(v) is not None for v in pair):
            lo, hi = pair
            return (1 - hi, 1 - lo) if flip else (lo, hi)
    return None, None


def _win_rates(results: dict, digest: str) -> list[WinRate]:
    info = results.get("model_info") if isinstance(results.get("model_info"), dict) else {}
    hashes = {m: str(v.get("checkpoint_hash") or "") for m, v in info.items() if isinstance(v, dict)}
    mine = {m for m, h in hashes.items() if h == digest}
    comparisons = results.get("comparisons")
    out = []
    for c in comparisons if isinstance(comparisons, list) else []:
        if not isinstance(c, dict) or _number(c.get("rate_a")) is None \
                or not all(isinstance(c.get(side), str) for side in ("model_a", "model_b")):
            continue
        for side, other, flip in (("model_a", "model_b", False), ("model_b", "model_a", True)):
            if c.get(side) in mine:
                lo, hi = _interval(c, flip)
                rate = 1 - c["rate_a"] if flip else c["rate_a"]
                flips = c.get("flip") if isinstance(c.get("flip"), dict) else {}
                count = _number(flips.get("count"))
                out.append(WinRate(str(results.get("study", "")), str(c.get("question", "")),
                                   hashes.get(c.get(other)) or str(c.get(other)), rate, lo, hi,
                                   int(_number(c.get("decisive")) or 0), None if count is None else int(count)))
    return out
