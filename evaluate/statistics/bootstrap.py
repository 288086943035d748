"""Bootstrap intervals and paired p-values, resampling prompts (Efron & Tibshirani 1993, ch. 13 and 16).

The resampling unit is the prompt: a replicate draws as many prompts as the set has, with replacement,
and every image carries its prompt's count as its weight, so all images of one prompt stay together
(a cluster bootstrap; images of one prompt share its difficulty and are not independent draws). A
metric is then recomputed on the weighted images: a weighted mean for per-image metrics (CLIP score,
attribute accuracy), a weighted set for set metrics (FID, KID, CMMD) against fixed reference statistics.

One interval rule for every metric: the point estimate plus the 2.5% and 97.5% quantiles of the
replicates' deviations from their own mean. For a mean this is the percentile interval. For a set
metric it removes the shift every replicate shares because a resample repeats images (about 63% of
them are distinct): measured on FID of 500 64-d Gaussian features against a fixed reference, 150
draws, the percentile interval covered E[FID] in 78% of them and this one in 94%. Each bound is then kept
inside the metric's range (KID's unbiased estimate of two alike sets can be below 0; the true KID cannot).

One verdict rule for a difference B - A: its p-value is the smallest 1 - level at which that same interval
reaches 0, so "the 95% interval excludes 0" and "p < 0.05" are the same statement and can never disagree
(the earlier p, the share of centred replicates farther from 0 than the estimate, followed another rule:
on 200 gamma-distributed replicates the two disagreed in 30% of 20,000 draws of the estimate). Several
metrics of one comparison are adjusted together with Holm's step-down rule (``holm``).
"""
from __future__ import annotations

import numpy as np

LEVEL = 0.95
SIGNIFICANCE = 0.05  # 1 - LEVEL, written out: in floating point 1 - 0.95 is 0.050000000000000044
MIN_REPLICATES = 40  # one replicate in each 2.5% tail of a 95% interval; p_floor(40) = 0.049 < 0.05


def prompt_weights(prompt_ids: np.ndarray, replicates: int, seed: int = 0) -> np.ndarray:
    """(replicates, N) image weights: each row resamples the distinct prompts with replacement and gives
    every image the number of times its prompt was drawn."""
    prompts, image_prompt = np.unique(np.asarray(prompt_ids), return_inverse=True)
    p = len(prompts)
    counts = np.random.default_rng(seed).multinomial(p, np.full(p, 1.0 / p), size=replicates)  # (B, P)
    return counts[:, image_prompt].astype(np.float64)


def weighted_means(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Replicates of per-image means: (N,) or (N, K) values, (B, N) weights -> (B,) or (B, K).

    NaN marks an image without a value (a caption without a verdict); it does not count. A replicate
    that drew no image with a value is NaN.
    """
    v = np.asarray(values, dtype=np.float64)
    flat = v.ndim == 1
    v = v[:, None] if flat else v
    defined = ~np.isnan(v)
    num, den = weights @ np.where(defined, v, 0.0), weights @ defined
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(den > 0, num / np.maximum(den, 1e-300), np.nan)
    return out[:, 0] if flat else out


def _finite_sorted(replicates: np.ndarray) -> np.ndarray:
    r = np.asarray(replicates, dtype=np.float64)
    return np.sort(r[np.isfinite(r)])


def _deviations(s: np.ndarray) -> np.ndarray:
    """Sorted replicates minus their mean; exactly 0 when they are all equal (the mean of equal floats can
    differ from them in the last bit, which would put a checkpoint compared with itself off 0)."""
    return np.zeros_like(s) if s[0] == s[-1] else s - s.mean()


def _quantile(s: np.ndarray, u: float) -> float:
    """The ``u`` quantile of sorted values ``s``, interpolated linearly between order statistics (numpy's default
    rule, written out so that ``_level_below`` / ``_level_above`` invert exactly the same function)."""
    h = (len(s) - 1) * u
    k = min(int(np.floor(h)), len(s) - 2)
    return float(s[k] + (h - k) * (s[k + 1] - s[k]))


def _level_below(s: np.ndarray, t: float) -> float:
    """sup{u : quantile(u) <= t}: 0 when every value is above ``t``."""
    k = int(np.searchsorted(s, t, side="right")) - 1  # the last index with s[k] <= t
    if k < 0:
        return 0.0
    if k == len(s) - 1:
        return 1.0
    return (k + (t - s[k]) / (s[k + 1] - s[k])) / (len(s) - 1)


def _level_above(s: np.ndarray, t: float) -> float:
    """inf{u : quantile(u) >= t}: 1 when every value is below ``t``."""
    k = int(np.searchsorted(s, t, side="left"))  # the first index with s[k] >= t
    if k == 0:
        return 0.0
    if k == len(s):
        return 1.0
    return (k - 1 + (t - s[k - 1]) / (s[k] - s[k - 1])) / (len(s) - 1)


def interval(point: float | None, replicates: np.ndarray, level: float = LEVEL,
             bounds: tuple[float | None, float | None] = (None, None)) -> tuple[float | None, float | None]:
    """``point`` plus the central ``level`` quantiles of the replicates' deviations from their mean, moved inside
    ``bounds`` (the metric's range: a true value outside it is impossible, so coverage is kept)."""
    s = _finite_sorted(replicates)
    if point is None or not np.isfinite(point) or len(s) < 2:
        return None, None
    s = _deviations(s)
    lo, hi = point + _quantile(s, (1 - level) / 2), point + _quantile(s, (1 + level) / 2)
    return _clipped(lo, hi, bounds)


def _clipped(lo: float, hi: float, bounds: tuple[float | None, float | None]) -> tuple[float, float]:
    low, high = bounds
    if low is not None:
        lo, hi = max(lo, low), max(hi, low)
    if high is not None:
        lo, hi = min(lo, high), min(hi, high)
    return float(lo), float(hi)


def p_floor(replicates: int) -> float:
    """The smallest two-sided p-value ``replicates`` can tell apart: 2 / (B + 1), as the share (1 + 0) / (B + 1)
    of an estimate beyond every replicate, on both sides."""
    return 2.0 / (replicates + 1)


def p_value(point: float | None, replicates: np.ndarray) -> float | None:
    """Two-sided p-value of ``point`` = 0 under the same rule as ``interval``: the smallest 1 - level at which
    ``interval(point, replicates, level)`` reaches 0 (``interval`` excludes 0 exactly when level > 1 - p), and
    never below ``p_floor`` (the replicates cannot resolve less). So "the 95% interval excludes 0" and
    "p < 0.05" are one statement whenever B >= 40 (p_floor < 0.05).

    The lower bound point + q(level_low) is above 0 while q(u) > -point, that is for u above
    ``_level_below(-point)``; the upper bound is below 0 for u under ``_level_above(-point)``; level_low =
    (1 - level) / 2, so the interval excludes 0 for 1 - level > p = 2 min(those two tail levels).
    """
    s = _finite_sorted(replicates)
    if len(s) < 2 or point is None or not np.isfinite(point):
        return None
    s = _deviations(s)
    tail = min(_level_below(s, -point), 1.0 - _level_above(s, -point))
    return float(min(1.0, max(2.0 * tail, p_floor(len(s)))))


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment (Holm 1979): the i-th smallest of m p-values times (m - i + 1), made
    non-decreasing in that order and capped at 1. Rejecting where the adjusted p < 0.05 keeps the chance of
    any false "better" among the m at most 5%, whatever the metrics' dependence."""
    m = len(p_values)
    adjusted, running = [1.0] * m, 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
