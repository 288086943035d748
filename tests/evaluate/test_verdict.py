"""One verdict rule: a comparison's words, interval and p-value agree, digits included; Holm over a comparison's
metrics; intervals inside each metric's range. Rows are written to disk as `dwb evaluate run` leaves them
(a manifest, per-image features, reference statistics) with per-image values that differ by known amounts."""
import json
import re

import numpy as np
import pytest
import torch

from evaluate.statistics.bootstrap import holm, interval, p_floor, p_value
from evaluate.compare import compare_rows
from evaluate.statistics.metrics import FeatureStats
from evaluate.names import metric
from evaluate.reference import ReferenceStats
from evaluate.row import row_metrics
from evaluate.store import ATTRIBUTE_COLUMNS, ResultsStore
from evaluate.verdict import family_replicates, overall, p_text
from models.common import interval_text
from models.errors import WorkbenchError

PROMPTS, DIM = 40, 4


def _reference(out, rng) -> tuple[str, FeatureStats]:
    stats = FeatureStats(DIM, kid_max=200)
    stats.update(torch.from_numpy(rng.standard_normal((200, DIM))))
    path = out / "cache" / "ref-test.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**stats.state_dict(), "skipped": 0}, path)
    return str(path), stats


def _frechet_to(stats: FeatureStats, x: np.ndarray) -> float:
    """The Frechet distance of ``x`` to the reference, written out with numpy (not the workbench's code)."""
    mu, cov = stats.mean.numpy(), stats.cov.numpy()
    c = np.cov(x, rowvar=False)
    vals, vecs = np.linalg.eigh(cov)
    root = vecs @ np.diag(np.sqrt(vals)) @ vecs.T
    eig = np.linalg.eigvalsh(root @ c @ root)
    return float(((mu - x.mean(0)) ** 2).sum() + np.trace(cov) + np.trace(c) - 2 * np.sqrt(eig.clip(0)).sum())


def write_row(out, model: str, features: np.ndarray, clip: np.ndarray, reference: tuple[str, FeatureStats]) -> dict:
    """A scored row of one image per prompt, as `dwb evaluate run` writes it: manifest, features.pt, store line."""
    path, stats = reference
    folder = out / "samples" / model / "cfg5"
    folder.mkdir(parents=True)
    manifest = [{"prompt": f"prompt {i}", "prompt_index": i, "image_index": 0, "seed": i, "category": "all",
                 "clip_score": float(clip[i])} for i in range(len(clip))]
    (folder / "manifest.jsonl").write_text("".join(json.dumps(m) + "\n" for m in manifest))
    torch.save({"keys": torch.tensor([[i, 0] for i in range(len(clip))]),
                "features": {"fid": torch.from_numpy(features).float()}, "references": {"fid": path}},
               folder / "features.pt")
    row = {"model": model, "checkpoint": model, "status": "ok", "step": 0, "guidance": 5.0, "sampler": None,
           "n_images": len(clip), "prompts": "test", "size": 16, "extractor": "test", "n_reference": 200,
           "dinov2": None, "samples": f"samples/{model}/cfg5", "fid": _frechet_to(stats, features.astype(np.float32)),
           "kid_mean": 0.0, "clip_score": float(np.nanmean(clip))}
    ResultsStore(out).append(row)
    return row


@pytest.fixture
def one_thread():
    """Tiny kernel matrices on one thread: 0.66 s a comparison with torch's two threads on a busy 2-core machine,
    0.055 s with one (see evaluate.statistics.metrics.one_thread)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture
def checkpoints(tmp_path, one_thread):
    """A's features and CLIP scores per prompt (prompts differ in difficulty), and a writer of B rows."""
    rng = np.random.default_rng(7)
    reference = _reference(tmp_path, rng)
    features = rng.standard_normal((PROMPTS, DIM)) + 0.5
    clip = 30 + rng.normal(0, 3, PROMPTS)  # each prompt's difficulty, shared by both checkpoints
    a = write_row(tmp_path, "a", features, clip, reference)
    noise = rng.normal(0, 1, PROMPTS)
    noise -= noise.mean()  # so that B - A is exactly the gain asked for

    def b(name: str, clip_gain: float, shift: float = 0.0) -> dict:
        """B: CLIP score higher by ``clip_gain`` (plus noise) and features moved by ``shift`` towards the reference."""
        return write_row(tmp_path, name, features - shift, clip + clip_gain + noise, reference)

    return tmp_path, a, b, noise


def _printed(sentence: str) -> tuple[float, float, str]:
    """The printed interval's bounds and the p text of a metric's sentence."""
    lo, hi = (float(x) for x in re.search(r"\[([-+0-9.e]+), ([-+0-9.e]+)\]", sentence).groups())
    return lo, hi, re.search(r"(p (?:<=|<|=) [0-9.e-]+)", sentence).group(1)


def _reads_significant(p: str) -> bool:
    kind, value = p.split()[1:]
    return float(value) < 0.05 or (kind in ("<", "<=") and float(value) <= 0.05)


def test_words_interval_and_p_agree_across_the_boundary(checkpoints):
    """B's CLIP score is higher by a known gain, from 0 to 0.6 points (per-image noise of 1, 40 prompts: the
    standard error of the mean gain is about 0.16, so p crosses 0.05 near 0.3): at every gain the words,
    the interval, the printed digits and p tell the same story."""
    out, a, new_b, noise = checkpoints
    seen = []
    for i, gain in enumerate(np.linspace(0, 0.6, 21)):
        b = new_b(f"b{i}", gain)
        result = compare_rows(out, a, b, replicates=400)
        [m] = [m for m in result["metrics"] if m["metric"] == "clip_score"]
        assert m["difference"] == pytest.approx(gain)  # the known difference
        clear = m["lo"] > 0 or m["hi"] < 0
        assert clear == (m["p"] < 0.05) == (m["better"] is not None)
        assert m["sentence"].startswith("B is better on CLIP score by" if clear else "cannot tell on CLIP score")
        lo, hi, p = _printed(m["sentence"])
        assert (lo > 0) == clear and lo <= m["lo"] and hi >= m["hi"]  # rounded outward, clear of 0 when it is
        assert _reads_significant(p) == clear
        seen.append(m["p"])
    assert seen[0] > 0.5 and seen[-1] < 0.01  # no gain: no verdict; a gain of almost 4 standard errors: clear
    assert any(0.035 <= p <= 0.065 for p in seen)  # the scan passed close to the boundary


def test_a_lower_is_better_metric_names_the_checkpoint_that_lowers_it(checkpoints):
    out, a, new_b, _ = checkpoints
    b = new_b("closer", 0.0, shift=0.5)  # features moved half-way to the reference's mean of 0
    result = compare_rows(out, a, b, replicates=400)
    [fid] = [m for m in result["metrics"] if m["metric"] == "fid"]
    assert fid["difference"] < 0 and fid["hi"] < 0 and fid["better"] == "B" and fid["lower_is_better"]
    assert fid["sentence"].startswith("B is better on FID by ")
    lo, hi, _ = _printed(fid["sentence"])
    assert 0 < lo <= -fid["difference"] <= hi  # the gain: how much lower B's FID is


def test_holm_within_a_family_takes_back_a_barely_significant_metric(checkpoints):
    """FID and KID form the image-quality family; KID is the same for A and B (p = 1). B's features: A's with
    per-image noise, moved towards the reference by a scanned amount (p crosses 0.05 near a shift of 0.013): a
    FID with p between 0.05 / 2 and 0.05 is better alone, and not once the family's two metrics are adjusted
    together. The CLIP score, alone in its family, is not adjusted."""
    out, a, new_b, _ = checkpoints
    noise = np.random.default_rng(1).normal(0, 0.3, (PROMPTS, DIM))
    found = None
    for i, shift in enumerate(np.linspace(0.0, 0.03, 31)):
        result = compare_rows(out, a, new_b(f"b{i}", 0.4, shift=shift - noise), replicates=400)
        fid = next(m for m in result["metrics"] if m["metric"] == "fid")
        if 0.05 / 2 < fid["p"] < 0.05:
            found = result, fid
            break
    assert found is not None
    result, fid = found
    kid, clip = (next(m for m in result["metrics"] if m["metric"] == k) for k in ("kid_mean", "clip_score"))
    assert kid["p"] > 0.5 and fid["better"] == "B" and fid["better_holm"] is None  # KID: the same in both rows
    assert fid["p_holm"] == pytest.approx(2 * fid["p"])
    assert fid["sentence"].startswith("cannot tell on FID after Holm's adjustment over the 2 image quality metrics (")
    assert "; alone: B is better on FID by " in fid["sentence"]  # the adjusted verdict first, the metric's own second
    assert fid["sentence"].endswith(f"({p_text(fid['p'], fid['defined'])})")
    assert clip["p_holm"] == clip["p"] and "Holm" not in clip["sentence"]
    families = {f["family"]: f for f in result["overall"]["families"]}
    assert families["image quality"]["verdict"] is None and families["image quality"]["metrics"] == ["fid", "kid_mean"]
    assert families["text alignment"]["verdict"] == ("B" if clip["better"] == "B" else None)


def test_holm_by_hand():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_the_interval_reaches_zero_at_the_level_of_the_p_value():
    """Skewed replicates (as FID differences are) and symmetric ones: the interval at level 1 - p has a bound at
    0, and the 95% interval excludes 0 exactly when p < 0.05."""
    rng = np.random.default_rng(0)
    for draw in range(400):
        reps = rng.gamma(2.0, 1.0, 200) if draw % 2 else rng.standard_normal(200)
        point = rng.uniform(0.2, 4.0) * rng.choice([-1, 1])
        p = p_value(point, reps)
        lo, hi = interval(point, reps)
        assert (lo > 0 or hi < 0) == (p < 0.05), (point, lo, hi, p)
        if 2 / 201 < p < 1:  # above the replicates' resolution, below the cap
            assert min(abs(b) for b in interval(point, reps, level=1 - p)) == pytest.approx(0, abs=1e-9)


def test_printed_digits_never_contradict_the_words():
    assert p_text(0.0498, 200) == "p < 0.05" and p_text(0.05, 200) == "p = 0.05" and p_text(0.012, 200) == "p = 0.012"
    assert p_text(2 / 201, 200) == "p <= 0.01" and p_text(3 * 2 / 201, 200, bound=True) == "p <= 0.03"
    printed = interval_text(0.5, 0.00004, 1.3)  # a lower bound just clear of 0
    assert float(re.search(r"\[([0-9.]+),", printed).group(1)) > 0
    lo, hi = (float(x) for x in re.search(r"\[([-+0-9.]+), ([-+0-9.]+)\]", interval_text(-1, -1.04, -0.96)).groups())
    assert lo <= -1.04 and hi >= -0.96  # outward
    share = interval_text(64.0, 50.0004, 76.02, threshold=50)  # a preference just clear of 50%, in percent
    assert float(re.search(r"\[([0-9.]+),", share).group(1)) > 50


def test_kid_interval_stays_at_or_above_zero(one_thread):
    """Generated features drawn like the reference's: KID's unbiased estimate sits near 0, and the deviations of its
    replicates reach below it; the interval is for KID itself, which is never negative."""
    rng = np.random.default_rng(3)
    stats = FeatureStats(DIM, kid_max=400)
    stats.update(torch.from_numpy(rng.standard_normal((400, DIM))))
    references = {"fid": ReferenceStats(stats, 0, "test", True)}
    x = torch.from_numpy(rng.standard_normal((60, DIM))).float()
    mine = FeatureStats(DIM, kid_max=600)
    mine.update(x)
    part = {"keys": [(i, 0) for i in range(60)], "categories": ["all"] * 60, "clip_score": [], "verdicts": [],
            "stats": {"fid": mine.state_dict()}, "features": {"fid": x}}
    cols, _ = row_metrics([part], references, [], kid_subsets=10, kid_subset_size=60, bootstrap=200, seed=0)
    assert cols["kid_mean_lo"] >= 0 and cols["kid_mean_hi"] >= cols["kid_mean_lo"]
    assert cols["fid_lo"] >= 0


def test_a_comparison_needs_replicates_in_both_tails(checkpoints):
    out, a, new_b, _ = checkpoints
    with pytest.raises(WorkbenchError, match="at least 40 replicates"):
        compare_rows(out, a, new_b("b", 1.0), replicates=39)


def test_the_overall_verdict_counts_each_family():
    def m(key: str, better: str | None) -> dict:
        return {"metric": key, "family": metric(key).family, "better_holm": better}

    metrics = [m("fid", "B"), m("kid_mean", "A"), m("clip_score", "B"), *(m(k, None) for k in ATTRIBUTE_COLUMNS)]
    verdict = overall(metrics)
    families = {f["family"]: f for f in verdict["families"]}
    assert families["image quality"]["verdict"] == "mixed" and families["text alignment"]["verdict"] == "B"
    assert families["attribute accuracy"]["cannot_tell"] == len(ATTRIBUTE_COLUMNS) == 14
    assert families["image quality"]["sentence"] == "image quality: mixed (2 metrics: 1 for B, 1 for A, 0 cannot tell)"
    assert verdict["n_metrics"] == 17 and "within each family" in verdict["heading"]


def test_a_family_of_several_metrics_gets_replicates_enough_for_holm_to_find_a_difference():
    """Holm's first step over m metrics asks p < 0.05 / m; the smallest p of B replicates is 2 / (B + 1). At the
    counts given, an estimate past every replicate passes it, for each family size."""
    for m in range(1, 20):
        b = family_replicates(200, m)
        assert b >= 200 and b % 100 == 0
        assert m * p_floor(b) < 0.05 / 2  # with room: p twice the floor still passes
    assert family_replicates(200, 14) == 1200 and family_replicates(2000, 14) == 2000 and family_replicates(50, 1) == 50


def test_each_family_is_compared_on_its_own_count_of_replicates(checkpoints):
    """Asked for 40: the image-quality family (FID and KID) is raised to 200, the CLIP score alone keeps 40;
    each metric's p respects its own family's floor, and the header names the raised count."""
    from evaluate.verdict import replicates_text

    out, a, new_b, _ = checkpoints
    result = compare_rows(out, a, new_b("far", 3.0, shift=0.5), replicates=40)
    assert result["replicates"] == {"image quality": 200, "text alignment": 40}
    by_key = {m["metric"]: m for m in result["metrics"]}
    assert by_key["fid"]["replicates"] == by_key["kid_mean"]["replicates"] == 200
    assert by_key["clip_score"]["replicates"] == 40
    assert by_key["fid"]["p"] == pytest.approx(p_floor(200)) and by_key["clip_score"]["p"] == pytest.approx(p_floor(40))
    assert by_key["fid"]["better_holm"] == "B"  # 2 x 2 / 201 < 0.05: the raised count lets Holm find it
    assert replicates_text(result) == "40 paired bootstrap replicates (200 for image quality)"


def _shown_interval_excludes_zero(sentence: str) -> bool | None:
    """Whether the interval a sentence prints lies clear of 0 (None where it prints none)."""
    found = re.search(r"\[([-+0-9.e]+), ([-+0-9.e]+)\]", sentence)
    if not found:
        return None
    lo, hi = (float(x) for x in found.groups())
    return lo > 0 or hi < 0 or (lo < 0 and hi < 0)


def test_replicates_that_drew_no_defined_image_count_against_the_minimum(checkpoints):
    """CLIP scores defined on 2 of 40 prompts (the others NaN: an image the metric does not judge) and 40
    replicates asked for: about 5 of the 40 draw neither prompt, leaving fewer than the 40 a 95% interval needs.
    The interval of the rest cleared 0 beside "cannot tell" (its p floor is over 0.05); the metric must say
    that too few replicates were defined, and print no interval that contradicts it."""
    out, a, new_b, _ = checkpoints
    rng = np.random.default_rng(5)
    features = rng.standard_normal((PROMPTS, DIM))
    reference = (str(out / "cache" / "ref-test.pt"), FeatureStats.from_state_dict(
        torch.load(out / "cache" / "ref-test.pt", weights_only=True), kid_max=200))
    clip = np.full(PROMPTS, np.nan)
    clip[[3, 17]] = [30.0, 26.0]
    sparse_a = write_row(out, "sparse-a", features, clip, reference)
    sparse_b = write_row(out, "sparse-b", features, clip + np.where(np.arange(PROMPTS) == 3, 5.0, 4.0), reference)
    result = compare_rows(out, sparse_a, sparse_b, replicates=40)
    m = next(m for m in result["metrics"] if m["metric"] == "clip_score")
    defined = m["defined"]
    assert defined < 40 and m["replicates"] == 40
    assert m["better"] is None and m["better_holm"] is None and m["lo"] is None and m["p"] is None
    assert f"{defined} of 40 replicates" in m["sentence"] and m["sentence"].startswith("cannot tell on CLIP score")
    assert _shown_interval_excludes_zero(m["sentence"]) is None
    assert "text alignment: cannot tell" in [f["sentence"].split(" (")[0] for f in result["overall"]["families"]]


def test_a_non_finite_point_estimate_reads_cannot_tell_in_one_line(checkpoints):
    """A store row whose FID is infinite (a degenerate feature covariance) or NaN: B - A is not a number, and
    the comparison said TypeError instead of a verdict."""
    out, a, new_b, _ = checkpoints
    for i, bad in enumerate((float("inf"), float("nan"))):
        b = {**new_b(f"bad{i}", 1.0), "fid": bad}
        result = compare_rows(out, a, b, replicates=40)
        fid = next(m for m in result["metrics"] if m["metric"] == "fid")
        assert fid["better"] is None and fid["better_holm"] is None and fid["p"] is None
        assert fid["sentence"].startswith("cannot tell on FID (not finite)") and "\n" not in fid["sentence"]
        json.dumps(result)  # the comparison is still written


def test_a_tie_at_the_exact_boundary_reads_the_same_in_the_interval_and_p():
    """Replicates and estimates placed so that the 95% interval's lower bound is 0 in exact arithmetic: in
    floating point the bound landed a few ulps above 0 beside p = 0.05 ("cannot tell" with an interval clear
    of 0), or p a few ulps under 0.05 beside a bound at or below 0. At a tie, both must say the same."""
    from evaluate.statistics.bootstrap import interval as _interval, p_value as _p_value
    from evaluate.verdict import with_verdicts

    rng = np.random.default_rng(0)
    parted = []
    for trial in range(600):
        n = int(rng.integers(40, 400))
        reps = rng.normal(0, 1, n)
        if trial % 3 == 0:
            reps = np.round(reps, 1)  # replicates tied with each other as well
        s = np.sort(reps) - np.sort(reps).mean()
        h = (n - 1) * 0.025
        k = int(np.floor(h + 1e-9))
        point = -float(s[k] + (h - k) * (s[k + 1] - s[k]))  # minus the 2.5% quantile of the deviations
        lo, hi = _interval(point, reps)
        [m] = with_verdicts([{"metric": "clip_score", "a": 0.0, "b": point, "difference": point, "lo": lo, "hi": hi,
                              "p": _p_value(point, reps), "replicates": n}])
        clear = m["lo"] > 0 or m["hi"] < 0
        if clear != (m["p"] < 0.05) or clear != (m["better"] is not None) or \
                _shown_interval_excludes_zero(m["sentence"]) != clear:
            parted.append((n, point, m["lo"], m["p"], m["sentence"]))
    assert not parted, parted[:3]
