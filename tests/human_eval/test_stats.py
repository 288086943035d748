"""The statistics, pinned against published values and checked by simulation."""
import math

import numpy as np
import pytest

from human_eval.statistics.agreement import krippendorff_alpha_nominal
from human_eval.statistics.bradley_terry import bootstrap_bradley_terry, fit_bradley_terry, win_matrices
from human_eval.statistics.stats import (bootstrap_rate, clustered_wilson_interval, decisive_votes_needed, design_effect,
                              percentile_interval, score_test_p, sign_test, two_way_interval, two_way_variance,
                              wilson_interval)


def test_wilson_interval_known_value():
    lo, hi = wilson_interval(230, 400)  # 57.5% of 400 decisive votes
    assert (round(lo, 3), round(hi, 3)) == (0.526, 0.623)


def test_wilson_interval_edges_stay_in_unit_range():
    lo, hi = wilson_interval(0, 20)
    assert lo == 0 and 0 < hi < 0.2
    lo, hi = wilson_interval(20, 20)
    assert hi == 1 and 0.8 < lo < 1
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def test_intervals_shrink_with_n():
    widths = [np.subtract(*wilson_interval(int(0.6 * n), n)[::-1]) for n in (100, 400, 1600)]
    assert widths[0] > widths[1] > widths[2]
    assert widths[1] / widths[0] == pytest.approx(0.5, abs=0.03)  # 1/sqrt(n)
    rng = np.random.default_rng(0)
    boot = []
    for prompts in (20, 80, 320):
        wins = (rng.random(prompts * 5) < 0.6).astype(float)
        lo, hi = percentile_interval(bootstrap_rate(wins, np.ones_like(wins), np.repeat(np.arange(prompts), 5), 1000, rng))
        boot.append(hi - lo)
    assert boot[0] > boot[1] > boot[2]


def test_sign_test_exact_values():
    assert sign_test(9, 1) == pytest.approx(2 * 11 / 1024)  # P(X <= 1) + P(X >= 9), X ~ Bin(10, 1/2)
    assert sign_test(5, 5) == pytest.approx(1.0)
    assert sign_test(0, 0) == 1.0
    assert sign_test(230, 170) < 0.01 < sign_test(215, 185)


def _clustered_votes(rng, prompts: int, per_prompt: int, spread: bool) -> tuple[np.ndarray, np.ndarray, float]:
    p = rng.random(prompts) if spread else np.full(prompts, 0.5)  # each prompt's own preference rate
    wins = (rng.random((prompts, per_prompt)) < p[:, None]).astype(float).ravel()
    return wins, np.repeat(np.arange(prompts), per_prompt), 0.5


def test_prompt_bootstrap_covers_when_prompts_differ_and_wilson_does_not():
    """Prompts with their own rates make votes correlated: Wilson undercovers, the clustered bootstrap does not."""
    rng = np.random.default_rng(1)
    covered_boot = covered_wilson = 0
    sims = 200
    for _ in range(sims):
        wins, prompts, truth = _clustered_votes(rng, 30, 30, spread=True)
        lo, hi = percentile_interval(bootstrap_rate(wins, np.ones_like(wins), prompts, 500, rng))
        covered_boot += lo <= truth <= hi
        wlo, whi = wilson_interval(int(wins.sum()), len(wins))
        covered_wilson += wlo <= truth <= whi
    assert covered_boot / sims >= 0.88
    assert covered_wilson / sims <= 0.7


def test_clustered_intervals_match_wilson_for_independent_votes():
    """Without prompt or rater effects every interval estimates the same spread (averaged over 20 data sets)."""
    rng = np.random.default_rng(2)
    ratios = []
    for _ in range(20):
        wins, prompts, _ = _clustered_votes(rng, 100, 8, spread=False)
        raters = rng.integers(0, 40, len(wins))
        ones = np.ones_like(wins)
        wilson = np.subtract(*wilson_interval(int(wins.sum()), len(wins))[::-1])
        ratios.append([(hi - lo) / wilson for lo, hi in (
            percentile_interval(bootstrap_rate(wins, ones, prompts, 1000, rng)),
            percentile_interval(bootstrap_rate(wins, ones, raters, 1000, rng)),
            two_way_interval(wins, ones, prompts, raters, 1000, rng))])
    assert np.all(np.abs(np.mean(ratios, axis=0) - 1) < 0.12)


def test_two_way_interval_widens_for_rater_and_prompt_effects():
    rng = np.random.default_rng(3)
    prompts = np.repeat(np.arange(40), 20)
    raters = np.tile(np.arange(20), 40)
    logit = rng.normal(0, 1.2, 40)[prompts] + rng.normal(0, 1.2, 20)[raters]
    wins = (rng.random(len(prompts)) < 1 / (1 + np.exp(-logit))).astype(float)
    ones = np.ones_like(wins)
    by_prompt = np.subtract(*percentile_interval(bootstrap_rate(wins, ones, prompts, 2000, rng))[::-1])
    by_rater = np.subtract(*percentile_interval(bootstrap_rate(wins, ones, raters, 2000, rng))[::-1])
    both = np.subtract(*two_way_interval(wins, ones, prompts, raters, 2000, rng)[::-1])
    wilson = np.subtract(*wilson_interval(int(wins.sum()), len(wins))[::-1])
    assert both >= max(by_prompt, by_rater) * 0.95 and both > 1.5 * wilson


def test_a_few_votes_all_one_way_keep_an_honest_interval():
    """3 of 3 votes for one model: every bootstrap collapses to [100%, 100%]; the default interval does not."""
    wins, ones, ids = np.ones(3), np.ones(3), np.arange(3)
    rng = np.random.default_rng(0)
    assert two_way_interval(wins, ones, ids, ids, 500, rng) == (1.0, 1.0)
    deff = design_effect(3, 3, two_way_variance(wins, ones, ids, ids, 500, rng))
    lo, hi = clustered_wilson_interval(3, 3, deff)
    assert deff == 1.0 and (lo, hi) == pytest.approx(wilson_interval(3, 3)) and 0.3 < lo < 0.5 and hi == 1.0
    lo, hi = clustered_wilson_interval(0, 3, 1.0)
    assert lo == 0.0 and 0.5 < hi < 0.7


def test_clustered_wilson_widens_by_the_design_effect():
    rng = np.random.default_rng(3)
    prompts = np.repeat(np.arange(40), 20)
    raters = np.tile(np.arange(20), 40)
    wins = (rng.random(800) < 1 / (1 + np.exp(-rng.normal(0, 1.2, 40)[prompts]))).astype(float)
    ones = np.ones_like(wins)
    deff = design_effect(wins.sum(), 800, two_way_variance(wins, ones, prompts, raters, 1000, rng))
    lo, hi = clustered_wilson_interval(wins.sum(), 800, deff)
    wlo, whi = wilson_interval(wins.sum(), 800)
    assert deff > 3 and (hi - lo) / (whi - wlo) == pytest.approx(np.sqrt(deff), rel=0.05)
    independent = (rng.random(800) < 0.6).astype(float)
    assert design_effect(independent.sum(), 800, two_way_variance(independent, ones, prompts, raters, 1000, rng)) < 1.3


def test_the_score_test_is_the_interval_read_as_a_p_value():
    """50% lies outside Wilson's interval on the effective votes exactly when the score test's p < 0.05."""
    for n in range(1, 80, 4):
        for k in range(n + 1):
            for deff in (1.0, 1.7, 4.0):
                lo, hi = clustered_wilson_interval(k, n, deff)
                assert (lo > 0.5 or hi < 0.5) == (score_test_p(k, n, deff) < 0.05), (k, n, deff)
    assert score_test_p(0, 0) == 1.0


def test_ties_do_not_count_as_decisive():
    wins = np.array([1, 1, 0, 0, 0, 1], dtype=float)
    decisive = np.array([1, 1, 1, 0, 0, 1], dtype=float)  # two ties
    reps = bootstrap_rate(wins, decisive, np.arange(6), 3000, np.random.default_rng(0))
    assert np.nanmean(reps) == pytest.approx(0.75, abs=0.03)


def test_planner_gives_the_smallest_n_for_the_width():
    n = decisive_votes_needed(0.1, 0.5)
    assert abs(n - 384) < 10  # the normal approximation 1.96^2 * 0.25 / 0.05^2
    width = lambda m: np.subtract(*wilson_interval(0.5 * m, m)[::-1])  # noqa: E731
    assert width(n) <= 0.1 < width(n - 1)
    assert decisive_votes_needed(0.1, 0.8) < n  # rates away from 50% need fewer votes
    assert decisive_votes_needed(0.05, 0.5) > 3.9 * n
    with pytest.raises(ValueError):
        decisive_votes_needed(0)


def test_krippendorff_alpha_published_example():
    """Krippendorff (2011), 'Computing Krippendorff's Alpha-Reliability', nominal data with missing values."""
    A = [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None]
    B = [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3]
    C = [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None]
    D = [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None]
    units = [[v for v in unit if v is not None] for unit in zip(A, B, C, D)]
    assert krippendorff_alpha_nominal(units) == pytest.approx(0.743, abs=5e-4)


def test_krippendorff_alpha_limits():
    assert krippendorff_alpha_nominal([["a", "a"], ["b", "b", "b"], ["none", "none"]]) == 1.0
    rng = np.random.default_rng(0)
    noise = [list(rng.choice(["a", "b", "none"], 3)) for _ in range(2000)]
    assert abs(krippendorff_alpha_nominal(noise)) < 0.05
    assert math.isnan(krippendorff_alpha_nominal([["a"], ["b"]]))  # nothing pairable


def _simulate_bt(rng, truth: np.ndarray, per_pair: int, prompts: int):
    k = len(truth)
    a, b, won, group = [], [], [], []
    for i in range(k):
        for j in range(i + 1, k):
            p = 1 / (1 + np.exp(truth[j] - truth[i]))
            a += [i] * per_pair
            b += [j] * per_pair
            won += list(rng.random(per_pair) < p)
            group += list(rng.integers(0, prompts, per_pair))
    return win_matrices(np.array(a), np.array(b), np.array(won), np.array(group), k)


def test_bradley_terry_recovers_a_synthetic_ranking():
    truth = np.array([1.2, 0.5, 0.0, -0.4, -1.3])
    centred = truth - truth.mean()
    rng = np.random.default_rng(0)
    covered, sims = 0, 10
    for _ in range(sims):
        per_prompt = _simulate_bt(rng, truth, 400, 50)  # (50 prompts, 5, 5)
        scores = fit_bradley_terry(per_prompt.sum(0))
        assert list(np.argsort(-scores)) == [0, 1, 2, 3, 4]
        assert np.abs(scores - centred).max() < 0.3
        reps = bootstrap_bradley_terry(per_prompt, 300, rng)
        covered += sum(lo <= t <= hi for (lo, hi), t in zip((percentile_interval(reps[:, i]) for i in range(5)), centred))
    assert covered / (5 * sims) >= 0.84  # 95% intervals
    width = lambda r: np.mean([np.subtract(*percentile_interval(r[:, i])[::-1]) for i in range(5)])  # noqa: E731
    small = bootstrap_bradley_terry(_simulate_bt(rng, truth, 100, 50), 300, rng)
    assert width(reps) < 0.7 * width(small)  # 4x the votes, about half the width


def test_bradley_terry_keeps_a_model_that_never_won_finite():
    wins = np.array([[0, 10, 10], [0, 0, 6], [0, 4, 0]], dtype=float)
    scores = fit_bradley_terry(wins)
    assert np.all(np.isfinite(scores)) and scores[0] > scores[1] > scores[2]
    assert scores.mean() == pytest.approx(0, abs=1e-9)
