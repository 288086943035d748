"""Preference rates and their uncertainty: Wilson intervals, clustered bootstraps, the sign test, planning.

A *decisive* vote prefers one image; a tie is "no preference", or, in a study that asks, "both good" or "both
bad" (``DECISIVE``). The preference rate of model a over b is wins_a / decisive, as in Imagen's DrawBench
evaluation and the SD2 replication's comparison: ties of every kind are left out of it.

Votes on the same prompt, or by the same rater, are correlated, so an interval that treats every vote
as independent (Wilson) is too narrow when prompts or raters differ. The clustered bootstraps resample
whole prompts or whole raters and take the 2.5th and 97.5th percentiles of the rate; the two-way
interval combines both (prompts and raters are crossed, not nested). A bootstrap has no spread to show
when every vote went one way, though: 3 of 3 gave [100%, 100%]. The report's default is therefore
Wilson's interval on the *effective* number of votes, n / design effect, where the design effect is the
two-way bootstrap variance over the binomial one (at least 1): it keeps Wilson's coverage at small n and
widens as much as clustering asks (``clustered_wilson_interval``). Its score test (``score_test_p``)
is the same rule read as a p-value: 50% lies outside the interval exactly when p < 0.05.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.stats import binomtest, norm

from .resampling import DESIGN_EFFECT_REPLICATES, DESIGN_EFFECT_SEED

Z95 = float(norm.ppf(0.975))  # 1.959964...
DECISIVE = ("a", "b")  # the choices that prefer an image; "none", "good" and "bad" are ties


def is_decisive(choice: str) -> bool:
    """Whether a vote's choice prefers one of the two images (a tie of any kind does not)."""
    return choice in DECISIVE


def wilson_interval(k: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (Wilson 1927); (nan, nan) when n == 0. k and n may be
    fractional (effective numbers of votes)."""
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


def two_way_variance(wins: np.ndarray, decisive: np.ndarray, prompts: np.ndarray, raters: np.ndarray,
                     n_boot: int = 2000, rng: np.random.Generator | None = None) -> float:
    """The rate's variance clustered by prompt *and* by rater at once (two-way clustering).

    var(by prompt) + var(by rater) - var(by prompt-and-rater cell), each from a cluster bootstrap: the
    multiway-clustering combination of Cameron, Gelbach & Miller (2011), kept at least as large as either
    one-way variance. nan without a decisive vote.
    """
    rng = rng or np.random.default_rng(0)
    if decisive.sum() == 0:
        return math.nan
    cells = np.unique(np.stack([np.unique(prompts, return_inverse=True)[1],
                                np.unique(raters, return_inverse=True)[1]]), axis=1, return_inverse=True)[1]
    var = {name: np.nanvar(bootstrap_rate(wins, decisive, ids, n_boot, rng))
           for name, ids in (("prompt", prompts), ("rater", raters), ("cell", cells))}
    return float(max(var["prompt"] + var["rater"] - var["cell"], var["prompt"], var["rater"]))


def two_way_interval(wins: np.ndarray, decisive: np.ndarray, prompts: np.ndarray, raters: np.ndarray,
                     n_boot: int = 2000, rng: np.random.Generator | None = None, z: float = Z95,
                     variance: float | None = None) -> tuple[float, float]:
    """The rate +- z two-way clustered standard errors (``two_way_variance``, or ``variance`` when known)."""
    n = decisive.sum()
    if n == 0:
        return (math.nan, math.nan)
    rate = wins.sum() / n
    var = two_way_variance(wins, decisive, prompts, raters, n_boot, rng) if variance is None else variance
    se = math.sqrt(var)
    return (float(max(0.0, rate - z * se)), float(min(1.0, rate + z * se)))


def design_effect(k: float, n: float, variance: float) -> float:
    """How many times the binomial variance p (1 - p) / n the clustered ``variance`` is, at least 1 (clustering
    never makes votes worth more); 1 when every vote went one way (neither variance can be measured), nan
    without a vote."""
    if n == 0 or math.isnan(variance):
        return math.nan
    binomial = (k / n) * (1 - k / n) / n
    return 1.0 if binomial == 0 else max(1.0, variance / binomial)


def clustered_wilson_interval(k: float, n: float, deff: float, z: float = Z95) -> tuple[float, float]:
    """Wilson's interval on the effective number of votes: k / deff wins of n / deff (Kish's effective sample
    size). It stays inside [0, 1] and never shrinks to a point, as a bootstrap does when every vote agrees."""
    deff = 1.0 if math.isnan(deff) else max(deff, 1.0)
    return wilson_interval(k / deff, n / deff, z)




def effective_votes(wins: np.ndarray, decisive: np.ndarray, prompts: np.ndarray, raters: np.ndarray) -> dict:
    """One share's uncertainty as every human-eval surface gives it: the two-way clustered ``variance`` (prompts
    and raters), its ``design_effect``, Wilson's interval on the effective number of votes (``clustered_wilson``)
    and its score test's p (``score_test_p``), from ``DESIGN_EFFECT_REPLICATES`` draws seeded ``DESIGN_EFFECT_SEED``.

    wins, decisive: (V,) 0/1 per vote; prompts, raters: (V,) each vote's cluster ids. The clusters are resampled in
    sorted order, so the votes' order does not matter, and one model's share and the other's (wins = decisive -
    wins) get the same design effect."""
    variance = two_way_variance(wins, decisive, prompts, raters, DESIGN_EFFECT_REPLICATES,
                                np.random.default_rng(DESIGN_EFFECT_SEED))
    k, n = float(wins.sum()), float(decisive.sum())
    deff = design_effect(k, n, variance)
    return {"variance": variance, "design_effect": deff, "clustered_wilson": clustered_wilson_interval(k, n, deff),
            "score_test_p": score_test_p(k, n, deff)}


def score_test_p(k: float, n: float, deff: float = 1.0) -> float:
    """Two-sided score test of a 50/50 preference on n / deff effective votes: the p-value read off the same rule
    as ``clustered_wilson_interval`` (Wilson's interval is the score test inverted), so 50% lies outside that
    interval exactly when p < 0.05. 1.0 without a vote."""
    if n == 0:
        return 1.0
    deff = 1.0 if math.isnan(deff) else max(deff, 1.0)
    z = (k / n - 0.5) / math.sqrt(0.25 * deff / n)
    return float(2 * norm.sf(abs(z)))


def decisive_votes_needed(width: float, p: float = 0.5, z: float = Z95) -> int:
    """The fewest decisive votes whose Wilson interval at rate `p` is at most `width` wide (e.g. 0.1 = +-5 points).

    p = 0.5 is the worst case; the observed rate gives a less conservative plan. Clustering by prompt and
    rater widens intervals further: multiply by the design effect (``design_effect``).
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


def votes_to_flip(k: float, n: float, deff: float = 1.0) -> int | None:
    """The fewest decisive votes whose removal makes ``clustered_wilson_interval`` of k wins in n reach 50% (the
    design effect held at the study's), or None where it already holds 50%. Removing one of the leading side's wins
    moves the share towards 50% and removing one of its losses away from it, so the fewest are the leading side's
    wins alone, and the count is exact: the smallest m with ``score_test_p(k - m, n - m)`` >= 0.05 (none left: no
    interval, so all of its wins always flip it)."""
    lead = max(k, n - k)
    if n == 0 or score_test_p(lead, n, deff) >= 0.05:
        return None
    for m in range(1, int(lead) + 1):
        if n - m == 0 or score_test_p(lead - m, n - m, deff) >= 0.05 or lead - m <= (n - m) / 2:
            return m
    return int(lead)


def vote_flip(leading: list[dict], prompts: list, k: float, n: float, deff: float) -> dict | None:
    """``votes_to_flip`` of k wins in n as results keep it: ``count``, the ``votes`` that would do it (``pair_id``
    and ``rater_id`` of the leading side's votes, those on the prompts it won most often first; any as many of
    its votes do the same) and ``exact`` (True: the design effect held at the study's). ``leading``: the leading
    side's votes, ``prompts`` their prompts; None where the interval already holds 50%."""
    count = votes_to_flip(k, n, deff)
    if count is None:
        return None
    per_prompt: dict = {}
    for p in prompts:
        per_prompt[p] = per_prompt.get(p, 0) + 1
    order = sorted(range(len(leading)), key=lambda i: (-per_prompt[prompts[i]], str(prompts[i]),
                                                       leading[i]["pair_id"], leading[i]["rater_id"]))
    return {"count": count, "votes": [{"pair_id": leading[i]["pair_id"], "rater_id": leading[i]["rater_id"]}
                                      for i in order[:count]], "exact": True}
