"""Bradley-Terry scores for three or more models from pairwise wins, with bootstrap intervals.

P(i beats j) = s_i / (s_i + s_j) (Bradley & Terry 1952). Strengths are fitted with Hunter's (2004)
minorize-maximize update, s_i <- W_i / sum_j n_ij / (s_i + s_j), and reported as log-strengths centred
on the models' mean, so a difference of 1 is odds of e : 1. Ties are left out (decisive votes only).
A small pseudo-count on every compared pair keeps a model that never won finite.
"""
from __future__ import annotations

import numpy as np


def fit_bradley_terry(wins: np.ndarray, prior: float = 0.1, iters: int = 10000, tol: float = 1e-10) -> np.ndarray:
    """Log-strengths (mean 0) from wins[..., i, j] = times i beat j; batched over leading dimensions.

    wins: (..., K, K). Returns (..., K).
    """
    wins = np.asarray(wins, dtype=float)
    k = wins.shape[-1]
    compared = (wins + np.swapaxes(wins, -1, -2)) > 0
    wins = wins + prior * compared  # (..., K, K)
    games = wins + np.swapaxes(wins, -1, -2)  # (..., K, K) n_ij
    total = wins.sum(-1)  # (..., K) W_i
    s = np.ones(wins.shape[:-1])  # (..., K)
    for _ in range(iters):
        denom = (games / (s[..., :, None] + s[..., None, :])).sum(-1)  # (..., K)
        new = np.where(denom > 0, total / np.where(denom > 0, denom, 1), s)
        new = new / np.exp(np.log(np.maximum(new, 1e-300)).mean(-1, keepdims=True))  # geometric mean 1
        if np.max(np.abs(new - s)) < tol:
            s = new
            break
        s = new
    scores = np.log(np.maximum(s, 1e-300))
    return scores - scores.mean(-1, keepdims=True) * (k > 0)


def win_matrices(a: np.ndarray, b: np.ndarray, a_won: np.ndarray, groups: np.ndarray, k: int) -> np.ndarray:
    """Per-group win matrices from decisive votes: (G, K, K), [g, i, j] = times i beat j in group g.

    a, b: (V,) model indices of each vote's pair; a_won: (V,) bool; groups: (V,) group index in [0, G).
    """
    winner = np.where(a_won, a, b)
    loser = np.where(a_won, b, a)
    out = np.zeros((int(groups.max()) + 1 if len(groups) else 0, k, k))
    np.add.at(out, (groups, winner, loser), 1)
    return out


def bootstrap_bradley_terry(per_group: np.ndarray, n_boot: int = 1000, rng: np.random.Generator | None = None,
                            chunk: int = 200) -> np.ndarray:
    """Replicate log-strengths resampling whole groups (prompts) with replacement: (n_boot, K).

    per_group: (G, K, K) win matrices, one per prompt.
    """
    rng = rng or np.random.default_rng(0)
    g = per_group.shape[0]
    out = []
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        counts = rng.multinomial(g, np.full(g, 1 / g), size=b).astype(float)  # (b, G)
        out.append(fit_bradley_terry(np.einsum("bg,gij->bij", counts, per_group), iters=2000, tol=1e-8))
    return np.concatenate(out)
