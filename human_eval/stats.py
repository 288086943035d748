"""Preference rates and their uncertainty: Wilson intervals, clustered bootstraps, the sign test, planning.

A *decisive* vote prefers one image; a tie is "no preference". The preference rate of model a over b
is wins_a / decisive, as in Imagen's DrawBench evaluation and the SD2 replication's comparison.

Votes on the same prompt, or by the same rater, are correlated, so an interval that treats every vote
as independent (Wilson) is too narrow when prompts or raters differ. The clustered bootstraps resample
whole prompts or whole raters and take the 2.5th and 97.5th percentiles of the rate; the two-way
interval combines both (prompts and raters are crossed, not nested).
"""
from __future__ import annotations

import math

import numpy as np
from scipy.stats import binomtest, norm

Z95 = float(norm.ppf(0.975))  # 1.959964...


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (Wilson 1927); (nan, nan) when n == 0."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (max(0.0, centre - half), min(1.0, centre + half))


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test of wins vs losses (ties dropped): p-value under a 50/50 preference."""
    n = wins + losses
    return 1.0 if n == 0 else float(binomtest(wins, n, 0.5, alternative="two-sided").pvalue)


def percentile_interval(replicates: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The central `level` interval of bootstrap replicates (undefined replicates, nan, dropped)."""
    replicates = replicates[np.isfinite(replicates)]
    if replicates.size == 0:
        return (math.nan, math.nan)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(replicates, [tail, 100 - tail])
    return (float(lo), float(hi))


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den elementwise, nan where den is 0 (a rate with no decisive vote)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def bootstrap_rate(wins: np.ndarray, decisive: np.ndarray, clusters: np.ndarray, n_boot: int = 2000,
                   rng: np.random.Generator | None = None) -> np.ndarray:
    """Replicates of sum(wins)/sum(decisive) resampling whole clusters with replacement.

    wins, decisive: (V,) 0/1 per vote; clusters: (V,) a cluster id per vote (prompt or rater).
    Returns (n_boot,) replicates.
    """
    rng = rng or np.random.default_rng(0)
    ids, index = np.unique(clusters, return_inverse=True)
    w = np.bincount(index, weights=wins, minlength=len(ids))  # (G,) wins per cluster
    d = np.bincount(index, weights=decisive, minlength=len(ids))  # (G,) decisive votes per cluster
    counts = rng.multinomial(len(ids), np.full(len(ids), 1 / len(ids)), size=n_boot)  # (B, G) draws per cluster
    return ratio(counts @ w, counts @ d)


def two_way_interval(wins: np.ndarray, decisive: np.ndarray, prompts: np.ndarray, raters: np.ndarray,
                     n_boot: int = 2000, rng: np.random.Generator | None = None, z: float = Z95) -> tuple[float, float]:
    """A 95% interval clustered by prompt *and* by rater at once (two-way clustering).

    The variance is var(by prompt) + var(by rater) - var(by prompt-and-rater cell), each from a cluster
    bootstrap: the multiway-clustering combination of Cameron, Gelbach & Miller (2011). It is kept at
    least as large as either one-way variance; the interval is the rate +- z standard errors.
    """
    rng = rng or np.random.default_rng(0)
    n = decisive.sum()
    if n == 0:
        return (math.nan, math.nan)
    rate = wins.sum() / n
    cells = np.unique(np.stack([np.unique(prompts, return_inverse=True)[1],
                                np.unique(raters, return_inverse=True)[1]]), axis=1, return_inverse=True)[1]
    var = {name: np.nanvar(bootstrap_rate(wins, decisive, ids, n_boot, rng))
           for name, ids in (("prompt", prompts), ("rater", raters), ("cell", cells))}
    se = math.sqrt(max(var["prompt"] + var["rater"] - var["cell"], var["prompt"], var["rater"]))
    return (float(max(0.0, rate - z * se)), float(min(1.0, rate + z * se)))


def decisive_votes_needed(width: float, p: float = 0.5, z: float = Z95) -> int:
    """The fewest decisive votes whose Wilson interval at rate `p` is at most `width` wide (e.g. 0.1 = +-5 points).

    p = 0.5 is the worst case; the observed rate gives a less conservative plan. Clustering by prompt and
    rater widens intervals further: multiply by the design effect (bootstrap width / Wilson width)^2.
    """
    if not 0 < width < 1:
        raise ValueError(f"width must be between 0 and 1, got {width}")
    p = min(max(p, 0.0), 1.0)

    def wide(n: int) -> float:  # the Wilson width at rate p (before clipping to [0, 1])
        return 2 * z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))

    lo, hi = 1, 1
    while wide(hi) > width:
        hi *= 2
    while lo < hi:  # the width falls monotonically with n: bisect for the first n that fits
        mid = (lo + hi) // 2
        if wide(mid) <= width:
            hi = mid
        else:
            lo = mid + 1
    return lo
