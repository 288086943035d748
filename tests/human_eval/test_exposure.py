"""Bradley-Terry reweighted for unequal exposure: a model shown three times as often gets, in expectation, the score
it gets when every pair is shown equally often."""
import numpy as np

from human_eval.statistics.bradley_terry import bootstrap_bradley_terry, exposure_weights, fit_bradley_terry

# Preferences that go round in a circle (0 beats 1, 1 beats 2, 2 beats 0): no Bradley-Terry model fits them exactly,
# so where the votes fall decides the fit.
PREFERRED = np.array([[0.0, 0.7, 0.4], [0.3, 0.0, 0.7], [0.6, 0.3, 0.0]])  # [i, j]: P(i beats j)


def expected_wins(shown: np.ndarray) -> np.ndarray:
    """(1, K, K) expected wins of one prompt: each pair's votes times its preference."""
    return (shown * PREFERRED)[None]


def test_a_model_shown_three_times_as_often_keeps_its_score_in_expectation():
    equal = np.full((3, 3), 100.0) - 100.0 * np.eye(3)
    often = equal.copy()
    often[0, 1:] = often[1:, 0] = 300.0  # model 0's pairs shown three times as often
    fair = fit_bradley_terry(expected_wins(equal).sum(0), prior=0.0)
    weighted = expected_wins(often) * exposure_weights(expected_wins(often))
    assert np.allclose(fit_bradley_terry(weighted.sum(0), prior=0.0), fair, atol=1e-6)
    unweighted = fit_bradley_terry(expected_wins(often).sum(0), prior=0.0)
    assert np.abs(unweighted - fair).max() > 0.2  # without the weights, exposure moves the scores (0.27 here)


def test_exposure_weights_leave_equal_exposure_alone_and_the_interval_resamples_prompts():
    rng = np.random.default_rng(0)
    per_prompt = rng.poisson(3.0, (12, 3, 3)).astype(float) * (1 - np.eye(3))
    per_prompt[:, 0, 1] += 5  # model 0 beats model 1 more often; the pair (0, 1) is also shown more
    weights = exposure_weights(per_prompt)
    games = per_prompt.sum(0) + per_prompt.sum(0).T
    assert np.allclose(weights * games, (games.sum() / 6) * (1 - np.eye(3)))  # every pair weighs the same
    assert np.allclose(exposure_weights(np.ones((2, 3, 3)) - np.eye(3)), 1 - np.eye(3))
    replicates = bootstrap_bradley_terry(per_prompt * weights, 200, np.random.default_rng(1))
    lo, hi = np.percentile(replicates[:, 0], [2.5, 97.5])
    assert lo < fit_bradley_terry((per_prompt * weights).sum(0))[0] < hi


def test_the_greedy_count_flips_a_bradley_terry_score_and_is_marked_an_upper_bound():
    """Three models over 10 prompts, model 0 clearly strongest: removing the votes the greedy search names (its wins)
    makes its recomputed interval reach 0, and removing one fewer does not; the count is marked an upper bound."""
    from human_eval.statistics.bradley_terry import _interval_reaches_zero, bradley_terry_flip

    per_prompt = np.zeros((10, 3, 3))
    per_prompt[:, 0, 1] = per_prompt[:, 0, 2] = 2  # model 0 wins twice against each other model on every prompt
    per_prompt[:, 1, 0] = per_prompt[::3, 2, 0] = 1
    per_prompt[:, 1, 2] = per_prompt[:, 2, 1] = 1
    found = bradley_terry_flip(per_prompt, 0, n_boot=100)
    assert not found["exact"] and 1 <= found["count"] <= per_prompt[:, 0].sum()
    rest = per_prompt.copy()
    for g, j in found["votes"]:
        rest[g, 0, j] -= 1
    assert _interval_reaches_zero(rest, 0, True, 100, 0)
    g, j = found["votes"][-1]
    rest[g, 0, j] += 1
    assert not _interval_reaches_zero(rest, 0, True, 100, 0)
