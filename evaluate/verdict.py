"""The words of a comparison: which checkpoint is better on each metric and overall, with digits that never
contradict the words.

Each metric's verdict follows one rule (``bootstrap.interval`` and ``bootstrap.p_value``): B - A is a gain
for one checkpoint exactly when its 95% interval excludes 0, which is exactly when p < 0.05. Printed digits
keep that visible (``models.common.digits``): an interval is rounded outward with as many decimals as it
takes for a bound clear of 0 to print clear of 0, and a p-value just under 0.05 prints as "p < 0.05".

The overall verdict counts, per metric family (``names.FAMILIES``), the metrics that favour B, favour A or
cannot tell after Holm's adjustment within the family (``bootstrap.holm``): testing the 14 attribute accuracies
at once would otherwise call about one of them "better" by chance alone. Each family is its own question
(do the images look real, do they match the caption, are the attributes right), so the chance of any false
"better" is kept under 5% per family. Each metric's sentence leads with its verdict after that adjustment and
gives the metric's own p second, and every surface (the printed lines, the JSON, the comparison page, the
report) prints a metric's interval, p and verdict through the same functions here. A family of several metrics
gets enough replicates for the adjustment to be able to find a difference (``family_replicates``): Holm's first
step asks p < 0.05 / m, and the smallest p that B replicates resolve is 2 / (B + 1), so at the default 200 a
family of 14 could never pass it.
"""
from __future__ import annotations

import math

from models.common import flip_text, interval_text, p_value_text

from .statistics.bootstrap import MIN_REPLICATES, SIGNIFICANCE, holm, p_floor
from .names import FAMILIES, display_name, metric

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


WEIGHTS = {"ema": "EMA weights", "raw": "raw weights", "stored": "stored weights"}


def _side_settings(result: dict, side: str) -> str:
    """"DPM++ 2M, 20 steps, EMA weights": what one side's images were made with (rows written before a setting was
    recorded say so)."""
    sampler, steps, weights = (result.get(f"{key}_{side}") for key in ("sampler", "steps", "weights"))
    return ", ".join((sampler or "the checkpoint's own sampler", f"{steps} steps" if steps else "steps not recorded",
                      WEIGHTS.get(weights, f"{weights} weights") if weights else "weights not recorded"))


def scored_text(result: dict) -> str:
    """What a comparison scored: "guidance 3, DPM++ 2M, 20 steps, EMA weights", each side's settings where A's and
    B's differ ("guidance 3; A: ..., EMA weights; B: ..., raw weights")."""
    a, b = _side_settings(result, "a"), _side_settings(result, "b")
    return f"guidance {result['guidance']:g}, {a}" if a == b else f"guidance {result['guidance']:g}; A: {a}; B: {b}"


def p_text(p: float, replicates: int, bound: bool = False) -> str:
    """``models.common.p_value_text`` with the replicates' floor: "p <= 0.01" for 200 (``bootstrap.p_floor``);
    ``bound``: an upper bound (a Holm-adjusted p of a metric at the floor)."""
    return p_value_text(p, SIGNIFICANCE, p_floor(replicates), bound)


def better_of(key: str, lo: float | None, hi: float | None, p: float | None) -> str | None:
    """"B", "A", or None (cannot tell) for a difference B - A whose interval is [lo, hi] and p-value ``p``: the
    side of 0 the interval lies on, read in the metric's direction (p < 0.05 exactly when it lies on one)."""
    if p is None or lo is None or p >= SIGNIFICANCE or lo <= 0 <= hi:
        return None
    return "B" if (hi < 0) == metric(key).lower_is_better else "A"


def defined(m: dict) -> int:
    """The replicates a metric's p rests on (every one drawn, in a comparison written before they were counted)."""
    return m.get("defined", m["replicates"])


def unmeasured(m: dict) -> str | None:
    """Why a metric has no interval and p, or None: B - A is not a number (a row's value is infinite or NaN), or
    fewer than ``MIN_REPLICATES`` replicates are defined (each replicate that drew no image the metric judges is
    NaN: with 35 of 40 left, the interval of the rest cleared 0 while their p, at least 2 / 36, could not)."""
    if not math.isfinite(m["difference"]):
        return "not finite"
    if m.get("too_few"):
        return m["too_few"]
    if defined(m) < MIN_REPLICATES or m["lo"] is None or m["p"] is None:
        return (f"{defined(m)} of {m['replicates']} replicates drew an image it judges; a 95% interval needs "
                f"{MIN_REPLICATES}")
    return None


def settled(m: dict) -> dict:
    """The metric's ``lo``, ``hi`` and ``p`` as its verdict reads them, and ``unmeasured`` (why it has none).

    At a tie the interval and p cannot part. Where the 95% interval's bound is 0 in exact arithmetic, floating point
    put it a few ulps past 0 beside p = 0.05, or p a few ulps under 0.05 beside a bound at 0 or printed on it (one in
    seven of 20,000 estimates placed on the bound). An interval clears 0 only by more than rounding (1e-9 of the
    estimate or the interval's width) and with p < 0.05; otherwise a bound past 0 is set on it and p is at least
    0.05: cannot tell."""
    why = unmeasured(m)
    if why:
        return {**m, "lo": None, "hi": None, "p": None, "unmeasured": why}
    lo, hi, p = m["lo"], m["hi"], m["p"]
    rounding = 1e-9 * max(abs(m["difference"]), hi - lo)
    if not ((lo > rounding or hi < -rounding) and p < SIGNIFICANCE):
        lo, hi, p = min(lo, 0.0), max(hi, 0.0), max(p, SIGNIFICANCE)
    return {**m, "lo": lo, "hi": hi, "p": p, "unmeasured": None}


def interval_shown(m: dict) -> str:
    """B - A with its 95% interval, signed, as every surface prints it ("-301 [-411, -208]"); the difference alone
    where the metric has no interval."""
    if m["lo"] is None:
        return f"{m['difference']:+.4g}"
    return interval_text(m["difference"], m["lo"], m["hi"], signed=True)


def flip_shown(m: dict) -> str:
    """How many prompts would flip the metric's verdict, as every surface prints it beside the interval: "flips
    without 3 prompts (4, 17, 22)", "without at most 5 prompts (...)" where the count is an upper bound (a set
    metric's greedy search); "" for a verdict of "cannot tell" or a comparison written before flips were counted; a
    set metric's count not searched names the option that searches it."""
    found = m.get("flip")
    if not found:
        return ""
    n = found["count"]
    if n is None:
        return "its flip count with --set-flips"  # a set metric's search, only when asked
    if n == 0:
        return "on the edge: the t-interval of its prompts reaches 0"
    shown = ", ".join(str(p) for p in found["prompts"][:FLIP_NAMED]) + (", ..." if n > FLIP_NAMED else "")
    return f"{flip_text(n, found['exact'], 'prompt')} ({shown})"


FLIP_NAMED = 5  # prompts named in a line; the JSON lists them all


def own_p_shown(m: dict) -> str:
    """The metric's own p as every surface prints it ("p <= 0.01"); "" without one."""
    return "" if m["p"] is None else p_text(m["p"], defined(m))


def p_shown(m: dict) -> str:
    """The p its verdict rests on, after Holm's adjustment within its family, as every surface prints it: an upper
    bound ("p <= 0.02") where the metric's own p is at the replicates' floor; "" without one."""
    if m.get("p_holm") is None:
        return ""
    at_floor = m["p"] <= p_floor(defined(m)) * (1 + 1e-9)
    return p_text(m["p_holm"], defined(m), at_floor)


def verdict_shown(m: dict) -> str:
    """"B is better", "A is better" or "cannot tell", after Holm's adjustment: what a row's colour shows."""
    return "cannot tell" if m["better_holm"] is None else f"{m['better_holm']} is better"


def claim(m: dict) -> str:
    """A metric's verdict alone with its gain (or B - A where it cannot tell) and 95% interval: "B is better on FID
    by 301 [208, 411]", "cannot tell on CLIP score: B - A = +0.12 [-0.05, +0.30]", "cannot tell on FID (not
    finite): B - A = +inf"."""
    name = display_name(m["metric"])
    if m.get("unmeasured"):
        return f"cannot tell on {name} ({m['unmeasured']}): B - A = {interval_shown(m)}"
    if m["better"] is None:
        return f"cannot tell on {name}: B - A = {interval_shown(m)}"
    flip = (m["better"] == "A") != metric(m["metric"]).lower_is_better  # the gain is -(B - A)
    gain, lo, hi = (-m["difference"], -m["hi"], -m["lo"]) if flip else (m["difference"], m["lo"], m["hi"])
    flips = flip_shown(m)
    return f"{m['better']} is better on {name} by {interval_text(gain, lo, hi)}" + (f", {flips}" if flips else "")


def brief(m: dict) -> str:
    """The claim and its p-value alone, for one metric asked about beforehand (no Holm adjustment): "B is better on
    FID by 301 [208, 411] (p <= 0.01)"."""
    return claim(m) if m.get("unmeasured") else f"{claim(m)} ({own_p_shown(m)})"


def sentence(m: dict, n_family: int) -> str:
    """One metric's line, led by its verdict after Holm's adjustment within its family of ``n_family`` tested
    metrics, then its own p: "B is better on FID by 301 [208, 411] (Holm-adjusted over the 2 image quality
    metrics: p <= 0.02; its own p <= 0.01)"; where the adjustment takes a verdict back, "cannot tell on ... after
    Holm's adjustment over the 14 attribute accuracy metrics (p = 0.096); alone: B is better on ... (p = 0.048)". A
    t-interval's small-size warning (``bootstrap.skew_warning``) ends the line."""
    warned = f"; {m['warning']}" if m.get("warning") and not m.get("unmeasured") else ""
    if n_family <= 1 or m.get("unmeasured"):
        return brief(m) + warned
    over = f"over the {n_family} {m['family']} metrics"
    if m["better_holm"] != m["better"]:
        return (f"cannot tell on {display_name(m['metric'])} after Holm's adjustment {over} ({p_shown(m)}); "
                f"alone: {brief(m)}{warned}")
    return f"{claim(m)} (Holm-adjusted {over}: {p_shown(m)}; its own {own_p_shown(m)}){warned}"


def holm_within_families(metrics: list[dict]) -> tuple[list[float | None], list[int]]:
    """Each metric's p after Holm's adjustment over the tested metrics of its family (``names.FAMILIES``; a metric
    without a p is not tested and gets none), and how many metrics each adjustment was over."""
    adjusted, sizes = [None] * len(metrics), [0] * len(metrics)
    for family in FAMILIES:
        members = [i for i, m in enumerate(metrics) if metric(m["metric"]).family == family and m["p"] is not None]
        for i, p in zip(members, holm([metrics[i]["p"] for i in members])):
            adjusted[i], sizes[i] = p, len(members)
    return adjusted, sizes


def with_verdicts(metrics: list[dict]) -> list[dict]:
    """Each metric's ``better``, Holm-adjusted ``p_holm`` and ``better_holm``, ``holm_over`` (the metrics adjusted
    together), display ``name``, ``family``, ``lower_is_better``, ``unmeasured`` and ``sentence``, from its
    ``metric``, ``difference``, ``lo``, ``hi``, ``p``, ``replicates`` and ``defined`` (``settled`` first: a tie at
    the boundary and a metric without enough replicates read the same in the interval, p and words)."""
    metrics = [settled(m) for m in metrics]
    out = []
    for m, (p_holm, n) in zip(metrics, zip(*holm_within_families(metrics))):
        info = metric(m["metric"])
        m = {**m, "better": better_of(m["metric"], m["lo"], m["hi"], m["p"]), "p_holm": p_holm, "holm_over": n,
             "better_holm": better_of(m["metric"], m["lo"], m["hi"], p_holm), "name": info.name, "family": info.family,
             "lower_is_better": info.lower_is_better}
        out.append({**m, "sentence": sentence(m, n)})
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
            "heading": "overall, after Holm's adjustment within each family (each line above leads with it and gives "
                       "its metric's own p second):" if adjusted else "overall:"}


def tied(m: dict) -> bool:
    """Whether a metric's comparison is an exact tie: B - A is 0 and so is each end of its interval (models that
    draw the same images)."""
    return not m.get("unmeasured") and m["difference"] == 0 and m["lo"] == 0 and m["hi"] == 0


def comparison_lines(result: dict) -> list[str]:
    """A comparison as `dwb evaluate compare` prints it and the report shows it: what was scored, each metric's
    sentence, the overall verdict per family."""
    n_prompts = f" of {result['n_prompts']} prompts" if result.get("n_prompts") else ""
    ties = [m for m in result["metrics"] if tied(m)]
    folded = ties if len(ties) > 1 else []
    lines = [f"A = {result['a']}, B = {result['b']}, {scored_text(result)}, {result['n_images']} images{n_prompts}, "
             f"{replicates_text(result)}:", *(f"  {m['sentence']}" for m in result["metrics"] if m not in folded)]
    if folded:  # two models that draw alike tie on every metric: one line, not one "+0 [+0, +0] (p = 1)" each
        lines.append(f"  cannot tell on {len(folded)} metrics, tied: B - A = 0 [0, 0] on each "
                     f"({', '.join(display_name(m['metric']) for m in folded)})")
    verdict = result.get("overall") or {}  # comparisons written before the overall verdict have none
    if verdict:
        lines += [f"  {verdict['heading']}", *(f"    {f['sentence']}" for f in verdict["families"])]
    return lines
