"""The report of a results store: plots of what was measured (each point with its 95% interval as an error
bar), the tables, per-category tables, saved comparisons and the sample grids, as one static HTML page.

A plot is drawn only for metrics some row has: without CLIP there is no CLIP panel, and the guidance
trade-off puts FID against CLIP score, or against attribute accuracy when there is no CLIP score.
"""
from __future__ import annotations

import html
import logging
import os
from collections import defaultdict
from pathlib import Path

from models.common import load_outside, whole_file, write_text_whole
from models.errors import WorkbenchError

from .attribute_accuracy import HEADLINE_COLUMNS, attr_column
from .names import PREFERENCE_COLUMNS, display_name, with_direction
from .store import COST_COLUMNS, ResultsStore, checkpoint_cost_columns
from .verdict import comparison_lines

log = logging.getLogger("evaluate.report")
ALL_RIGHT = attr_column("all", "all")  # every attribute right over every prompt
PLACED_BY = ("model", "step", "guidance")  # what places a row in the report's tables and plots

STEP_METRICS = tuple((k, with_direction(k)) for k in ("fid", "clip_score", "cmmd", "fd_dinov2", *PREFERENCE_COLUMNS))
TRADEOFF_X = tuple((k, display_name(k)) for k in ("clip_score", ALL_RIGHT))


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _axes(ax, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _sampler_tag(rows: list[dict]):
    """r -> " DDIM" etc. when the rows come from more than one sampler (a sampler sweep), else ""."""
    several = len({r.get("sampler") for r in rows}) > 1
    return lambda r: f" {r.get('sampler') or 'own sampler'}" if several else ""


def _save(plt, fig, out: Path) -> Path:
    fig.tight_layout()
    with whole_file(out) as tmp:
        fig.savefig(tmp, dpi=110, format=out.suffix.lstrip("."))
    plt.close(fig)
    return out


def _bars(rs: list[dict], key: str) -> list[list[float]] | None:
    """matplotlib's (2, N) error bars from the rows' ``key_lo`` / ``key_hi`` (None without intervals)."""
    if any(r.get(f"{key}_lo") is None for r in rs):
        return None
    return [[max(0.0, r[key] - r[f"{key}_lo"]) for r in rs], [max(0.0, r[f"{key}_hi"] - r[key]) for r in rs]]


def _plot(ax, rs: list[dict], xkey: str, ykey: str, label: str) -> None:
    xerr = _bars(rs, xkey) if xkey != "step" else None
    ax.errorbar([r[xkey] for r in rs], [r[ykey] for r in rs], yerr=_bars(rs, ykey), xerr=xerr, marker="o", capsize=3,
                label=label)


def plot_metrics_vs_step(rows: list[dict], out: Path) -> Path | None:
    """Each measured metric against training step, one line per guidance scale."""
    return _metric_panels(rows, "step", "training step (batches)", out)


def _metric_panels(rows: list[dict], xkey: str, xlabel: str, out: Path) -> Path | None:
    """A panel per measured metric against ``xkey``, one line per guidance scale (and sampler)."""
    panels = [(k, name) for k, name in STEP_METRICS if any(r.get(k) is not None for r in rows)]
    if not panels:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    tag = _sampler_tag(rows)
    by_guidance: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        by_guidance[(r["guidance"], tag(r))].append(r)
    for (g, t), rs in sorted(by_guidance.items()):
        for ax, (key, _) in zip(axes[0], panels):
            have = sorted((r for r in rs if r.get(key) is not None), key=lambda r: r[xkey])
            if have:
                _plot(ax, have, xkey, key, f"cfg {g:g}{t}")
    for ax, (_, name) in zip(axes[0], panels):
        _axes(ax, xlabel, name)
    return _save(plt, fig, out)


def checkpoint_costs(rows: list[dict]) -> dict[str, dict]:
    """What reaching each row's checkpoint cost (``gpu_hours``, and ``usd`` where its run set a price), for the
    checkpoints that record it: the rows' own columns (``Evaluator.row`` writes them), else, for a store written
    before rows carried them, read from the checkpoint file."""
    costs = {}
    for r in rows:
        if r.get("checkpoint") and r.get("gpu_hours") is not None:
            costs.setdefault(r["checkpoint"], {k: r[k] for k in COST_COLUMNS if r.get(k) is not None})
    for ref in {r.get("checkpoint") for r in rows if r.get("checkpoint")} - costs.keys():
        if cost := checkpoint_cost_columns(ref):
            costs[ref] = cost
    return costs


COST_AXES = {"gpu_hours": "GPU-hours to reach the checkpoint", "usd": "dollars to reach the checkpoint"}


def cost_axis(rows: list[dict]) -> tuple[str, list[dict]]:
    """The rows whose checkpoints record their cost, each with ``gpu_hours`` (and ``usd``) from ``checkpoint_costs``,
    and the column to plot them against: ``usd`` where every one of them has dollars, else ``gpu_hours``."""
    costs = checkpoint_costs(rows)
    have = [{**r, **costs[r["checkpoint"]]} for r in rows if r.get("checkpoint") in costs]
    return ("usd" if have and all("usd" in r for r in have) else "gpu_hours"), have


def plot_metrics_vs_cost(rows: list[dict], out: Path) -> Path | None:
    """Each measured metric against the GPU-hours (or dollars, where every checkpoint has a price) spent to reach
    the checkpoint, both phases included: the cost-to-quality curve."""
    xkey, have = cost_axis(rows)
    return _metric_panels(have, xkey, COST_AXES[xkey], out)


def plot_tradeoff(rows: list[dict], out: Path) -> Path | None:
    """FID against CLIP score (or attribute accuracy) across guidance scales, one curve per checkpoint."""
    found = [(k, name) for k, name in TRADEOFF_X if any(r.get(k) is not None for r in rows)]
    if not found:
        return None
    xkey, xname = found[0]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    tag = _sampler_tag(rows)
    by_model: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get(xkey) is not None:
            by_model[r["model"] + tag(r)].append(r)
    for model, rs in sorted(by_model.items(), key=lambda kv: kv[1][0]["step"]):
        rs = sorted(rs, key=lambda r: r["guidance"])
        _plot(ax, rs, xkey, "fid", model)
        for r in rs:
            ax.annotate(f"{r['guidance']:g}", (r[xkey], r["fid"]), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set_title("guidance trade-off (labels: guidance scale)")
    _axes(ax, xname, "FID")
    return _save(plt, fig, out)


ATTRIBUTE_LINES = tuple((k, display_name(k)) for k in HEADLINE_COLUMNS)


def plot_attributes_vs_step(rows: list[dict], out: Path) -> Path | None:
    """GenEval-style attribute accuracy against training step, one panel per guidance scale."""
    rows = [r for r in rows if r.get(ALL_RIGHT) is not None]
    if not rows:
        return None
    plt = _plt()
    scales = sorted({r["guidance"] for r in rows})
    fig, axes = plt.subplots(1, len(scales), figsize=(5 * len(scales), 4), squeeze=False)
    tag = _sampler_tag(rows)
    for ax, g in zip(axes[0], scales):
        rs = sorted((r for r in rows if r["guidance"] == g), key=lambda r: r["step"])
        for t in sorted({tag(r) for r in rs}):
            for key, label in ATTRIBUTE_LINES:
                have = [r for r in rs if r.get(key) is not None and tag(r) == t]
                if have:
                    _plot(ax, have, "step", key, label + t)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"attribute accuracy, guidance {g:g}")
        _axes(ax, "training step (batches)", "fraction of images right")
    return _save(plt, fig, out)


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else html.escape(str(v if v is not None else ""))


def _cell(r: dict, key: str) -> str:
    """``value`` and, below it, ``[lo, hi]``."""
    lo, hi = r.get(f"{key}_lo"), r.get(f"{key}_hi")
    ci = f"<br><small>[{_fmt(lo)}, {_fmt(hi)}]</small>" if lo is not None else ""
    return f"<td>{_fmt(r.get(key))}{ci}</td>"


# What each row scored, named for people (the CSV's column names are the titles): a training step is not a
# sampler's step count.
SCORED_NAMES = {"step": "training step", "weights": "weights", "sampler": "sampler", "steps": "sampler steps"}


def _heading(c: str) -> str:
    name = SCORED_NAMES.get(c) or display_name(c)
    return f"<th title='{html.escape(c)}'>{html.escape(name)}</th>" if name != c else f"<th>{html.escape(c)}</th>"


def _table(rows: list[dict], cols: list[str], first: list[str]) -> str:
    """An HTML table: ``first`` columns as they are, ``cols`` with their intervals; empty columns dropped."""
    cols = [c for c in cols if any(r.get(c) is not None for r in rows)]
    head = "".join(_heading(c) for c in first + cols)  # the title: the CSV's column name
    body = ["<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in first) + "".join(_cell(r, c) for c in cols) + "</tr>"
            for r in rows]
    return f"<div class='wide'><table><tr>{head}</tr>{''.join(body)}</table></div>"


def _categories(rows: list[dict], tag) -> list[str]:
    parts = []
    for r in rows:
        table = r.get("categories") or []
        if len(table) > 1:
            parts.append(f"<details><summary>{html.escape(r['model'])}, guidance {r['guidance']:g}"
                         f"{html.escape(tag(r))}: {len(table)} categories</summary>")
            parts.append(_table(table, ["clip_score", *PREFERENCE_COLUMNS, *[k for k, _ in ATTRIBUTE_LINES]],
                                ["category", "n_prompts", "n_images"]) + "</details>")
    return ["<h2>By prompt category</h2>", *parts] if parts else []


SCORED_KINDS = {**{f"{key}_{side}": kind for key, kind in (("sampler", str), ("steps", int), ("weights", str))
                   for side in "ab"}, "n_prompts": int}  # what a saved comparison says was scored


def comparison_problem(c) -> str | None:
    """Why a saved comparison (``compare/*.json``) cannot be shown, or None: the report reads every file there,
    and any of them may have been written by someone else."""
    if not isinstance(c, dict):
        return f"a JSON {type(c).__name__}, not an object"
    kinds = {"a": str, "b": str, "guidance": (int, float), "n_images": int, "bootstrap": int, "metrics": list}
    for key, kind in kinds.items():
        if not isinstance(c.get(key), kind) or isinstance(c[key], bool):
            return f"'{key}' must be {kind.__name__ if isinstance(kind, type) else 'a number'}"
    if not all(isinstance(m, dict) and isinstance(m.get("sentence"), str) for m in c["metrics"]):
        return "'metrics' must be objects with a 'sentence'"
    replicates = c.get("replicates") or {}
    if not isinstance(replicates, dict) or not all(isinstance(n, int) for n in replicates.values()):
        return "'replicates' must map families to counts"
    for key, kind in SCORED_KINDS.items():
        if c.get(key) is not None and (not isinstance(c[key], kind) or isinstance(c[key], bool)):
            return f"'{key}' must be {'text' if kind is str else 'a whole number'}"
    return _verdict_problem(c.get("overall") or {})


def _verdict_problem(verdict) -> str | None:
    """Why a saved comparison's overall verdict (none in older files) cannot be shown, or None."""
    if not verdict:
        return None
    if not isinstance(verdict, dict):
        return "'overall' must be an object"
    families = verdict.get("families")
    if not (isinstance(verdict.get("heading"), str) and isinstance(verdict.get("note") or "", str)
            and isinstance(families, list) and all(isinstance(f, dict) and isinstance(f.get("sentence"), str)
                                                   for f in families)):
        return "'overall' must hold a 'heading' and its families' sentences"
    return None


def saved_comparisons(folder: Path) -> list[dict]:
    """Every readable comparison in ``folder/compare``; a file too large, nested too deep or not a comparison is
    left out with a warning that names it."""
    found = []
    for path in sorted((folder / "compare").glob("*.json")):
        try:
            c = load_outside(path, str(path))
        except WorkbenchError as e:
            log.warning("warning: %s; left out of the report", e)
            continue
        if problem := comparison_problem(c):
            log.warning("warning: %s: %s; left out of the report", path, problem)
            continue
        found.append(c)
    return found


def _comparisons(folder: Path) -> list[str]:
    """Each saved comparison in the lines `dwb evaluate compare` printed (``verdict.comparison_lines``)."""
    parts = []
    for c in saved_comparisons(folder):
        lines = comparison_lines(c)
        lines += [c["overall"]["note"]] if (c.get("overall") or {}).get("note") else []
        parts.append(f"<p><b>{html.escape(lines[0])}</b><br>" + "<br>".join(html.escape(line.strip())
                                                                          for line in lines[1:]) + "</p>")
    return ["<h2>Comparisons (dwb evaluate compare)</h2>", *parts] if parts else []


def _comparison_pages(folder: Path, out: Path) -> list[str]:
    """Links to the comparison pages (`evaluate.compare_page`), relative to the report."""
    from .layout import comparison_pages

    links = [f"<li><a href='{html.escape(os.path.relpath(p, out))}'>{html.escape(p.stem)}</a></li>"
             for p in comparison_pages(folder)]
    return ["<h2>Comparison pages: A and B side by side</h2><ul>", *links, "</ul>"] if links else []


def placed_rows(rows: list[dict]) -> list[dict]:
    """The scored rows; one without a model, step or guidance (not written by `dwb evaluate run`) is left out
    with a warning."""
    placed = []
    for r in rows:
        if r.get("status") != "ok":
            continue
        missing = [k for k in PLACED_BY if r.get(k) is None]
        if missing:
            log.warning("warning: a scored row of %s has no %s; left out of the report", r.get("checkpoint"),
                        ", ".join(missing))
            continue
        placed.append(r)
    return placed


def write_report(folder: str | Path) -> Path:
    """``folder/report/``: the plots that have data, index.html (tables, categories, comparisons, grids)."""
    folder = Path(folder)
    rows = sorted(placed_rows(ResultsStore(folder).rows()), key=lambda r: (r["step"], r["guidance"]))
    out = folder / "report"
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("metrics_vs_step.png", "tradeoff.png", "attributes_vs_step.png", "metrics_vs_cost.png"):
        (out / stale).unlink(missing_ok=True)  # a plot without data is not drawn, and an old one must not linger
    plots = [plot(rows, out / name) for plot, name in ((plot_metrics_vs_step, "metrics_vs_step.png"),
                                                        (plot_tradeoff, "tradeoff.png"),
                                                        (plot_attributes_vs_step, "attributes_vs_step.png"),
                                                        (plot_metrics_vs_cost, "metrics_vs_cost.png"))] if rows else []
    tag = _sampler_tag(rows)
    first = ["model", "step", "weights", "guidance", "sampler", "steps", "n_images"]  # what each row scored
    parts = ["<!doctype html><meta charset='utf-8'><title>evaluation report</title>",
             "<style>body{font-family:sans-serif;margin:2em;max-width:100%}td,th{padding:2px 6px;text-align:right;"
             "font-size:13px}div.wide{overflow-x:auto}img{max-width:100%}small{color:#555}</style>",
             "<h1>Evaluation report</h1><p>Each value with its 95% bootstrap interval (prompts resampled) below it.</p>"]
    if len({r.get("n_images") for r in rows}) > 1:
        parts.append("<p><b>Rows were scored on different numbers of images:</b> FID and KID grow as the number of "
                     "images falls, so compare those rows on fid_infinity (FD&infin;), not FID.</p>")
    parts += [f"<img src='{p.name}'>" for p in plots if p]
    parts.append(_table(rows, ["fid", "fid_infinity", "kid_mean", "clip_score", "cmmd", "fd_dinov2", "precision",
                               "recall", "density", "coverage", *PREFERENCE_COLUMNS, "seconds_total", *COST_COLUMNS],
                        first))
    if any(r.get(ALL_RIGHT) is not None for r in rows):
        parts += ["<h2>Attribute accuracy</h2>", _table(rows, [k for k, _ in ATTRIBUTE_LINES], first)]
    parts += _categories(rows, tag) + _comparisons(folder)
    parts += _comparison_pages(folder, out)
    for r in rows:
        grids = sorted((folder / r["samples"] / "grids").glob("*.png")) if r.get("samples") else []
        if grids:
            parts.append(f"<h2>{html.escape(r['model'])}, guidance {r['guidance']:g}{html.escape(tag(r))}</h2>")
            parts += [f"<p>{html.escape(g.stem)}<br><img src='{html.escape(os.path.relpath(g, out))}'></p>" for g in grids]
    page = out / "index.html"
    return write_text_whole(page, "\n".join(parts))
