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

A per-image mean and a paired difference of means take the t-interval on their per-prompt contributions instead, at
every size (``prompt_contributions``, ``t_interval``, ``t_p_value``): with 8 prompts the percentile interval above
covered 84.5-89.7% (its known small-sample narrowness), the t-interval 93.1-95.2%; at 250 prompts the percentile
interval 91.6-94.7%, the t-interval 92.8-95.3% on the same draws (``bench/coverage.py``, BENCHMARKS.md). Its p is
the same interval's, as above. ``flip`` counts the prompts whose removal would make a difference's interval reach 0.
"""
from __future__ import annotations

import itertools

import numpy as np
from scipy import stats

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


# A per-image mean's interval is the t-interval on per-prompt contributions at every size. Measured by
# bench/coverage.py (1,000 draws a line, 1, 2 and 4 images a prompt, normal and skewed prompt effects): the percentile
# interval covered 76-80% at 4 prompts, 85-90% at 8, 91.5-94.3% at 50 and 91.6-94.7% at 250 (z for t and a
# resample's variance (P - 1) / P of the sample's make it narrow); the t-interval 92.3-96.3% at every size, 92.8-95.3%
# at 250 (its 92.8%, a single mean of normal effects with 4 images a prompt, was 95.2% on 4,000 fresh draws).
# A set metric's paired difference B - A (FID, KID, CMMD, FD-DINOv2) gets no interval below this many prompts.
# bench/coverage.py drew both checkpoints' 16-d features on the same prompts (2 images each, each prompt's effect
# shared), 200 draws a line: the paired interval covered E[FID_B - FID_A] in 87.0-87.5% of draws at 4 prompts (B
# nearer the reference, and the two alike: a false verdict in 12.5%), 93.0-94.5% at 8 and 97.0-99.5% from 12 to 250;
# KID's 95.5-100% at every size. Nothing was measured between 4 and 8, so every set metric waits for 8.
SET_MIN_PROMPTS = 8
# The t-interval covered 92.3-92.8% (not 95%) where per-prompt effects were skewed (an exponential: skewness 2) and
# 4 images a prompt averaged the image noise away, at 4, 12 and 20 prompts (on 4,000 fresh draws: 92.2% at 4, 93.0%
# at 12 and 93.5% at 20); at 50 and more, 93.7% or more.
SKEWED = 1.0  # |sample skewness| of the contributions from which a t-interval below SKEW_PROMPTS is warned of
SKEW_PROMPTS = 50


def set_too_few(n_prompts: int) -> str:
    """The one-line warning a set metric's difference shows instead of an interval below ``SET_MIN_PROMPTS``."""
    return (f"{n_prompts} prompts: below {SET_MIN_PROMPTS} a set metric's paired interval was not measured to cover "
            f"(FID's covered 87% at 4 in bench/coverage.py)")


def skew_warning(contributions: np.ndarray) -> str | None:
    """A one-line warning where the t-interval may cover less than 95%: fewer than ``SKEW_PROMPTS`` prompts whose
    contributions are skewed (|sample skewness| of at least ``SKEWED``); None otherwise."""
    c = np.asarray(contributions, dtype=np.float64)
    if len(c) >= SKEW_PROMPTS or len(c) < 3 or c.std() == 0:
        return None
    skewness = float(((c - c.mean()) ** 3).mean() / c.std() ** 3)
    if abs(skewness) < SKEWED:
        return None
    return (f"skewed per-prompt differences (skewness {skewness:+.1f}) at {len(c)} prompts: such intervals covered "
            f"about 92% instead of 95% in bench/coverage.py")


def prompt_contributions(prompt_ids: np.ndarray, values: np.ndarray,
                         baseline: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(prompts, contributions): one value c_p per prompt with a defined value, whose mean is the image mean of
    ``values`` (minus that of ``baseline``: a paired difference B - A) and whose sd / sqrt(P) is that mean's
    prompt-clustered standard error. c_p = mean + P sum_i (y_i - mean) / n over the prompt's defined images
    (NaN does not count); with the same number of images on every prompt, c_p is the prompt's own mean."""
    ids = np.asarray(prompt_ids)
    sides = [np.asarray(v, dtype=np.float64) for v in ((values,) if baseline is None else (values, baseline))]
    present = np.logical_or.reduce([~np.isnan(v) for v in sides])
    prompts, inverse = np.unique(ids[present], return_inverse=True)
    total = np.zeros(len(prompts))
    for sign, v in zip((1.0, -1.0), sides):
        v = v[present]
        ok = ~np.isnan(v)
        if ok.any():
            mean = v[ok].mean()
            total += sign * (mean + len(prompts) * np.bincount(inverse[ok], v[ok] - mean, len(prompts)) / ok.sum())
    return prompts, total


def _t_parts(contributions: np.ndarray, level: float) -> tuple[float, float, float]:
    """(mean, standard error, critical t) of contributions on P - 1 degrees of freedom."""
    c = np.asarray(contributions, dtype=np.float64)
    se = 0.0 if c.min() == c.max() else float(c.std(ddof=1) / np.sqrt(len(c)))
    return float(c.mean()), se, float(stats.t.ppf((1 + level) / 2, len(c) - 1))


def t_interval(contributions: np.ndarray, level: float = LEVEL,
               bounds: tuple[float | None, float | None] = (None, None)) -> tuple[float | None, float | None]:
    """mean -+ t_{P-1} sd / sqrt(P) of the per-prompt contributions, kept inside ``bounds``; None with fewer than 2."""
    if len(contributions) < 2:
        return None, None
    mean, se, t = _t_parts(contributions, level)
    return _clipped(mean - t * se, mean + t * se, bounds)


def t_p_value(contributions: np.ndarray, replicates: int) -> float | None:
    """The smallest 1 - level at which ``t_interval`` reaches 0: 2 P(T_{P-1} > |mean| / se), kept at or above
    ``p_floor(replicates)`` like the bootstrap's p, so the Holm-adjusted words read the same at every size."""
    if len(contributions) < 2:
        return None
    mean, se, _ = _t_parts(contributions, LEVEL)
    p = (1.0 if mean == 0 else 0.0) if se == 0 else float(2 * stats.t.sf(abs(mean) / se, len(contributions) - 1))
    return float(min(1.0, max(p, p_floor(replicates))))


def mean_interval(prompt_ids: np.ndarray, values: np.ndarray, baseline: np.ndarray | None, replicates: np.ndarray,
                  bounds: tuple[float | None, float | None] = (None, None)) -> dict:
    """A per-image mean's (or paired difference's) ``lo``, ``hi``, ``p`` and ``rule`` ("t"): the t-interval on the
    per-prompt contributions of the prompts with a value, at every size, and ``warning`` where ``skew_warning`` gives
    one. The bootstrap ``replicates`` set only p's floor (those defined, as ``t_p_value`` reads them)."""
    _, c = prompt_contributions(prompt_ids, values, baseline)
    lo, hi = t_interval(c, bounds=bounds)
    warned = skew_warning(c)
    return {"lo": lo, "hi": hi, "p": t_p_value(c, int(np.isfinite(replicates).sum())), "rule": "t",
            **({"warning": warned} if warned else {})}


def _reaches_zero(total: np.ndarray, squares: np.ndarray, m: int) -> np.ndarray:
    """Whether the t-interval's lower bound of ``m`` contributions with these sums (arrays: several sets) is <= 0."""
    if m < 2:
        return np.ones_like(total, dtype=bool)
    mean = total / m
    var = np.maximum(squares - m * mean * mean, 0.0) / (m - 1)
    return mean - stats.t.ppf((1 + LEVEL) / 2, m - 1) * np.sqrt(var / m) <= 1e-12 * np.maximum(1.0, abs(mean))


def flip(prompts: np.ndarray, contributions: np.ndarray, favours_positive: bool) -> dict:
    """The fewest prompts whose removal makes the t-interval of the rest reach 0, and which: ``count``, ``prompts``
    (ids), ``exact`` True.

    For a mean of contributions, the set to remove is searched among the runs of consecutive values in sorted order
    (for each k, the P - k + 1 runs of length k, from prefix sums): removing a run leaves the rest with the lowest
    mean for its spread. Checked against every subset (``flip_by_subsets``): the two agreed on each of 4,000 random
    sets of 3 to 10 values (normal, exponential and rounded), and tests/evaluate/test_small_sizes.py checks 200 more. With 1 prompt left there is no interval,
    so P - 1 removals always flip a verdict."""
    c = np.asarray(contributions, dtype=np.float64) * (1.0 if favours_positive else -1.0)
    order = np.argsort(c, kind="stable")
    s = c[order]
    n = len(s)
    sums, squares = np.concatenate([[0.0], np.cumsum(s)]), np.concatenate([[0.0], np.cumsum(s * s)])
    for k in range(0, n):
        starts = np.arange(n - k + 1)
        left = _reaches_zero(sums[-1] - (sums[starts + k] - sums[starts]),
                             squares[-1] - (squares[starts + k] - squares[starts]), n - k)
        if left.any():
            a = int(np.flatnonzero(left)[-1])  # the run highest in the order: the prompts that carry the verdict
            return {"count": k, "prompts": [_plain(p) for p in np.asarray(prompts)[order[a:a + k]]], "exact": True}
    return {"count": n, "prompts": [_plain(p) for p in prompts], "exact": True}


def flip_by_subsets(contributions: np.ndarray, favours_positive: bool) -> int:
    """The same count as ``flip``, by trying every subset (small sets only: the check ``flip`` is tested against)."""
    c = np.asarray(contributions, dtype=np.float64) * (1.0 if favours_positive else -1.0)
    for k in range(len(c) + 1):
        for removed in itertools.combinations(range(len(c)), k):
            rest = np.delete(c, removed)
            if _reaches_zero(np.array([rest.sum()]), np.array([(rest * rest).sum()]), len(rest))[0]:
                return k
    return len(c)


def _plain(x):
    return x.item() if hasattr(x, "item") else x
