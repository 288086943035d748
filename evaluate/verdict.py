"""The words of a comparison: which checkpoint is better on each metric and overall, with digits that never
contradict the words.

Each metric's verdict follows one rule (``bootstrap.interval`` and ``bootstrap.p_value``): B - A is a gain
for one checkpoint exactly when its 95% interval excludes 0, which is exactly when p < 0.05. Printed digits
keep that visible (``train.common.digits``): an interval is rounded outward with as many decimals as it
takes for a bound clear of 0 to print clear of 0, and a p-value just under 0.05 prints as "p < 0.05".

The overall verdict counts, per metric family (``names.FAMILIES``), the metrics that favour B, favour A or
cannot tell after Holm's adjustment within the family (``bootstrap.holm``): testing the 14 attribute accuracies
at once would otherwise call about one of them "better" by chance alone. Each family is its own question
(do the images look real, do they match the caption, are the attributes right), so the chance of any false
"better" is kept under 5% per family. A family of several metrics gets enough replicates for the adjustment to
be able to find a difference (``family_replicates``): Holm's first step asks p < 0.05 / m, and the smallest p
that B replicates resolve is 2 / (B + 1), so at the default 200 a family of 14 could never pass it.
"""
from __future__ import annotations

from collections import Counter

from train.common import interval_text, p_value_text

from .bootstrap import holm, p_floor
from .names import FAMILIES, display_name, metric

SIGNIFICANCE = 0.05
# Replicates per metric of a family: at 80 m, an estimate with two of the replicates beyond it still passes
# Holm's first step (p < 0.05 / m needs fewer than 0.025 B / m = 2 of them in the tail).
PER_METRIC = 80


def family_replicates(requested: int, n_metrics: int) -> int:
    """Replicates for a family of ``n_metrics``: ``requested``, raised to 80 per metric (rounded up to a hundred)
    when the family has several: 200 for 2, 400 for 4, 1,200 for the 14 attribute accuracies."""
    needed = -(-PER_METRIC * n_metrics // 100) * 100 if n_metrics > 1 else 0
    return max(requested, needed)


def replicates_text(result: dict) -> str:
    """"200 paired bootstrap replicates (1,200 for attribute accuracy)": the count of each family; a comparison
    written before per-family counts has one count."""
    counts = result.get("replicates") or {}
    base = result["bootstrap"]
    raised = [f"{n:,} for {family}" for family, n in counts.items() if n != base]
    return f"{base:,} paired bootstrap replicates" + (f" ({', '.join(raised)})" if raised else "")


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


def claim(m: dict) -> str:
    """A metric's verdict with its gain (or B - A where it cannot tell) and 95% interval: "B is better on FID by
    301 [208, 411]", "cannot tell on CLIP score: B - A = +0.12 [-0.05, +0.30]"."""
    name = display_name(m["metric"])
    if m["better"] is None:
        return f"cannot tell on {name}: B - A = {interval_text(m['difference'], m['lo'], m['hi'], signed=True)}"
    flip = (m["better"] == "A") != metric(m["metric"]).lower_is_better  # the gain is -(B - A)
    gain, lo, hi = (-m["difference"], -m["hi"], -m["lo"]) if flip else (m["difference"], m["lo"], m["hi"])
    return f"{m['better']} is better on {name} by {interval_text(gain, lo, hi)}"


def brief(m: dict) -> str:
    """The claim and its p-value alone, for one metric asked about beforehand (no Holm adjustment): "B is better on
    FID by 301 [208, 411] (p <= 0.01)"."""
    return f"{claim(m)} ({p_text(m['p'], m['replicates'])})"


def sentence(m: dict, n_family: int) -> str:
    """One metric's line: the claim, p, and p after Holm's adjustment within its family of ``n_family`` metrics."""
    replicates = m["replicates"]
    line = f"{claim(m)}, {p_text(m['p'], replicates)}"
    if n_family > 1:
        after = "cannot tell" if m["better_holm"] is None else f"{m['better_holm']} is better"
        at_floor = m["p"] <= p_floor(replicates) * (1 + 1e-9)
        line += (f" (Holm-adjusted over the {n_family} {m['family']} metrics: "
                 f"{p_text(m['p_holm'], replicates, at_floor)}, {after})")
    return line


def holm_within_families(metrics: list[dict]) -> list[float]:
    """Each metric's p after Holm's adjustment over the metrics of its family (``names.FAMILIES``)."""
    adjusted = [1.0] * len(metrics)
    for family in FAMILIES:
        members = [i for i, m in enumerate(metrics) if metric(m["metric"]).family == family]
        for i, p in zip(members, holm([metrics[i]["p"] for i in members])):
            adjusted[i] = p
    return adjusted


def with_verdicts(metrics: list[dict]) -> list[dict]:
    """Each metric's ``better``, Holm-adjusted ``p_holm`` and ``better_holm``, display ``name``, ``family``,
    ``lower_is_better`` and ``sentence``, from its ``metric``, ``difference``, ``lo``, ``hi``, ``p`` and
    ``replicates``."""
    sizes = Counter(metric(m["metric"]).family for m in metrics)
    out = []
    for m, p_holm in zip(metrics, holm_within_families(metrics)):
        info = metric(m["metric"])
        m = {**m, "better": better_of(m["metric"], m["lo"], m["hi"], m["p"]), "p_holm": p_holm,
             "better_holm": better_of(m["metric"], m["lo"], m["hi"], p_holm), "name": info.name, "family": info.family,
             "lower_is_better": info.lower_is_better}
        out.append({**m, "sentence": sentence(m, sizes[info.family])})
    return out


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


def overall(metrics: list[dict]) -> dict:
    """Per family, how many metrics favour B, favour A or cannot tell after Holm's adjustment within it, in
    words."""
    families = [family_verdict(f, [m for m in metrics if m["family"] == f]) for f in FAMILIES
                if any(m["family"] == f for m in metrics)]
    adjusted = any(len(f["metrics"]) > 1 for f in families)
    return {"correction": "holm within each family", "level": SIGNIFICANCE, "n_metrics": len(metrics),
            "families": families,
            "heading": "overall, after Holm's adjustment within each family (p_holm; each line above also gives its "
                       "metric's p alone):" if adjusted else "overall:"}
