"""Precision, recall, density and coverage against the papers' formulas; DINOv2 features from a local folder only."""
import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist

from evaluate.scorers.dinov2 import Dinov2Extractor
from evaluate.statistics.metrics import FeatureStats, FrechetReference
from evaluate.statistics.prdc import prdc
from models.errors import WorkbenchError

from .test_metrics import _images


def _papers_prdc(real: np.ndarray, fake: np.ndarray, k: int) -> dict:
    """Kynkaanniemi et al. 2019 (precision, recall) and Naeem et al. 2020 (density, coverage), written out."""
    radius_real = np.sort(cdist(real, real), axis=1)[:, k]  # column 0 is the point itself
    radius_fake = np.sort(cdist(fake, fake), axis=1)[:, k]
    d = cdist(real, fake)  # (R, M)
    r, m = len(real), len(fake)
    return {"precision": np.mean([any(d[i, j] < radius_real[i] for i in range(r)) for j in range(m)]),
            "recall": np.mean([any(d[i, j] < radius_fake[j] for j in range(m)) for i in range(r)]),
            "density": sum(d[i, j] < radius_real[i] for i in range(r) for j in range(m)) / (k * m),
            "coverage": np.mean([d[i].min() < radius_real[i] for i in range(r)])}


def test_prdc_follows_the_papers_formulas():
    rng = np.random.default_rng(0)
    real, fake = rng.normal(size=(40, 5)), rng.normal(loc=0.4, scale=0.8, size=(30, 5))
    ours = prdc(torch.from_numpy(real), torch.from_numpy(fake), k=5, block=7)  # blocks cut across the sets
    assert ours == pytest.approx(_papers_prdc(real, fake, 5), abs=1e-12)
    assert 0 < ours["precision"] < 1 and 0 < ours["recall"] < 1
    same = prdc(torch.from_numpy(real), torch.from_numpy(real))
    assert same == pytest.approx({"precision": 1.0, "recall": 1.0, "density": 1.0, "coverage": 1.0})
    far = prdc(torch.from_numpy(real), torch.from_numpy(fake + 50.0))
    assert far == {"precision": 0.0, "recall": 0.0, "density": 0.0, "coverage": 0.0}
    with pytest.raises(ValueError, match="more than 5 features"):
        prdc(torch.from_numpy(real), torch.from_numpy(fake[:5]))


@pytest.mark.parametrize("n, dim", [(40, 5), (200, 64), (500, 768)])
def test_a_set_against_itself_scores_exactly_one_whatever_the_blocks(n, dim):
    """Each ball's k-th neighbour lies exactly on its edge: the comparison must not depend on which way round, or
    in which block, BLAS computed that distance (through a matrix product it did: density 1.002-1.01 here)."""
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    for block in (7, 64, 1024):
        assert prdc(x, x, block=block) == {"precision": 1.0, "recall": 1.0, "density": 1.0, "coverage": 1.0}


def test_ties_everywhere_follow_the_papers_formulas():
    """Features on a small integer grid: many equal distances, duplicates, balls of radius 0."""
    rng = np.random.default_rng(1)
    real, fake = rng.integers(0, 3, size=(60, 3)).astype(float), rng.integers(0, 4, size=(50, 3)).astype(float)
    assert prdc(torch.from_numpy(real), torch.from_numpy(fake), block=16) == _papers_prdc(real, fake, 5)


def test_dinov2_features_are_varied_and_fd_separates_sets(tiny_dinov2):
    extractor = Dinov2Extractor(tiny_dinov2)
    assert extractor.dim == 32 and extractor.name == f"dinov2:{tiny_dinov2.name}" and len(extractor.weights_hash) == 16
    sets = {name: extractor(images) for name, images in (("real", _images(0, n=12)), ("other", _images(1, n=12)),
                                                           ("dark", _images(2, n=12, brightness=0.4)))}
    f = sets["real"]
    assert f.dtype == torch.float64 and f.shape == (12, 32)
    assert 0.1 < float(f.abs().mean()) < 2 and float(f.std(0).mean()) > 0.2 * float(f.abs().mean())  # O(0.1-1), varied
    stats = {}
    for name, features in sets.items():
        stats[name] = FeatureStats(32)
        stats[name].update(features)
    reference = FrechetReference.from_stats(stats["real"])
    other = reference.distance_to(stats["other"])
    assert abs(reference.distance_to(stats["real"])) < 1e-6 * other  # 12 images in 32-d: rank 11, sqrt of round-off
    assert reference.distance_to(stats["dark"]) > 2 * other > 0


def test_dinov2_comes_from_a_folder_or_the_local_cache_only(tmp_path):
    with pytest.raises(WorkbenchError, match="DINOv2 model folder not found"):
        Dinov2Extractor(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkbenchError, match="holds no DINOv2 model"):
        Dinov2Extractor(tmp_path / "empty")
    with pytest.raises(WorkbenchError, match="not in the local Hugging Face cache and is never downloaded"):
        Dinov2Extractor("nobody-here/no-dinov2")
