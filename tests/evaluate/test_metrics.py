"""FID and KID against float64 references and against torchmetrics' own metrics on the same Inception module."""
import numpy as np
import pytest
import scipy.linalg
import torch

from evaluate.scorers.features import InceptionExtractor
from evaluate.statistics.metrics import FeatureStats, FrechetReference, cmmd, fid_from_stats, kernel_inception_distance
from models.errors import WorkbenchError


def _scipy_fid(x: np.ndarray, y: np.ndarray) -> float:
    mu1, mu2 = x.mean(0), y.mean(0)
    s1, s2 = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    covmean = scipy.linalg.sqrtm(s1 @ s2).real
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean))


def _stats(x: np.ndarray, batch: int) -> FeatureStats:
    s = FeatureStats(x.shape[1])
    for i in range(0, len(x), batch):
        s.update(torch.from_numpy(x[i:i + batch]))
    return s


def test_fid_from_features_matches_scipy_float64():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 16))
    y = rng.normal(loc=0.3, scale=1.2, size=(250, 16)) @ rng.normal(size=(16, 16)) * 0.5
    ref = _scipy_fid(x, y)
    ours = fid_from_stats(_stats(x, 7), _stats(y, 64))  # streamed in uneven batches
    assert ref > 1.0
    assert abs(ours - ref) / ref < 1e-6
    assert abs(fid_from_stats(_stats(x, 300), _stats(x, 1))) < 1e-8  # a set against itself


def test_kid_matches_numpy_reference():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(40, 8)), rng.normal(loc=0.5, size=(40, 8))
    d = x.shape[1]
    kxx, kyy, kxy = ((a @ b.T / d + 1) ** 3 for a, b in ((x, x), (y, y), (x, y)))
    m = len(x)
    ref = ((kxx.sum() - np.trace(kxx)) + (kyy.sum() - np.trace(kyy))) / (m * (m - 1)) - 2 * kxy.sum() / m**2
    mean, std = kernel_inception_distance(torch.from_numpy(x), torch.from_numpy(y), subsets=5, subset_size=40)
    assert mean == pytest.approx(ref, rel=1e-9) and std == pytest.approx(0, abs=1e-12)  # full sets: subsets agree


def test_cmmd_matches_a_pairwise_numpy_reference():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((70, 16)), rng.standard_normal((50, 16)) + 0.3

    def reference(a, b, sigma=10.0):
        a, b = a / np.linalg.norm(a, axis=1, keepdims=True), b / np.linalg.norm(b, axis=1, keepdims=True)
        k = lambda p, q: np.mean([[np.exp(-np.sum((u - v) ** 2) / (2 * sigma**2)) for v in q] for u in p])  # noqa: E731
        return 1000 * (k(a, a) + k(b, b) - 2 * k(a, b))

    ours = cmmd(torch.from_numpy(x), torch.from_numpy(y))
    assert ours == pytest.approx(reference(x, y), rel=1e-9) and ours > 0
    assert cmmd(torch.from_numpy(x), torch.from_numpy(x)) == pytest.approx(0.0, abs=1e-9)
    assert cmmd(torch.from_numpy(x), torch.from_numpy(2 * x)) == pytest.approx(0.0, abs=1e-9)  # scale-free: unit norm
    with pytest.raises(ValueError):
        cmmd(torch.from_numpy(x), torch.zeros(0, 16))


def test_reservoir_is_a_uniform_sample_of_the_stream():
    """6 rows streamed in two batches, 3 kept: each of the 20 three-row subsets must be kept equally often.

    Over 600 seeds each subset is expected 30 times; the counts must not reject uniformity (chi-square with 19
    degrees of freedom, p > 1e-4). An off-by-one in the replacement draw (``integers(n)`` or ``integers(n + 2)``
    for ``integers(n + 1)``) fails it with p < 1e-15.
    """
    from itertools import combinations

    from scipy.stats import chi2

    n, k, trials = 6, 3, 600
    stream = torch.arange(n, dtype=torch.float64)[:, None].expand(n, 4)  # row i holds i in every column
    subsets = {c: i for i, c in enumerate(combinations(range(n), k))}
    counts = np.zeros(len(subsets))
    for seed in range(trials):
        s = FeatureStats(4, kid_max=k, seed=seed)
        s.update(stream[:2])
        s.update(stream[2:])
        kept = s.features()
        rows = kept[:, 0].long()
        assert s.n == n and torch.equal(kept, stream[rows])  # whole rows of the stream
        counts[subsets[tuple(sorted(rows.tolist()))]] += 1  # KeyError for a repeated row
    expected = trials / len(subsets)
    assert chi2.sf(((counts - expected) ** 2 / expected).sum(), len(subsets) - 1) > 1e-4, counts


def _images(seed: int, n: int = 6, size: int = 32, brightness: float = 1.0) -> torch.Tensor:
    """Smooth random colour layouts (4 x 4 cells, bilinear up to ``size``): images that differ in content, as
    uniform noise at one scale does not once Inception averages it over the whole picture."""
    g = torch.Generator().manual_seed(seed)
    cells = torch.rand(n, 3, 4, 4, generator=g) * brightness
    return (torch.nn.functional.interpolate(cells, size=(size, size), mode="bilinear") * 255).round().to(torch.uint8)


def _compare_with_torchmetrics(weights, dim: int) -> None:
    from torchmetrics.image.fid import FrechetInceptionDistance
    from torchmetrics.image.kid import KernelInceptionDistance

    real, other, fake = _images(0, n=8), _images(1, n=8), _images(2, n=8, brightness=0.5)
    extractor = InceptionExtractor(weights, dim=dim)
    ours = {}
    for name, images in (("real", real), ("other", other), ("fake", fake)):
        ours[name] = FeatureStats(dim)
        for i in range(0, len(images), 3):  # uneven batches on our side, whole sets on torchmetrics'
            ours[name].update(extractor(images[i:i + 3]))
    f = ours["real"].features()
    assert 0.1 < float(f.abs().mean()) < 2 and float(f.std(0).mean()) > 0.02 * float(f.abs().mean())  # O(0.1-1), varied

    tm = FrechetInceptionDistance(feature=dim, feature_extractor_weights_path=str(weights))
    tm.update(real, real=True)
    tm.update(fake, real=False)
    ref = float(tm.compute())
    reference = FrechetReference.from_stats(ours["real"])  # the symmetric form the runs use
    fid = reference.distance_to(ours["fake"])
    assert fid == pytest.approx(ref, rel=2e-6)  # the same float64 value; torchmetrics returns float32
    assert abs(reference.distance_to(ours["real"])) < 1e-6 * fid  # a set with itself (8 images: rank 7)
    if dim < 2048:  # the plain route's general eigenproblems: seconds at 64-d, 25-40 s each at 2048-d on one core
        assert fid_from_stats(ours["real"], ours["fake"]) == pytest.approx(ref, rel=1e-6)
        assert abs(fid_from_stats(ours["real"], ours["real"])) < 1e-6 * fid
        assert fid > 5 * fid_from_stats(ours["real"], ours["other"]) > 0  # another distribution, beyond another draw

    kid = KernelInceptionDistance(feature=tm.inception, subsets=3, subset_size=8)
    kid.update(real, real=True)
    kid.update(fake, real=False)
    ref_mean, _ = kid.compute()
    mean, _ = kernel_inception_distance(ours["real"].features(), ours["fake"].features(), subsets=3, subset_size=8)
    assert mean == pytest.approx(float(ref_mean), rel=1e-4)  # torchmetrics keeps KID features in float32


def test_inception_fid_and_kid_equal_torchmetrics(inception_weights):
    """The first pooling layer's 64 features: the same module and weights file, seconds on a CPU."""
    _compare_with_torchmetrics(inception_weights, 64)


@pytest.mark.slow
def test_inception_pool3_fid_and_kid_equal_torchmetrics(inception_weights):
    """The standard 2048 pool-3 features (a 2048 x 2048 eigenproblem per FID)."""
    _compare_with_torchmetrics(inception_weights, 2048)


def test_missing_or_wrong_inception_weights_name_the_file(tmp_path):
    with pytest.raises(WorkbenchError, match="weights-inception-2015-12-05-6726825d.pth"):
        InceptionExtractor(tmp_path / "nowhere.pth")
    with pytest.raises(WorkbenchError, match="weights-inception-2015-12-05-6726825d.pth"):
        InceptionExtractor(tmp_path)  # a folder without the file
    bad = tmp_path / "bad.pth"
    torch.save({"x": torch.zeros(1)}, bad)
    with pytest.raises(WorkbenchError, match="does not hold Inception-v3 weights"):
        InceptionExtractor(bad)


def test_clip_score_with_a_tiny_clip_from_config(tiny_clip):
    from transformers import CLIPModel, CLIPProcessor

    from evaluate.scorers.clip import ClipScorer

    images, captions = _images(2, n=4), ["a red circle", "two blue squares", "a green triangle", "a red circle"]
    scorer = ClipScorer(tiny_clip)
    scorer.update(images[:3], captions[:3])  # streamed in two batches
    scorer.update(images[3:], captions[3:])
    ours = scorer.compute()

    model, processor = CLIPModel.from_pretrained(tiny_clip), CLIPProcessor.from_pretrained(tiny_clip)
    with torch.no_grad():
        inputs = processor(text=captions, images=[im.permute(1, 2, 0).numpy() for im in images], return_tensors="pt",
                           padding=True)
        img = model.get_image_features(pixel_values=inputs["pixel_values"])
        txt = model.get_text_features(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    cos = torch.nn.functional.cosine_similarity(img.double(), txt.double())
    assert ours == pytest.approx(float((100 * cos).mean()), rel=1e-4, abs=1e-4)


def test_missing_clip_folder_is_one_line(tmp_path):
    from evaluate.scorers.clip import ClipScorer

    with pytest.raises(WorkbenchError, match="CLIP model folder not found"):
        ClipScorer(tmp_path / "no-clip")
