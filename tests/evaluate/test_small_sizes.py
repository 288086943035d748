"""Intervals at few prompts and the prompts that would flip a verdict: the t-interval on per-prompt contributions,
its p, the flip count against every subset, and the count on every surface of a comparison (the printed line, the
JSON, the page's row)."""
import json
import re

import numpy as np
import pytest
from scipy import stats

from evaluate.compare import compare_rows, write_comparison
from evaluate.compare_page import verdict_table
from evaluate.statistics.bootstrap import (SET_MIN_PROMPTS, flip, flip_by_subsets, mean_interval,
                                           prompt_contributions, prompt_weights, skew_warning, t_interval, t_p_value,
                                           weighted_means)
from evaluate.verdict import comparison_lines, flip_shown, overall
from evaluate.statistics.metrics import one_thread
from tests.evaluate.test_verdict import _reference, write_row


def _random_sets(count: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(3, 9))
        x = rng.standard_normal(n) * rng.uniform(0.2, 2) + rng.uniform(-3, 3)
        if rng.random() < 0.3:
            x = rng.exponential(1.0, n) + rng.uniform(-1, 1)
        if rng.random() < 0.2:
            x = np.round(x)  # ties
        yield x


def test_the_flip_count_equals_every_subset_tried():
    """For sets of 3 to 8 prompts, the fewest removals that make the t-interval reach 0, by the sorted-runs search
    and by trying every subset, agree; and removing the prompts it names does make the interval reach 0."""
    checked = 0
    for x in _random_sets(200, seed=3):
        lo, hi = t_interval(x)
        if lo <= 0 <= hi:
            continue
        ids = np.arange(len(x)) * 10
        found = flip(ids, x, lo > 0)
        assert found["count"] == flip_by_subsets(x, lo > 0), x
        rest = x[~np.isin(ids, found["prompts"])]
        assert len(found["prompts"]) == found["count"]
        if len(rest) >= 2:
            r_lo, r_hi = t_interval(rest)
            assert r_lo <= 1e-12 * max(1, abs(rest.mean())) if lo > 0 else r_hi >= -1e-12 * max(1, abs(rest.mean()))
        checked += 1
    assert checked > 50


def test_the_t_interval_excludes_zero_exactly_when_p_is_under_005():
    for x in _random_sets(300, seed=5):
        lo, hi = t_interval(x)
        p = t_p_value(x, 200)
        assert (lo > 0 or hi < 0) == (p < 0.05), (x, lo, hi, p)
    mean, sd, n = 1.0, 2.0, 6  # by hand: mean -+ t_{5, 0.975} sd / sqrt(6)
    x = np.array([-1.0, 1, 3] * 2)
    x = (x - x.mean()) / x.std(ddof=1) * sd + mean
    half = stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n)
    assert np.allclose(t_interval(x), (mean - half, mean + half))


def test_contributions_are_prompt_means_and_keep_the_image_mean():
    rng = np.random.default_rng(0)
    ids = np.repeat([7, 3, 9, 1], 3)
    a, b = rng.standard_normal(12), rng.standard_normal(12) + 1
    prompts, c = prompt_contributions(ids, b, a)
    assert list(prompts) == [1, 3, 7, 9]
    assert np.allclose(c, [(b - a)[ids == p].mean() for p in prompts])
    b[[0, 4, 5]] = np.nan  # images without a value do not count; the mean is still the image mean's difference
    _, c = prompt_contributions(ids, b, a)
    assert np.isclose(c.mean(), np.nanmean(b) - a.mean())


def test_the_rule_is_the_t_interval_at_every_size():
    """At 8 and at 250 prompts (where the percentile bootstrap covered 91.6-94.7%), a mean's interval is the
    t-interval of its prompts' means, and it excludes 0 exactly when p < 0.05."""
    rng = np.random.default_rng(1)
    for prompts in (8, 250):
        ids = np.repeat(np.arange(prompts), 2)
        v = rng.standard_normal(len(ids)) + 0.2
        reps = weighted_means(v, prompt_weights(ids, 200))
        got = mean_interval(ids, v, None, reps)
        assert got["rule"] == "t"
        assert np.allclose((got["lo"], got["hi"]), t_interval(v.reshape(prompts, 2).mean(1)))
        assert (got["lo"] > 0 or got["hi"] < 0) == (got["p"] < 0.05)


@pytest.fixture
def one_threaded():
    with one_thread():
        yield


@pytest.fixture
def small(tmp_path):
    """Two rows of 8 prompts, one image each: B's CLIP score clearly higher, its features clearly nearer the
    reference."""
    rng = np.random.default_rng(11)
    reference = _reference(tmp_path, rng)
    features = rng.standard_normal((8, 4)) + 2.0
    clip = 30 + rng.normal(0, 3, 8)
    gain = np.array([2.0, 2.5, 3.0, 1.5, 2.2, 9.0, 2.8, 1.9])
    a = write_row(tmp_path, "a", features, clip, reference)
    b = write_row(tmp_path, "b", features - 1.5, clip + gain, reference)
    with one_thread():  # tiny kernel matrices: one thread is ten times faster on a busy 2-core machine
        yield tmp_path, a, b, gain


def test_a_comparison_shows_its_flip_count_on_every_surface(small):
    """CLIP score at 8 prompts: the t-interval, the exact count and its prompts (the same as every subset gives),
    in the JSON, the printed line and the page's row, to the digit."""
    out, a, b, gain = small
    result = compare_rows(out, a, b, replicates=200)
    clip = next(m for m in result["metrics"] if m["metric"] == "clip_score")
    assert clip["rule"] == "t" and clip["better"] == "B"
    assert np.allclose((clip["lo"], clip["hi"]), t_interval(gain))
    assert clip["flip"]["count"] == flip_by_subsets(gain, True) and clip["flip"]["exact"]
    shown = flip_shown(clip)
    assert shown == (f"flips without {clip['flip']['count']} prompts ("
                     f"{', '.join(str(p) for p in clip['flip']['prompts'])})")
    assert shown in clip["sentence"] and any(shown in line for line in comparison_lines(result))
    # one prompt gained 9 where the others gained about 2: skewed at 8 prompts, the line says so
    assert clip["warning"] == skew_warning(gain) and clip["sentence"].endswith(clip["warning"])
    assert f"skewness {stats.skew(gain):+.1f}) at 8 prompts" in clip["warning"] and stats.skew(gain) > 1
    saved = json.loads(write_comparison(out, result).read_text())
    assert next(m for m in saved["metrics"] if m["metric"] == "clip_score")["flip"] == clip["flip"]
    page = verdict_table({"metrics": result["metrics"], "overall": overall(result["metrics"])})
    row = re.search(r"data-metric='clip_score'>(.*?)</tr>", page).group(1)
    assert f"<td class='flip'>{shown}</td>" in row


def test_a_set_metric_below_the_measured_size_reads_one_warning(tmp_path, one_threaded):
    """FID's B - A one prompt below ``SET_MIN_PROMPTS`` (under which its paired interval was not measured to cover):
    no interval, a one-line warning, "cannot tell"; at ``SET_MIN_PROMPTS`` an interval and a verdict. A CLIP score of
    even gains has no skew warning."""
    rng = np.random.default_rng(2)
    for n in (SET_MIN_PROMPTS - 1, SET_MIN_PROMPTS):
        out = tmp_path / str(n)
        reference = _reference(out, rng)
        features = rng.standard_normal((n, 4)) + 2.0
        clip = 30.0 + np.arange(n) % 3
        a = write_row(out, "a", features, clip, reference)
        b = write_row(out, "b", features - 1.5, clip + 2.0 + 0.1 * (np.arange(n) % 3 - 1), reference)
        metrics = {m["metric"]: m for m in compare_rows(out, a, b, replicates=200)["metrics"]}
        fid = metrics["fid"]
        if n < SET_MIN_PROMPTS:
            assert fid["lo"] is None and fid["better"] is None and fid["flip"] is None
            assert fid["sentence"] == (f"cannot tell on FID ({n} prompts: below {SET_MIN_PROMPTS} a set metric's "
                                       f"paired interval was not measured to cover (FID's covered 87% at 4 in "
                                       f"bench/coverage.py)): B - A = {fid['difference']:+.4g}")
        else:
            assert fid["lo"] is not None and "too_few" not in fid and fid["better"] == "B"
        assert "warning" not in metrics["clip_score"] and "skew" not in metrics["clip_score"]["sentence"]


def test_a_set_metrics_greedy_count_is_an_upper_bound_that_flips_it(tmp_path, one_threaded):
    """FID over 24 prompts, B's features nearer the reference: the greedy count is marked an upper bound, and the
    interval recomputed without the prompts it names (the bootstrap over the rest) reaches 0."""
    from evaluate.compare import load_references, load_row_images, set_differences

    rng = np.random.default_rng(4)
    reference = _reference(tmp_path, rng)
    n = SET_MIN_PROMPTS + 4
    features = rng.standard_normal((n, 4)) + 1.0
    a = write_row(tmp_path, "a", features, np.full(n, 30.0), reference)
    b = write_row(tmp_path, "b", features * 0.8 - 0.6, np.full(n, 30.0), reference)
    unsearched = next(m for m in compare_rows(tmp_path, a, b, replicates=200)["metrics"] if m["metric"] == "fid")
    assert unsearched["flip"]["count"] is None and "--set-flips" in unsearched["sentence"]  # costly: only when asked
    result = compare_rows(tmp_path, a, b, replicates=200, set_flips=True)
    fid = next(m for m in result["metrics"] if m["metric"] == "fid")
    assert fid["better"] == "B" and not fid["flip"]["exact"] and 1 <= fid["flip"]["count"] <= n - SET_MIN_PROMPTS + 1
    assert "flips without at most" in fid["sentence"]
    ia, refs, _, _ = load_row_images(tmp_path, a)
    ib = load_row_images(tmp_path, b)[0]
    keep = ~np.isin(ia.prompts, fid["flip"]["prompts"])
    if keep.sum() >= SET_MIN_PROMPTS:  # otherwise too few are left for an interval: flipped by the rule itself
        from evaluate.names import difference_range
        from evaluate.statistics.bootstrap import interval

        weights = np.zeros((result["replicates"]["image quality"], n))
        weights[:, keep] = prompt_weights(ia.prompts[keep], len(weights), 0)
        diff = set_differences(ia, ib, load_references(refs), np.vstack([keep.astype(float), weights]), "fid")
        assert interval(diff[0], diff[1:], bounds=difference_range("fid"))[1] >= 0
