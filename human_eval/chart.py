"""The figure people look at: preference rates with 95% error bars per question, and Bradley-Terry scores.

Like the SD2 replication's human-evaluation figure: for each pair of models, the share of decisive
votes each model won on image quality and on prompt alignment, with a dashed line at 50%.
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import BinaryIO

DEFAULT_INTERVAL = "clustered_wilson"  # keeps Wilson's coverage at few votes; a bootstrap gave [100%, 100%] for 3 of 3
INTERVALS = {"clustered_wilson": "Wilson on effective votes (clustering's design effect)",
             "two_way": "bootstrap by prompt and rater", "bootstrap_prompt": "bootstrap by prompt",
             "bootstrap_rater": "bootstrap by rater", "wilson": "Wilson"}
LABELS = {"quality": "Image quality", "alignment": "Prompt alignment"}
COLORS = ("#3b6fb6", "#d9822b")  # model A, model B (and alternate questions in the Bradley-Terry panel)
PANEL_IN = (5.2, 4.2)  # a panel's width and height, inches
CHAR_EM = 0.6  # a character's mean width in ems in DejaVu Sans: the widths titles are wrapped to


def _nan(x) -> float:
    return math.nan if x is None else float(x)


def plot_preferences(results: dict, out: str | Path | BinaryIO, interval: str = DEFAULT_INTERVAL) -> None:
    """Write the preference chart of `analyze`'s results as PNG to a path or a binary file: a panel per model
    pair (each question's preference rates with their intervals), and one of Bradley-Terry scores if fitted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = list(dict.fromkeys((c["model_a"], c["model_b"]) for c in results["comparisons"]))
    bt = {q: rows for q, rows in results.get("bradley_terry", {}).items() if rows}
    panels = len(pairs) + (1 if bt else 0)
    cols = min(3, panels)
    rows = math.ceil(panels / cols)
    # constrained layout makes room for every title, tick label and note; tight_layout left two long model
    # names side by side running 76 px off the figure's left edge
    fig, axes = plt.subplots(rows, cols, figsize=(PANEL_IN[0] * cols, PANEL_IN[1] * rows), squeeze=False,
                             layout="constrained")
    for ax, (a, b) in zip(axes.flat, pairs):
        _pair_panel(ax, results, a, b, interval)
    if bt:
        _bradley_terry_panel(axes.flat[len(pairs)], results["models"], bt)
    for ax in list(axes.flat)[panels:]:
        ax.axis("off")
    fig.suptitle(wrapped(f"Human preference, 95% intervals ({INTERVALS[interval]})", PANEL_IN[0] * cols, 11),
                 fontsize=11)
    fig.savefig(out, format="png", dpi=120)
    plt.close(fig)


def wrapped(text: str, width_in: float, fontsize: float) -> str:
    """``text`` broken into lines that fit ``width_in`` inches at ``fontsize`` points (a long name broken too)."""
    chars = max(8, int(0.9 * width_in * 72 / (fontsize * CHAR_EM)))
    return "\n".join(textwrap.wrap(text, chars))


def _pair_panel(ax, results: dict, a: str, b: str, interval: str) -> None:
    """Model ``a`` against ``b``: for each question, both models' shares of decisive votes with error bars."""
    questions, width = list(results["questions"]), 0.36
    for qi, q in enumerate(questions):
        c = next(c for c in results["comparisons"] if (c["question"], c["model_a"], c["model_b"]) == (q, a, b))
        rate = _nan(c["rate_a"])
        lo, hi = (_nan(x) for x in c[interval])
        for side, (share, err_lo, err_hi) in enumerate(((rate, rate - lo, hi - rate), (1 - rate, hi - rate, rate - lo))):
            x = qi + (side - 0.5) * width
            ax.bar(x, 100 * share if not math.isnan(share) else 0, width, color=COLORS[side],
                   label=wrapped((a, b)[side], 0.8 * PANEL_IN[0], 7) if qi == 0 else None)
            if not math.isnan(share):
                ax.errorbar(x, 100 * share, yerr=[[100 * err_lo], [100 * err_hi]], color="black", capsize=4, lw=1)
                ax.text(x, 3, f"{100 * share:.0f}%", ha="center", fontsize=8, color="white", fontweight="bold")
        ties = _nan(c["tie_rate"])
        ax.text(qi, -12, f"n={c['decisive']} decisive\nties {100 * ties:.0f}%" if not math.isnan(ties) else "no votes",
                ha="center", va="top", fontsize=8)
    ax.axhline(50, color="grey", ls="--", lw=1)
    ax.set_xticks(range(len(questions)), [LABELS.get(q, q) for q in questions])
    ax.set_ylim(0, 132)  # room above 100% for the legend, one model a line
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("preferred (% of decisive votes)")
    ax.set_title(wrapped(f"{a} vs", PANEL_IN[0], 10) + "\n" + wrapped(b, PANEL_IN[0], 10), fontsize=10)
    ax.legend(fontsize=7, loc="upper center", frameon=False)


def _bradley_terry_panel(ax, models: list[str], bt: dict[str, list[dict]]) -> None:
    """Each model's Bradley-Terry score with its interval, side by side for each question."""
    step = 0.8 / len(bt)
    for qi, (q, rows) in enumerate(bt.items()):
        by_model = {r["model"]: r for r in rows}
        xs = [i + (qi - (len(bt) - 1) / 2) * step for i in range(len(models))]
        ys = [_nan(by_model[m]["score"]) for m in models]
        err = [[max(0.0, y - _nan(by_model[m]["interval"][0])) for m, y in zip(models, ys)],  # results files
               [max(0.0, _nan(by_model[m]["interval"][1]) - y) for m, y in zip(models, ys)]]  # of older reports
        ax.bar(xs, ys, step, yerr=err, capsize=3, label=LABELS.get(q, q), color=COLORS[qi % 2], ecolor="black")
    ax.axhline(0, color="grey", lw=1)
    ax.set_xticks(range(len(models)), [wrapped(m, PANEL_IN[0] / 3, 7) for m in models], rotation=30, ha="right",
                  fontsize=7)
    ax.set_ylabel("Bradley-Terry score (log-strength)")
    ax.set_title("Bradley-Terry, 95% bootstrap by prompt", fontsize=10)
    ax.legend(fontsize=8)
