"""Intervals, paired comparisons and FD-infinity on synthetic data with known answers."""
import numpy as np
import pytest
import torch

from evaluate.statistics.bootstrap import interval, p_value, prompt_weights, weighted_means
from evaluate.statistics.fd_infinity import fd_infinity
from evaluate.statistics.metrics import (FeatureStats, FrechetReference, cmmd, cmmd_replicates, fid_from_stats, kid_replicates,
                              polynomial_mmd)

DRAWS = 200


def _clustered(rng, prompts: int, per_prompt: int, mean: float, prompt_sd: float = 1.0, image_sd: float = 0.5):
    """Per-image values where images of one prompt share the prompt's effect (its difficulty)."""
    effect = rng.normal(0, prompt_sd, prompts)
    ids = np.repeat(np.arange(prompts), per_prompt)
    return mean + effect[ids] + rng.normal(0, image_sd, len(ids)), ids


def test_interval_of_a_per_image_mean_covers_the_true_mean():
    rng = np.random.default_rng(0)
    covered = naive = 0
    for draw in range(DRAWS):
        values, ids = _clustered(rng, prompts=40, per_prompt=4, mean=0.3)
        lo, hi = interval(values.mean(), weighted_means(values, prompt_weights(ids, 400, seed=draw)))
        covered += lo <= 0.3 <= hi
        lo, hi = interval(values.mean(), weighted_means(values, prompt_weights(np.arange(len(ids)), 400, seed=draw)))
        naive += lo <= 0.3 <= hi
    assert 0.90 <= covered / DRAWS <= 0.99
    assert naive / DRAWS < 0.8  # resampling images one by one ignores that a prompt's images move together


def test_interval_of_an_accuracy_skips_images_without_a_verdict():
    values = np.array([1.0, 0.0, np.nan, 1.0, np.nan, 1.0])
    ids = np.array([0, 0, 1, 1, 2, 2])
    reps = weighted_means(values, prompt_weights(ids, 300, seed=1))
    assert np.nanmin(reps) >= 0 and np.nanmax(reps) <= 1
    assert weighted_means(values, np.ones((1, 6)))[0] == pytest.approx(0.75)  # NaN does not count
    lo, hi = interval(0.75, reps)
    assert lo <= 0.75 <= hi
    assert interval(None, reps) == (None, None)


def _paired(rng, shift: float):
    """Two checkpoints' per-image values on the same prompts: the prompt's effect is shared, B moves by ``shift``."""
    effect = rng.normal(0, 1, 50)
    ids = np.repeat(np.arange(50), 2)
    a = effect[ids] + rng.normal(0, 0.5, len(ids))
    b = effect[ids] + shift + rng.normal(0, 0.5, len(ids))
    return a, b, ids


def test_paired_comparison_is_significant_only_when_the_checkpoints_differ():
    rng = np.random.default_rng(1)
    significant = {0.0: 0, 0.35: 0}
    for draw in range(DRAWS):
        for shift in significant:
            a, b, ids = _paired(rng, shift)
            w = prompt_weights(ids, 400, seed=draw)
            diff = weighted_means(b, w) - weighted_means(a, w)  # one draw of prompts for both: paired
            significant[shift] += p_value(b.mean() - a.mean(), diff) < 0.05
    assert significant[0.0] / DRAWS <= 0.10  # about 5% false alarms for the same checkpoint
    assert significant[0.35] / DRAWS >= 0.95  # a clear difference is found
    a, _, ids = _paired(rng, 0.0)
    assert p_value(0.0, np.zeros(10)) == 1.0  # a checkpoint against itself: no difference at all


def test_fid_interval_covers_the_expected_fid():
    """Set metric: the generated images resampled against fixed reference statistics (D = 8, N = 200)."""
    rng = np.random.default_rng(2)
    d, n, draws = 8, 200, 100
    mix = np.eye(d) + 0.3 * rng.standard_normal((d, d))
    reference = FrechetReference(torch.zeros(d, dtype=torch.float64), torch.eye(d, dtype=torch.float64))
    sets = lambda k: torch.from_numpy(rng.standard_normal((k, n, d)) @ mix.T + 0.3)  # noqa: E731
    many = sets(1000)  # E[FID at N = 200] from 1,000 sets, against the reference N(0, I): S^1/2 = I
    mean, centred = many.mean(1), many - many.mean(1, keepdim=True)
    cov = centred.transpose(1, 2) @ centred / (n - 1)
    expected = float((mean.square().sum(1) + d + cov.diagonal(dim1=1, dim2=2).sum(1)
                      - 2 * torch.linalg.eigvalsh(cov).clamp(min=0).sqrt().sum(1)).mean())
    all_ones = np.ones((1, n))
    covered = 0
    for i, x in enumerate(sets(draws)):
        lo, hi = interval(reference.replicates(x, all_ones)[0],
                          reference.replicates(x, prompt_weights(np.arange(n), 200, seed=i)))
        covered += lo <= expected <= hi
    assert 0.88 <= covered / draws <= 0.99


def _expanded(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.repeat(x, w.astype(int), axis=0)


@pytest.mark.parametrize("batched_max, gram_max", [(256, 4096), (0, 4096), (0, 0)])  # every route to Tr(C^1/2)
def test_replicates_equal_each_metric_on_the_resampled_set(monkeypatch, batched_max, gram_max):
    from evaluate.statistics import metrics

    monkeypatch.setattr(metrics, "BATCHED_MAX", batched_max)
    monkeypatch.setattr(metrics, "GRAM_MAX", gram_max)
    rng = np.random.default_rng(3)
    real, fake = rng.normal(size=(60, 12)), rng.normal(loc=0.2, size=(30, 12)) * 1.3
    w = prompt_weights(np.repeat(np.arange(10), 3), 4, seed=0)  # 10 prompts x 3 images: some drawn twice, some not
    stats = FeatureStats(12)
    stats.update(torch.from_numpy(real))
    reference = FrechetReference.from_stats(stats)
    for route, x in (("covariance", fake), ("gram", fake[:9])):  # 12-d: 30 images vs under 12 distinct ones
        wx = w[:, :len(x)] if route == "covariance" else prompt_weights(np.arange(9), 4, seed=1)
        ours = reference.replicates(torch.from_numpy(x), wx)
        for k, row in enumerate(wx):
            other = FeatureStats(12)
            other.update(torch.from_numpy(_expanded(x, row)))
            assert ours[k] == pytest.approx(fid_from_stats(stats, other), rel=1e-6, abs=1e-9)
    r, f = torch.from_numpy(real[:30]), torch.from_numpy(fake)
    for k, row in enumerate(w):
        again = torch.from_numpy(_expanded(fake, row))
        assert kid_replicates(r, f, w)[k] == pytest.approx(polynomial_mmd(r, again), rel=1e-9)
        assert cmmd_replicates(r, f, w)[k] == pytest.approx(cmmd(r, again), rel=1e-9)


def test_fd_infinity_recovers_a_known_frechet_distance():
    """Chong & Forsyth 2020: FID grows as 1/N; the intercept of FID against 1/N removes that bias."""
    d, n = 64, 1000
    scale = np.diag(np.linspace(0.5, 1.5, d))
    reference = FrechetReference(torch.zeros(d, dtype=torch.float64), torch.eye(d, dtype=torch.float64))
    truth = reference.distance(torch.full((d,), 0.1, dtype=torch.float64), torch.from_numpy(scale @ scale.T))
    for seed in range(5):
        x = torch.from_numpy(np.random.default_rng(seed).standard_normal((n, d)) @ scale.T + 0.1)
        plain = reference.replicates(x, np.ones((1, n)))[0]
        assert plain > 1.10 * truth  # FID at 1,000 images is more than 10% too high
        assert fd_infinity(reference, x, seed=seed) == pytest.approx(truth, rel=0.05)
    assert fd_infinity(reference, x[:40]) is None  # too few images for a fit


def test_reservoirs_merged_across_ranks_stay_uniform():
    """Shards of 100 and 300 rows, 50 kept: every row should be kept with probability 50 / 400."""
    kept = np.zeros(400)
    trials = 100
    for t in range(trials):
        shards = [FeatureStats(1, kid_max=50, seed=2 * t), FeatureStats(1, kid_max=50, seed=2 * t + 1)]
        shards[0].update(torch.arange(100, dtype=torch.float64)[:, None])
        shards[1].update(torch.arange(100, 400, dtype=torch.float64)[:, None])
        shards[0].merge(shards[1])
        ids = shards[0].features()[:, 0].long().numpy()
        assert len(ids) == 50 and len(set(ids)) == 50
        kept[ids] += 1
    rate = kept / trials
    assert rate[:100].mean() == pytest.approx(0.125, rel=0.1)  # rank 0's rows
    assert rate[100:].mean() == pytest.approx(0.125, rel=0.1)  # rank 1's rows: kept as often
