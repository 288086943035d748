"""Bradley-Terry with nuisance covariates: model strengths with and without what raters may prefer anyway.

LMSYS's style control (Li et al. 2024, "Does style matter? Disentangling style and substance in
Chatbot Arena") adds the difference of response features to the Bradley-Terry logit; for images the
features are mean brightness, saturation, file size and pixel count (`human_eval.images.covariates`):

    P(a preferred over b) = sigmoid(beta_a - beta_b + sum_k gamma_k d_k),

where d_k is the standardised difference of covariate k between image a and image b (brightness and
saturation as differences, file size and pixels as log-ratios). The fit is a logistic regression by
Newton's method, with the last model's beta fixed at 0 and a tiny ridge so a model that never lost stays
finite; scores are reported centred on the models' mean, with 95% Wald intervals from the inverse
Hessian. Without covariates it is the ordinary Bradley-Terry fit, so both columns are comparable.
"""
from __future__ import annotations

import math

import numpy as np

from .stats import Z95

COVARIATES = ("brightness", "saturation", "file_bytes", "pixels")
LOG_SCALE = frozenset({"file_bytes", "pixels"})  # compared as log-ratios: twice the bytes is one step either way


def fit_logistic(x: np.ndarray, y: np.ndarray, ridge: float = 1e-4, iters: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients and their covariance for P(y = 1) = sigmoid(x @ w), no intercept.

    x: (V, P) float64; y: (V,) 0/1. Newton-Raphson on the log-likelihood minus ridge/2 * |w|^2.
    """
    w = np.zeros(x.shape[1])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-(x @ w)))  # (V,)
        gradient = x.T @ (y - p) - ridge * w  # (P,)
        hessian = (x * (p * (1 - p))[:, None]).T @ x + ridge * np.eye(len(w))  # (P, P) negative Hessian
        step = np.linalg.solve(hessian, gradient)
        w = w + step
        if np.max(np.abs(step)) < 1e-10:
            break
    p = 1 / (1 + np.exp(-(x @ w)))
    hessian = (x * (p * (1 - p))[:, None]).T @ x + ridge * np.eye(len(w))
    return w, np.linalg.inv(hessian)


def covariate_differences(cov_a: list[dict], cov_b: list[dict], names: tuple[str, ...]) -> tuple[np.ndarray, list[str]]:
    """(V, C) standardised differences of the named covariates between each vote's images; constant ones dropped."""
    columns, kept = [], []
    for name in names:
        a = np.array([c[name] for c in cov_a], dtype=np.float64)
        b = np.array([c[name] for c in cov_b], dtype=np.float64)
        d = np.log(np.maximum(a, 1e-12)) - np.log(np.maximum(b, 1e-12)) if name in LOG_SCALE else a - b
        sd = d.std()
        if sd > 1e-12:
            columns.append(d / sd)
            kept.append(name)
    return (np.stack(columns, 1) if columns else np.zeros((len(cov_a), 0))), kept


def _centred_scores(w: np.ndarray, cov: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores centred on their mean from the first k-1 coefficients (the last model's is 0), with standard errors."""
    to_scores = np.eye(k)[:, : k - 1] - np.full((k, k - 1), 1 / k)  # (K, K-1): beta (last = 0) minus its mean
    scores = to_scores @ w[: k - 1]
    se = np.sqrt(np.maximum(np.diag(to_scores @ cov[: k - 1, : k - 1] @ to_scores.T), 0))
    return scores, se


def bradley_terry_with_covariates(a: np.ndarray, b: np.ndarray, a_won: np.ndarray, diffs: np.ndarray,
                                  k: int) -> dict:
    """Fit with and without the covariate columns `diffs` (V, C); a, b: (V,) model indices; a_won: (V,) bool."""
    design = np.zeros((len(a), k - 1))  # (V, K-1): +1 for model a, -1 for model b, the last model left out
    rows = np.arange(len(a))
    for models, sign in ((a, 1.0), (b, -1.0)):
        mask = models < k - 1
        design[rows[mask], models[mask]] += sign
    y = a_won.astype(np.float64)
    out = {}
    for name, x in (("plain", design), ("controlled", np.hstack([design, diffs]))):
        w, cov = fit_logistic(x, y)
        scores, se = _centred_scores(w, cov, k)
        out[name] = {"scores": scores, "se": se, "coef": w[k - 1:], "coef_se": np.sqrt(np.diag(cov))[k - 1:]}
    return out


def interval(value: float, se: float) -> tuple[float, float]:
    return (value - Z95 * se, value + Z95 * se) if math.isfinite(se) else (math.nan, math.nan)
