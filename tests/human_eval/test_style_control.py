"""Bradley-Terry with image covariates: the fit against a general optimiser, and a preference for brightness
that the plain fit credits to a model and the controlled fit to brightness."""
import numpy as np
import pytest
from scipy.optimize import minimize

from human_eval.statistics.style_control import bradley_terry_with_covariates, covariate_differences, fit_logistic


def test_newton_fit_matches_a_general_optimiser():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4))
    y = (rng.random(400) < 1 / (1 + np.exp(-(x @ np.array([1.0, -0.5, 0.0, 2.0]))))).astype(float)
    w, cov = fit_logistic(x, y, ridge=1e-4)

    def loss(v):  # the same penalised negative log-likelihood
        z = x @ v
        return np.sum(np.logaddexp(0, z) - y * z) + 0.5e-4 * v @ v

    reference = minimize(loss, np.zeros(4), method="BFGS", options={"gtol": 1e-10})
    assert w == pytest.approx(reference.x, abs=1e-5)
    assert np.all(np.diag(cov) > 0) and np.allclose(cov, cov.T)


def simulated_votes(n: int, rng: np.random.Generator):
    """Three equally good models; 'bright' makes brighter images, and raters prefer brighter images."""
    models = ("bright", "plain", "other")
    mean_brightness = {"bright": 0.62, "plain": 0.5, "other": 0.5}
    a = rng.integers(0, 3, n)
    b = (a + rng.integers(1, 3, n)) % 3  # another model
    cov = {side: [{"brightness": rng.normal(mean_brightness[models[m]], 0.08), "saturation": rng.uniform(0.2, 0.6),
                   "file_bytes": rng.uniform(3e4, 6e4), "pixels": 512 * 512} for m in idx]
           for side, idx in (("a", a), ("b", b))}
    d_bright = np.array([ca["brightness"] - cb["brightness"] for ca, cb in zip(cov["a"], cov["b"])])
    a_won = rng.random(n) < 1 / (1 + np.exp(-d_bright / 0.08))  # one SD of brightness: odds e : 1
    return models, a, b, a_won, cov


def test_a_brightness_preference_is_credited_to_brightness_once_controlled():
    models, a, b, a_won, cov = simulated_votes(3000, np.random.default_rng(1))
    diffs, kept = covariate_differences(cov["a"], cov["b"], ("brightness", "saturation", "file_bytes", "pixels"))
    assert kept == ["brightness", "saturation", "file_bytes"]  # every image has the same pixel count
    fit = bradley_terry_with_covariates(a, b, a_won, diffs, 3)
    plain, controlled = fit["plain"], fit["controlled"]
    assert plain["scores"][0] - 1.96 * plain["se"][0] > 0.2  # the plain fit: 'bright' is the better model
    for i in range(3):  # controlled: no model is better than the others
        assert abs(controlled["scores"][i]) < 1.96 * controlled["se"][i] + 0.02
    coef, se = controlled["coef"], controlled["coef_se"]
    assert coef[0] - 1.96 * se[0] > 0.5  # brightness carries the preference
    assert all(abs(c) < 2.6 * s for c, s in zip(coef[1:], se[1:]))  # saturation and size do not
