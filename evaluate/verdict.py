"""The words of a comparison: which checkpoint is better on each metric and overall, with digits that never
contradict the words.

Each metric's verdict follows one rule (``bootstrap.interval`` and ``bootstrap.p_value``): B - A is a gain
for one checkpoint exactly when its 95% interval excludes 0, which is exactly when p < 0.05. Printed digits
keep that visible (``train.common.digits``): an interval is rounded outward with as many decimals as it
takes for a bound clear of 0 to print clear of 0, and a p-value just under 0.05 prints as "p < 0.05".

The overall verdict counts, per metric family (``names.FAMILIES``), the metrics that favour B, favour A or
cannot tell after Holm's adjustment over every metric of the comparison (``bootstrap.holm``): testing 19
metrics at once would otherwise call about one of them "better" by chance alone.
"""
from __future__ import annotations

import math

from train.common import interval_text, p_value_text

from .bootstrap import holm, p_floor
from .names import FAMILIES, display_name, metric

SIGNIFICANCE = 0.05


def p_text(p: float, replicates: int, bound: bool = False) -> str:
    """``train.common.p_value_text`` with the replicates' floor: "p <= 0.01" for 200 (``bootstrap.p_floor``);
    ``bound``: an upper bound (a Holm-adjusted p of a metric at the floor)."""
    return p_value_text(p, SIGNIFICANCE, p_floor(replicates), bound)


def better_of(key: str, lo: float, hi: float, p: float) -> str | None:
    """"B", "A", or None (cannot tell) for a difference B - A whose interval is [lo, hi] and p-value ``p``: the
    side of 0 the interval lies on, read in the metric's direction (p < 0.05 exactly when it lies on one)."""
    if p >= SIGNIFICANCE or lo <= 0 <= hi:
        return None
    return "B" if (hi < 0) == metric(key).lower_is_better else "A"


def sentence(m: dict, replicates: int, n_metrics: int) -> str:
    """One metric's line: the verdict, the gain (or B - A) with its interval, p, and p after Holm's adjustment."""
    name = display_name(m["metric"])
    p = p_text(m["p"], replicates)
    if m["better"] is None:
        line = f"cannot tell on {name}: B - A = {interval_text(m['difference'], m['lo'], m['hi'], signed=True)}, {p}"
    else:
        flip = (m["better"] == "A") != metric(m["metric"]).lower_is_better  # the gain is -(B - A)
        gain, lo, hi = (-m["difference"], -m["hi"], -m["lo"]) if flip else (m["difference"], m["lo"], m["hi"])
        line = f"{m['better']} is better on {name} by {interval_text(gain, lo, hi)}, {p}"
    if n_metrics > 1:
        after = "cannot tell" if m["better_holm"] is None else f"{m['better_holm']} is better"
        at_floor = m["p"] <= p_floor(replicates) * (1 + 1e-9)
        line += f" (Holm-adjusted over {n_metrics} metrics: {p_text(m['p_holm'], replicates, at_floor)}, {after})"
    return line


def with_verdicts(metrics: list[dict], replicates: int) -> list[dict]:
    """Each metric's ``better``, Holm-adjusted ``p_holm`` and ``better_holm``, display ``name``, ``family``,
    ``lower_is_better`` and ``sentence``, from its ``metric``, ``difference``, ``lo``, ``hi`` and ``p``."""
    adjusted = holm([m["p"] for m in metrics])
    out = []
    for m, p_holm in zip(metrics, adjusted):
        info = metric(m["metric"])
        m = {**m, "better": better_of(m["metric"], m["lo"], m["hi"], m["p"]), "p_holm": p_holm,
             "better_holm": better_of(m["metric"], m["lo"], m["hi"], p_holm), "name": info.name, "family": info.family,
             "lower_is_better": info.lower_is_better}
        out.append({**m, "sentence": sentence(m, replicates, len(metrics))})
    return out


def replicates_for_holm(n_metrics: int) -> int:
    """The fewest replicates whose smallest p, times ``n_metrics``, is under 0.05: 2 m / (B + 1) < 0.05."""
    return math.floor(2 * n_metrics / SIGNIFICANCE)


def family_verdict(family: str, metrics: list[dict]) -> dict:
    """One family's metrics counted after Holm's adjustment: B is better when some favour B and none favour A
    (and the other way round), "mixed" when both happen, cannot tell (None) when none do."""
    favour_b = sum(m["better_holm"] == "B" for m in metrics)
    favour_a = sum(m["better_holm"] == "A" for m in metrics)
    verdict = "mixed" if favour_b and favour_a else "B" if favour_b else "A" if favour_a else None
    words = {None: "cannot tell", "mixed": "mixed", "A": "A is better", "B": "B is better"}[verdict]
    n, unclear = len(metrics), len(metrics) - favour_a - favour_b
    return {"family": family, "metrics": [m["metric"] for m in metrics], "favour_b": favour_b, "favour_a": favour_a,
            "cannot_tell": unclear, "verdict": verdict,
            "sentence": f"{family}: {words} ({n} {'metric' if n == 1 else 'metrics'}: {favour_b} for B, {favour_a} "
                        f"for A, {unclear} cannot tell)"}


def overall(metrics: list[dict], replicates: int) -> dict:
    """Per family, how many metrics favour B, favour A or cannot tell after Holm's adjustment, in words; a note
    when the replicates are too few for any metric to pass the adjustment."""
    families = [family_verdict(f, [m for m in metrics if m["family"] == f]) for f in FAMILIES
                if any(m["family"] == f for m in metrics)]
    needed = replicates_for_holm(len(metrics))
    note = (f"{replicates} replicates resolve p down to {p_floor(replicates):.2g}, too coarse for Holm's adjustment "
            f"over {len(metrics)} metrics to find any difference: compare with --bootstrap {needed} or more"
            if len(metrics) > 1 and replicates < needed else None)
    return {"correction": "holm", "level": SIGNIFICANCE, "n_metrics": len(metrics), "families": families,
            "replicates_needed": needed, "note": note,
            "heading": f"overall, after Holm's adjustment over the {len(metrics)} metrics (p_holm; each line above "
                       f"also gives its metric's p alone):" if len(metrics) > 1 else "overall:"}
