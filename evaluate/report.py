"""The report of a results store: metric-against-step and guidance trade-off plots, and a static HTML page."""
from __future__ import annotations

import html
import os
from collections import defaultdict
from pathlib import Path

from .store import ResultsStore


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
    several = len({r.get("scheduler") for r in rows}) > 1
    return lambda r: f" {r.get('scheduler') or 'own sampler'}" if several else ""


def _save(plt, fig, out: Path) -> Path:
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_metrics_vs_step(rows: list[dict], out: Path) -> Path:
    """FID and CLIP score against training step, one line per guidance scale."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    tag = _sampler_tag(rows)
    by_guidance: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        by_guidance[(r["guidance"], tag(r))].append(r)
    for (g, t), rs in sorted(by_guidance.items()):
        rs = sorted(rs, key=lambda r: r["step"])
        for ax, key in zip(axes, ("fid", "clip_score")):
            pts = [(r["step"], r[key]) for r in rs if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"cfg {g:g}{t}")
    for ax, name in zip(axes, ("FID (lower is better)", "CLIP score (higher is better)")):
        _axes(ax, "training step (batches)", name)
    return _save(plt, fig, out)


def plot_tradeoff(rows: list[dict], out: Path) -> Path:
    """FID against CLIP score across guidance scales, one curve per checkpoint."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    tag = _sampler_tag(rows)
    by_model: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("clip_score") is not None:
            by_model[r["model"] + tag(r)].append(r)
    for model, rs in sorted(by_model.items(), key=lambda kv: kv[1][0]["step"]):
        rs = sorted(rs, key=lambda r: r["guidance"])
        ax.plot([r["clip_score"] for r in rs], [r["fid"] for r in rs], marker="o", label=model)
        for r in rs:
            ax.annotate(f"{r['guidance']:g}", (r["clip_score"], r["fid"]), fontsize=6, xytext=(2, 2),
                        textcoords="offset points")
    ax.set_title("guidance trade-off (labels: guidance scale)")
    _axes(ax, "CLIP score", "FID")
    return _save(plt, fig, out)


ATTRIBUTE_LINES = (("attr_single_color", "colour (one group)"), ("attr_single_shape", "shape (one group)"),
                   ("attr_single_count", "count (one group)"), ("attr_pair_position", "position (two groups)"),
                   ("attr_object_all", "every attribute right (one object)"),
                   ("attr_all_all", "every attribute right (all prompts)"))


def plot_attributes_vs_step(rows: list[dict], out: Path) -> Path | None:
    """GenEval-style attribute accuracy against training step, one panel per guidance scale."""
    rows = [r for r in rows if r.get("attr_all_all") is not None]
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
                pts = [(r["step"], r[key]) for r in rs if r.get(key) is not None and tag(r) == t]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=label + t)
        ax.set_ylim(0, 1.02)
        ax.set_title(f"attribute accuracy, guidance {g:g}")
        _axes(ax, "training step (batches)", "fraction of images right")
    return _save(plt, fig, out)


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else html.escape(str(v if v is not None else ""))


def write_report(folder: str | Path) -> Path:
    """``folder/report/``: metrics_vs_step.png, tradeoff.png, index.html (tables and sample grids)."""
    store = ResultsStore(folder)
    rows = [r for r in store.rows() if r.get("status") == "ok"]
    out = Path(folder) / "report"
    out.mkdir(parents=True, exist_ok=True)
    if rows:
        plot_metrics_vs_step(rows, out / "metrics_vs_step.png")
        plot_tradeoff(rows, out / "tradeoff.png")
    attributes = plot_attributes_vs_step(rows, out / "attributes_vs_step.png") if rows else None
    cols = ["model", "step", "guidance", "fid", "kid_mean", "clip_score", "n_images", "seconds_total"]
    tag = _sampler_tag(rows)
    if any(tag(r) for r in rows):
        cols.insert(3, "scheduler")
    if any(r.get("cmmd") is not None for r in rows):
        cols.insert(6, "cmmd")
    if attributes:
        cols[cols.index("n_images"):cols.index("n_images")] = [k for k, _ in ATTRIBUTE_LINES]
    parts = ["<!doctype html><meta charset='utf-8'><title>evaluation report</title>",
             "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:right}"
             "img{max-width:100%}</style><h1>Evaluation report</h1>"]
    if rows:
        parts.append("<img src='metrics_vs_step.png'><img src='tradeoff.png'>")
    if attributes:
        parts.append("<img src='attributes_vs_step.png'>")
    parts.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in cols) + "</tr>")
    for r in sorted(rows, key=lambda r: (r["step"], r["guidance"])):
        parts.append("<tr>" + "".join(f"<td>{_fmt(r.get(c))}</td>" for c in cols) + "</tr>")
    parts.append("</table>")
    for r in sorted(rows, key=lambda r: (r["step"], r["guidance"])):
        grids = sorted((Path(folder) / r["samples"] / "grids").glob("*.png")) if r.get("samples") else []
        if grids:
            parts.append(f"<h2>{html.escape(r['model'])}, guidance {r['guidance']:g}{html.escape(tag(r))}</h2>")
            parts += [f"<p>{html.escape(g.stem)}<br><img src='{html.escape(os.path.relpath(g, out))}'></p>" for g in grids]
    page = out / "index.html"
    page.write_text("\n".join(parts))
    return page
