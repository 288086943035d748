"""Bradley-Terry scores for three or more models from pairwise wins, with bootstrap intervals.

P(i beats j) = s_i / (s_i + s_j) (Bradley & Terry 1952). Log-strengths are fitted by Newton's method (the
log-likelihood is concave in them) and reported centred on the models' mean, so a difference of 1 is odds of
e : 1. Hunter's (2004) minorize-maximize update, used before, crawls where one model wins nearly every vote: 2,000
replicates of 3 models took 0.26 s to within 2e-8 of the answer by MM, 0.014 s to within 2e-12 by Newton. Ties are left out (decisive votes only).
A small pseudo-count on every compared pair keeps a model that never won finite.

Pairs shown unequally often are reweighted as LMArena reweights them: each vote counts by the inverse of its pair's
share of the votes (``exposure_weights``), so every compared pair weighs as much as under equal exposure. Where
preferences are not exactly Bradley-Terry (they never are), the unweighted fit leans towards the pairs shown most:
with three models whose preferences go round in a circle and one of them shown three times as often, the unweighted
fit moved the other two models' scores by 0.27 from their equal-exposure scores, the reweighted fit by nothing
(tests/human_eval/test_exposure.py, expected wins).
"""
from __future__ import annotations

import numpy as np


def fit_bradley_terry(wins: np.ndarray, prior: float = 0.1, iters: int = 100, tol: float = 1e-10) -> np.ndarray:
    """Log-strengths (mean 0) from wins[..., i, j] = times i beat j; batched over leading dimensions.

    wins: (..., K, K). Returns (..., K). Newton's method on the log-likelihood, which is concave in the
    log-strengths, each step halved where it would lower the likelihood, until no strength moves by ``tol``.
    """
    wins = np.asarray(wins, dtype=float)
    k = wins.shape[-1]
    compared = (wins + np.swapaxes(wins, -1, -2)) > 0
    wins = wins + prior * compared  # (..., K, K)
    games = wins + np.swapaxes(wins, -1, -2)  # (..., K, K) n_ij
    total = wins.sum(-1)  # (..., K) W_i
    theta = np.zeros(wins.shape[:-1])  # (..., K)
    if k == 0:
        return theta
    fixed = np.ones((k, k)) / k + 1e-9 * np.eye(k)  # pins the mean (the one free direction) and unlinked models
    for _ in range(iters):
        p = 1 / (1 + np.exp(theta[..., None, :] - theta[..., :, None]))  # P(i beats j)
        curvature = games * p * (1 - p)
        step = np.linalg.solve(np.eye(k) * curvature.sum(-1)[..., None] - curvature + fixed,
                               (total - (games * p).sum(-1))[..., None])[..., 0]
        theta, moved = _halved_until_better(theta, step, wins)
        if np.max(np.abs(moved), initial=0.0) < tol:
            break
    return theta - theta.mean(-1, keepdims=True)


def _log_likelihood(theta: np.ndarray, wins: np.ndarray) -> np.ndarray:
    return -(wins * np.logaddexp(0, theta[..., None, :] - theta[..., :, None])).sum((-1, -2))


def _halved_until_better(theta: np.ndarray, step: np.ndarray, wins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``theta + step``, the step halved (up to 30 times) for each fit whose likelihood it would lower; the new
    log-strengths centred, and the step taken."""
    before = _log_likelihood(theta, wins)
    scale = np.ones(theta.shape[:-1])
    for _ in range(30):
        new = theta + scale[..., None] * step
        worse = _log_likelihood(new, wins) < before - 1e-12
        if not worse.any():
            break
        scale = np.where(worse, scale / 2, scale)
    return new - new.mean(-1, keepdims=True), scale[..., None] * step


def exposure_weights(per_group: np.ndarray) -> np.ndarray:
    """(..., K, K) weight of a vote on each pair of per-group wins (..., G, K, K): the mean votes of a compared pair
    over this pair's votes (inverse sampling frequency, scaled so that the weighted votes total the votes); 0 where
    a pair was never compared."""
    wins = per_group.sum(-3)
    games = wins + np.swapaxes(wins, -1, -2)
    compared = games > 0
    pairs = compared.sum((-1, -2), keepdims=True)
    mean = games.sum((-1, -2), keepdims=True) / np.maximum(pairs, 1)
    return np.where(compared, mean / np.where(compared, games, 1), 0.0)


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
                            chunk: int | None = None) -> np.ndarray:
    """Replicate log-strengths resampling whole groups (prompts) with replacement: (n_boot, K).

    per_group: (G, K, K) win matrices, one per prompt. Replicates are fitted ``chunk`` at a time, by default as many
    as keep each (chunk, K, K) array near 16 MB: the same draws in fewer, larger steps (2,000 replicates of 3 models
    in one chunk took 0.55 s against 0.89 s in chunks of 200, the intervals equal).
    """
    rng = rng or np.random.default_rng(0)
    g = per_group.shape[0]
    chunk = chunk or max(200, 2_000_000 // per_group.shape[-1] ** 2)
    out = []
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        counts = rng.multinomial(g, np.full(g, 1 / g), size=b).astype(float)  # (b, G)
        out.append(fit_bradley_terry(np.einsum("bg,gij->bij", counts, per_group), tol=1e-8))
    return np.concatenate(out)


def exposure_fit(counted: np.ndarray, **fit) -> np.ndarray:
    """Log-strengths of per-prompt win counts (..., G, K, K) reweighted for exposure (``exposure_weights``)."""
    return fit_bradley_terry((counted * exposure_weights(counted)[..., None, :, :]).sum(-3), **fit)


def _interval_reaches_zero(counted: np.ndarray, model: int, above: bool, n_boot: int, seed: int) -> bool:
    """Whether ``model``'s percentile interval of exposure-reweighted log-strengths, prompts resampled, reaches 0."""
    replicates = bootstrap_bradley_terry(counted * exposure_weights(counted), n_boot, np.random.default_rng(seed))
    lo, hi = np.percentile(replicates[:, model], [2.5, 97.5])
    return bool(lo <= 0) if above else bool(hi >= 0)


def bradley_terry_flip(counted: np.ndarray, model: int, n_boot: int, seed: int = 0) -> dict:
    """A greedy upper bound on the fewest votes whose removal makes ``model``'s score interval reach 0: its wins (its
    losses, for a score below 0) ordered by how far leaving one such vote out moves the score towards 0 (one fit per
    kind of vote: its prompt and opponent), then the fewest of that order whose removal makes the recomputed
    interval reach 0, by bisection (each step a bootstrap of ``n_boot``). ``count``, ``votes`` ((prompt index,
    opponent index) of each, in order) and ``exact`` False. Removing all of them always leaves no evidence for it."""
    above = exposure_fit(counted)[model] > 0
    cells = np.argwhere(counted[:, model, :] > 0) if above else np.argwhere(counted[:, :, model] > 0)
    removed = np.repeat(counted[None], len(cells), 0)
    for c, (g, j) in enumerate(cells):
        removed[c, g, model, j] -= above
        removed[c, g, j, model] -= not above
    # every leave-one-out fit in one batch, at the bootstrap's cap: one model winning every vote makes the MM update
    # crawl, and 40 fits run one by one to 10,000 iterations took 2.6 s of a 6.5 s search (3 models, 120 votes)
    moved = exposure_fit(removed, tol=1e-8)[:, model] * (1 if above else -1)
    order = [tuple(cells[c]) for c in np.argsort(moved, kind="stable")
             for _ in range(int(counted[cells[c][0], model, cells[c][1]] if above
                                else counted[cells[c][0], cells[c][1], model]))]

    def without(k: int) -> np.ndarray:
        rest = counted.copy()
        for g, j in order[:k]:
            rest[g, model, j] -= above
            rest[g, j, model] -= not above
        return rest

    reached, not_reached = len(order), 0
    while reached - not_reached > 1:
        k = (reached + not_reached) // 2
        if _interval_reaches_zero(without(k), model, above, n_boot, seed):
            reached = k
        else:
            not_reached = k
    return {"count": reached, "votes": [[int(g), int(j)] for g, j in order[:reached]], "exact": False}
