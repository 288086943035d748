"""Distances between image sets on extracted features: FID (Frechet distance) and KID (polynomial-kernel MMD).

Everything here is float64. Statistics are streamed (``FeatureStats``): a running sum and a running sum of
outer products, so memory does not grow with the number of images. KID needs the features themselves and
keeps at most ``kid_max`` of them per set (reservoir sampling with a fixed seed).
"""
from __future__ import annotations

import contextlib
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
        """Add another shard's statistics (ranks of a distributed run).

        The kept rows stay a uniform sample of the union: how many come from each side is drawn from the
        hypergeometric distribution of a uniform sample of the union, then that many are taken at random
        from each side's own uniform sample (which always holds enough).
        """
        keep = min(self.kid_max, self.n + other.n)
        if len(self.kept) + len(other.kept) > keep:  # both sides hold rows, so both n > 0
            mine = int(self._rng.hypergeometric(self.n, other.n, keep))
            self.kept = self._subsample(self.kept, mine) + self._subsample(other.kept, keep - mine)
        else:
            self.kept = self.kept + other.kept
        self.total += other.total
        self.outer += other.outer
        self.n += other.n

    def _subsample(self, rows: list[torch.Tensor], k: int) -> list[torch.Tensor]:
        return [rows[i] for i in sorted(self._rng.choice(len(rows), k, replace=False))]

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


class FrechetReference:
    """A fixed reference (mean, covariance) and its covariance's square root A = S1^{1/2}, computed once.

    Tr((S1 S2)^{1/2}) = Tr((A S2 A)^{1/2}): S1 S2 = A (A S2) has the eigenvalues of (A S2) A, a symmetric
    PSD matrix, so every distance against this reference needs only a symmetric eigenvalue problem
    (``eigvalsh``) instead of a general one. With Y = X A for generated features X (N, D), A S2 A is the
    covariance of Y, whose non-zero eigenvalues are those of the centred, weighted (m, m) Gram matrix of
    the m images a resample holds: below D images that matrix is the smaller one. Its Gram entries come
    from Y Y^T, computed once, so a replicate costs O(N^2 + m^3) instead of O(N D^2 + D^3).
    """

    def __init__(self, mean: torch.Tensor, cov: torch.Tensor):
        self.mean, self.cov = mean.to(torch.float64), cov.to(torch.float64)
        vals, vecs = torch.linalg.eigh(self.cov)
        self.sqrt = (vecs * vals.clamp(min=0).sqrt()) @ vecs.T  # (D, D)
        self.trace = float(self.cov.trace())

    @classmethod
    def from_stats(cls, stats: FeatureStats) -> "FrechetReference":
        if stats.n < 2:
            raise ValueError(f"FID needs at least 2 reference images, got {stats.n}")
        return cls(stats.mean, stats.cov)

    def distance(self, mean: torch.Tensor, cov: torch.Tensor) -> float:
        """The Frechet distance of (mean, cov) to the reference."""
        m = self.sqrt @ cov.to(torch.float64) @ self.sqrt
        return self._assemble(mean.to(torch.float64), float(cov.trace()), torch.linalg.eigvalsh((m + m.T) / 2))

    def distance_to(self, stats: FeatureStats) -> float:
        if stats.n < 2:
            raise ValueError(f"FID needs at least 2 images per set, got {stats.n} generated")
        return self.distance(stats.mean, stats.cov)

    def _assemble(self, mean: torch.Tensor, trace: float, eig: torch.Tensor) -> float:
        return float((self.mean - mean).square().sum() + self.trace + trace - 2 * eig.clamp(min=0).sqrt().sum())

    def replicates(self, features: torch.Tensor, weights: np.ndarray) -> np.ndarray:
        """The Frechet distance of the weighted set (N, D) for each row of ``weights`` (B, N) (counts: a
        bootstrap resample, or 0/1: a subset); the covariance is unbiased in the weights' total."""
        small = min(features.shape) <= BATCHED_MAX
        with one_thread() if small else contextlib.nullcontext():
            x = features.to(torch.float64)
            y = x @ self.sqrt  # (N, D)
            w = torch.as_tensor(weights, dtype=torch.float64)  # (B, N)
            n = w.sum(1)
            mean = w @ x / n[:, None]  # (B, D)
            trace = (w @ (x * x).sum(1) - n * mean.square().sum(1)) / (n - 1)
            root = _root_traces_batched(y, w, n) if small else _root_traces(y, w, n)
            return ((self.mean - mean).square().sum(1) + self.trace + trace - 2 * root).numpy()


BATCHED_MAX = 256  # up to this matrix side, replicates are solved together, on one thread (see one_thread)


@contextlib.contextmanager
def one_thread():
    """Small tensor work on one thread: 200 FID replicates of 200 8-d features took 0.30 s with two threads
    on a busy 2-core machine (every tiny parallel region waits for a descheduled thread) and 0.03 s with one."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)
GRAM_MAX = 4096  # _root_traces keeps the (N, N) Gram matrix up to this many images (128 MiB)


def _root_traces_batched(y: torch.Tensor, w: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Tr(C^{1/2}) for each replicate's weighted covariance C of ``y``, in batches: (D, D) matrices when
    N >= D, else the (N, N) weighted Gram matrices (an image of weight 0 adds a zero eigenvalue)."""
    out = []
    chunk = max(1, 2**22 // (y.shape[0] * y.shape[1]))  # at most 4M elements in the (b, N, D) intermediate
    for wc, nc in zip(w.split(chunk), n.split(chunk)):
        yc = (y[None] - (wc @ y / nc[:, None])[:, None, :]) * wc.sqrt()[:, :, None]  # (b, N, D) centred, weighted
        g = yc.transpose(1, 2) @ yc if y.shape[0] >= y.shape[1] else yc @ yc.transpose(1, 2)
        out.append(torch.linalg.eigvalsh(g / (nc - 1)[:, None, None]).clamp(min=0).sqrt().sum(-1))
    return torch.cat(out)


def _root_traces(y: torch.Tensor, w: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Tr(C^{1/2}) replicate by replicate, for large matrices: on the (m, m) Gram matrix of the m images a
    replicate holds when m < D (from Y Y^T, computed once), else on the (D, D) covariance."""
    gram = y @ y.T if len(y) <= GRAM_MAX else None  # (N, N)
    out = []
    for wi, ni in zip(w, n.tolist()):
        keep, mean_y = wi > 0, wi @ y / ni
        if int(keep.sum()) >= y.shape[1]:
            yc = y - mean_y
            g = (yc.T * wi) @ yc  # (D, D)
        elif gram is not None:  # (y_i - m)(y_j - m) = G_ij - a_i - a_j + |m|^2 with a = Y m
            a = (gram @ wi / ni)[keep]
            g = (gram[keep][:, keep] - a[:, None] - a[None, :] + mean_y.square().sum()) * torch.outer(wi[keep].sqrt(),
                                                                                                   wi[keep].sqrt())
        else:
            yc = (y[keep] - mean_y) * wi[keep].sqrt()[:, None]
            g = yc @ yc.T  # (m, m)
        out.append(torch.linalg.eigvalsh(g / (ni - 1)).clamp(min=0).sqrt().sum())
    return torch.stack(out)


def polynomial_kernel(a: torch.Tensor, b: torch.Tensor, degree: int = 3, coef: float = 1.0) -> torch.Tensor:
    """KID's kernel k(a, b) = (a.b / D + coef)^degree (Binkowski et al. 2018), (len(a), len(b))."""
    return (a @ b.T / a.shape[1] + coef) ** degree


def polynomial_mmd(x: torch.Tensor, y: torch.Tensor, degree: int = 3, coef: float = 1.0) -> float:
    """Unbiased MMD^2 with the kernel k(a, b) = (a.b / D + coef)^degree (Binkowski et al. 2018)."""
    x, y = x.to(torch.float64), y.to(torch.float64)
    m = x.shape[0]
    k_xx, k_yy, k_xy = (polynomial_kernel(a, b, degree, coef) for a, b in ((x, x), (y, y), (x, y)))
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


def gaussian_kernel(a: torch.Tensor, b: torch.Tensor, sigma: float = CMMD_SIGMA) -> torch.Tensor:
    """exp(-|a - b|^2 / (2 sigma^2)), (len(a), len(b))."""
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return torch.exp(-d2.clamp_min(0.0) / (2.0 * sigma**2))


def mmd_replicates(kernel, x: torch.Tensor, y: torch.Tensor, weights: np.ndarray, unbiased: bool,
                   block: int = 1024) -> np.ndarray:
    """MMD^2 between a fixed sample ``x`` (M, D) and the weighted set ``y`` (N, D), per row of ``weights`` (B, N).

    Weights are counts (a bootstrap resample repeats images). ``unbiased``: the U-statistic over the
    resample's positions (two copies of one image form a pair, a position with itself does not), as KID;
    otherwise the V-statistic (every pair), as CMMD. Kernel rows are computed ``block`` at a time, so
    memory stays at block x max(M, N); all B replicates share each block.
    """
    x, y = x.to(torch.float64), y.to(torch.float64)
    w = torch.as_tensor(weights, dtype=torch.float64)  # (B, N)
    m, n = len(x), w.sum(1)  # (B,) resample sizes
    xx = xx_diag = 0.0
    kx = torch.zeros(len(y), dtype=torch.float64)  # (N,) sum over x of k(x, y_i)
    for i in range(0, m, block):
        xi = x[i:i + block]
        xx += float(kernel(xi, x).sum())
        xx_diag += float(kernel(xi, xi).diagonal().sum())
        kx += kernel(xi, y).sum(0)
    yy = torch.zeros(len(w), dtype=torch.float64)  # (B,) w^T K_yy w
    yy_diag = torch.zeros(len(y), dtype=torch.float64)
    for i in range(0, len(y), block):
        k = kernel(y[i:i + block], y)  # (b, N)
        yy += (w[:, i:i + block] * (k @ w.T).T).sum(1)
        yy_diag[i:i + block] = k[:, i:i + block].diagonal()
    if unbiased:
        xx_term, yy_term = (xx - xx_diag) / (m * (m - 1)), (yy - w @ yy_diag) / (n * (n - 1))
    else:
        xx_term, yy_term = xx / m**2, yy / n**2
    return (xx_term + yy_term - 2.0 * (w @ kx) / (m * n)).numpy()


def cmmd(x: torch.Tensor, y: torch.Tensor, sigma: float = CMMD_SIGMA, scale: float = CMMD_SCALE) -> float:
    """CMMD: squared MMD between two sets of CLIP image embeddings with a Gaussian RBF kernel, x ``scale``.

    The V-statistic (every pair, the diagonal included), as the paper defines it: never negative and zero
    for identical sets. Embeddings are L2-normalised here; the arithmetic is float64.
    """
    if len(x) == 0 or len(y) == 0:
        raise ValueError("CMMD needs at least one embedding in each set")
    return float(cmmd_replicates(x, y, np.ones((1, len(y))), sigma, scale)[0])


def cmmd_replicates(x: torch.Tensor, y: torch.Tensor, weights: np.ndarray, sigma: float = CMMD_SIGMA,
                    scale: float = CMMD_SCALE) -> np.ndarray:
    """CMMD of the weighted embeddings ``y`` (N, D) against ``x``, per row of ``weights`` (B, N)."""
    x = torch.nn.functional.normalize(x.to(torch.float64), dim=1)
    y = torch.nn.functional.normalize(y.to(torch.float64), dim=1)
    return scale * mmd_replicates(lambda a, b: gaussian_kernel(a, b, sigma), x, y, weights, unbiased=False)


def kid_replicates(x: torch.Tensor, y: torch.Tensor, weights: np.ndarray) -> np.ndarray:
    """KID's unbiased polynomial-kernel MMD^2 of the weighted features ``y`` against ``x``, per row of ``weights``."""
    return mmd_replicates(polynomial_kernel, x, y, weights, unbiased=True)
