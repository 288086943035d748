"""Distances between image sets on extracted features: FID (Frechet distance) and KID (polynomial-kernel MMD).

Everything here is float64. Statistics are streamed (``FeatureStats``): a running sum and a running sum of
outer products, so memory does not grow with the number of images. KID needs the features themselves and
keeps at most ``kid_max`` of them per set (reservoir sampling with a fixed seed).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class FeatureStats:
    """Streaming float64 mean and covariance of (N, D) features, plus a bounded sample for KID."""

    dim: int
    kid_max: int = 10000
    seed: int = 0
    n: int = 0
    total: torch.Tensor = field(init=False)   # (D,)
    outer: torch.Tensor = field(init=False)   # (D, D)
    kept: list[torch.Tensor] = field(init=False, default_factory=list)
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.total = torch.zeros(self.dim, dtype=torch.float64)
        self.outer = torch.zeros(self.dim, self.dim, dtype=torch.float64)
        self.kept = []
        self._rng = np.random.default_rng(self.seed)

    def update(self, features: torch.Tensor) -> None:
        f = features.detach().to("cpu", torch.float64).reshape(features.shape[0], -1)  # (B, D)
        if f.shape[1] != self.dim:
            raise ValueError(f"expected {self.dim}-dimensional features, got {f.shape[1]}")
        self.total += f.sum(0)
        self.outer += f.T @ f
        for row in f:  # reservoir sampling (Algorithm R): a uniform sample of at most kid_max rows
            if len(self.kept) < self.kid_max:
                self.kept.append(row.clone())
            else:
                j = int(self._rng.integers(self.n + 1))
                if j < self.kid_max:
                    self.kept[j] = row.clone()
            self.n += 1

    def merge(self, other: "FeatureStats") -> None:
        """Add another shard's statistics (ranks of a distributed run). KID keeps the first ``kid_max`` rows."""
        self.total += other.total
        self.outer += other.outer
        self.n += other.n
        self.kept = (self.kept + other.kept)[: self.kid_max]

    @property
    def mean(self) -> torch.Tensor:
        return self.total / self.n

    @property
    def cov(self) -> torch.Tensor:
        """Unbiased covariance, (D, D)."""
        mu = self.mean[:, None]
        return (self.outer - self.n * (mu @ mu.T)) / (self.n - 1)

    def features(self) -> torch.Tensor:
        return torch.stack(self.kept) if self.kept else torch.zeros(0, self.dim, dtype=torch.float64)

    def state_dict(self) -> dict:
        return {"dim": self.dim, "n": self.n, "total": self.total, "outer": self.outer, "kept": self.features()}

    @classmethod
    def from_state_dict(cls, state: dict, kid_max: int = 10000) -> "FeatureStats":
        stats = cls(int(state["dim"]), kid_max=kid_max)
        stats.n, stats.total, stats.outer = int(state["n"]), state["total"].double(), state["outer"].double()
        stats.kept = list(state["kept"].double())[:kid_max]
        return stats


def frechet_distance(mu1: torch.Tensor, sigma1: torch.Tensor, mu2: torch.Tensor, sigma2: torch.Tensor) -> float:
    """d^2 = |mu1 - mu2|^2 + Tr(S1 + S2 - 2 (S1 S2)^{1/2}) (Heusel et al. 2017), in float64.

    Tr((S1 S2)^{1/2}) is the sum of square roots of the eigenvalues of S1 S2, which are real and
    non-negative for covariance matrices; tiny negative round-off is clipped to zero.
    """
    mu1, mu2, sigma1, sigma2 = (t.to(torch.float64) for t in (mu1, mu2, sigma1, sigma2))
    eig = torch.linalg.eigvals(sigma1 @ sigma2).real.clamp(min=0)
    return float((mu1 - mu2).square().sum() + sigma1.trace() + sigma2.trace() - 2 * eig.sqrt().sum())


def fid_from_stats(real: FeatureStats, fake: FeatureStats) -> float:
    if real.n < 2 or fake.n < 2:
        raise ValueError(f"FID needs at least 2 images per set (reference {real.n}, generated {fake.n})")
    return frechet_distance(real.mean, real.cov, fake.mean, fake.cov)


def polynomial_mmd(x: torch.Tensor, y: torch.Tensor, degree: int = 3, coef: float = 1.0) -> float:
    """Unbiased MMD^2 with the kernel k(a, b) = (a.b / D + coef)^degree (Binkowski et al. 2018)."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    m, d = x.shape
    k_xx = (x @ x.T / d + coef) ** degree
    k_yy = (y @ y.T / d + coef) ** degree
    k_xy = (x @ y.T / d + coef) ** degree
    off = (k_xx.sum() - k_xx.diagonal().sum() + k_yy.sum() - k_yy.diagonal().sum()) / (m * (m - 1))
    return float(off - 2 * k_xy.sum() / m**2)


def kernel_inception_distance(real: torch.Tensor, fake: torch.Tensor, subsets: int = 100, subset_size: int = 1000,
                              seed: int = 0) -> tuple[float, float]:
    """KID mean and standard deviation over ``subsets`` random subsets of ``subset_size`` rows per set.

    The subset size shrinks to the smaller set when a set is smaller than ``subset_size``.
    """
    size = min(subset_size, real.shape[0], fake.shape[0])
    if size < 2:
        raise ValueError(f"KID needs at least 2 images per set (reference {real.shape[0]}, generated {fake.shape[0]})")
    g = torch.Generator().manual_seed(seed)
    scores = []
    for _ in range(subsets):
        xi = torch.randperm(real.shape[0], generator=g)[:size]
        yi = torch.randperm(fake.shape[0], generator=g)[:size]
        scores.append(polynomial_mmd(real[xi], fake[yi]))
    s = torch.tensor(scores, dtype=torch.float64)
    return float(s.mean()), float(s.std(unbiased=False))


CMMD_SIGMA = 10.0  # Gaussian kernel bandwidth on unit-norm CLIP embeddings (Jayasumana et al. 2024)
CMMD_SCALE = 1000.0  # reported x1000, as in the paper


def cmmd(x: torch.Tensor, y: torch.Tensor, sigma: float = CMMD_SIGMA, scale: float = CMMD_SCALE) -> float:
    """CMMD: squared MMD between two sets of CLIP image embeddings with a Gaussian RBF kernel, x ``scale``.

    The V-statistic (every pair, the diagonal included), as the paper defines it: never negative and zero
    for identical sets. Embeddings are L2-normalised here; the arithmetic is float64.
    """
    x = torch.nn.functional.normalize(x.to(torch.float64), dim=1)
    y = torch.nn.functional.normalize(y.to(torch.float64), dim=1)
    if len(x) == 0 or len(y) == 0:
        raise ValueError("CMMD needs at least one embedding in each set")
    gamma = 1.0 / (2.0 * sigma**2)

    def mean_kernel(a: torch.Tensor, b: torch.Tensor, block: int = 2048) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float64)
        for i in range(0, len(a), block):  # row blocks: memory stays block x len(b)
            ai = a[i:i + block]
            d2 = (ai * ai).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * ai @ b.T
            total += torch.exp(-gamma * d2.clamp_min(0.0)).sum()
        return total / (len(a) * len(b))

    return float(scale * (mean_kernel(x, x) + mean_kernel(y, y) - 2.0 * mean_kernel(x, y)))
