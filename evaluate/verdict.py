"""The words of a comparison: which checkpoint is better on each metric and overall, with digits that never
contradict the words.

Each metric's verdict follows one rule (``bootstrap.interval`` and ``bootstrap.p_value``): B - A is a gain
for one checkpoint exactly when its 95% interval excludes 0, which is exactly when p < 0.05. Printed digits
keep that visible: an interval is rounded outward with as many decimals as it takes for a bound clear of 0
to print clear of 0, and a p-value just under 0.05 prints as "p < 0.05", never "p = 0.05".

The overall verdict counts, per metric family (``names.FAMILIES``), the metrics that favour B, favour A or
cannot tell after Holm's adjustment over every metric of the comparison (``bootstrap.holm``): testing 19
metrics at once would otherwise call about one of them "better" by chance alone.
"""
from __future__ import annotations

import math

from .bootstrap import holm, p_floor
from .names import FAMILIES, display_name, metric

SIGNIFICANCE = 0.05
MAX_DECIMALS = 12


def _decimals(lo: float, hi: float) -> int:
    """Three significant digits of the interval's width (one for a zero-width interval of a whole number)."""
    width = hi - lo
    if width > 0:
        return max(0, 2 - math.floor(math.log10(width)))
    size = max(abs(lo), abs(hi))
    return 0 if size == 0 or float(size).is_integer() else max(0, 2 - math.floor(math.log10(size)))


def _outward(lo: float, hi: float, decimals: int) -> tuple[float, float]:
    scale = 10.0 ** decimals
    return math.floor(round(lo * scale, 6)) / scale, math.ceil(round(hi * scale, 6)) / scale


def interval_digits(lo: float, hi: float) -> int:
    """Decimals for an interval: three significant digits of its width, more while rounding outward would
    print a bound that is clear of 0 as 0 (or past it)."""
    decimals = _decimals(lo, hi)
    while decimals < MAX_DECIMALS:
        plo, phi = _outward(lo, hi, decimals)
        if not ((lo > 0 and plo <= 0) or (hi < 0 and phi >= 0)):
            break
        decimals += 1
    return decimals


def interval_text(estimate: float, lo: float, hi: float, signed: bool = False) -> str:
    """``estimate [lo, hi]``, the bounds rounded outward (the printed interval holds the computed one)."""
    d = interval_digits(lo, hi)
    plo, phi = _outward(lo, hi, d)
    sign = "+" if signed else ""
    return f"{estimate:{sign}.{d}f} [{plo:{sign}.{d}f}, {phi:{sign}.{d}f}]"


def _round_up(x: float, digits: int = 2) -> float:
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(x)))
    return math.ceil(round(x * scale, 6)) / scale


def p_text(p: float, replicates: int, bound: bool = False) -> str:
    """"p = 0.012"; "p < 0.05" for a p under 0.05 that two digits would round to 0.05; "p <= 0.01" at the
    smallest p the replicates resolve (``bootstrap.p_floor``), and for any p computed from one (``bound``: a
    Holm-adjusted p of a metric at the floor is an upper bound)."""
    floor = p_floor(replicates)
    if p <= floor * (1 + 1e-9) or (bound and p < 1):
        return f"p <= {_round_up(max(p, floor)):.2g}"
    if p < 0.001:
        return "p < 0.001"
    text = f"{p:.2g}"
    if p < SIGNIFICANCE <= float(text):
        return f"p < {SIGNIFICANCE:g}"
    return f"p = {text}"


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


def _family_verdict(favour_b: int, favour_a: int) -> str | None:
    if favour_b and favour_a:
        return "mixed"
    return "B" if favour_b else "A" if favour_a else None


def overall(metrics: list[dict], replicates: int) -> dict:
    """Per family, how many metrics favour B, favour A or cannot tell after Holm's adjustment, in words."""
    families = []
    for family in FAMILIES:
        mine = [m for m in metrics if m["family"] == family]
        if not mine:
            continue
        favour_b = sum(m["better_holm"] == "B" for m in mine)
        favour_a = sum(m["better_holm"] == "A" for m in mine)
        verdict = _family_verdict(favour_b, favour_a)
        words = {None: "cannot tell", "mixed": "mixed", "A": "A is better", "B": "B is better"}[verdict]
        families.append({"family": family, "metrics": [m["metric"] for m in mine], "favour_b": favour_b,
                         "favour_a": favour_a, "cannot_tell": len(mine) - favour_a - favour_b, "verdict": verdict,
                         "sentence": f"{family}: {words} ({len(mine)} {'metric' if len(mine) == 1 else 'metrics'}: "
                                     f"{favour_b} for B, {favour_a} for A, {len(mine) - favour_a - favour_b} "
                                     f"cannot tell)"})
    needed = replicates_for_holm(len(metrics))
    note = (f"{replicates} replicates resolve p down to {p_floor(replicates):.2g}, too coarse for Holm's adjustment "
            f"over {len(metrics)} metrics to find any difference: compare with --bootstrap {needed} or more"
            if len(metrics) > 1 and replicates < needed else None)
    return {"correction": "holm", "level": SIGNIFICANCE, "n_metrics": len(metrics), "families": families,
            "replicates_needed": needed, "note": note,
            "heading": f"overall, after Holm's adjustment over the {len(metrics)} metrics (p_holm; each line above "
                       f"also gives its metric's p alone):" if len(metrics) > 1 else "overall:"}
