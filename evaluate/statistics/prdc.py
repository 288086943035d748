"""Precision and recall (Kynkaanniemi et al. 2019), density and coverage (Naeem et al. 2020), k = 5.

Every reference feature x_i gets a radius r_i, the distance to its k-th nearest neighbour among the
reference features (itself excluded); every generated feature y_j likewise among the generated ones.
With M generated and R reference features:

- precision = share of y_j inside some reference ball: exists i, |y_j - x_i| < r_i
- recall    = share of x_i inside some generated ball: exists j, |x_i - y_j| < r(y_j)
- density   = (1 / kM) sum_j #{i : |y_j - x_i| < r_i}  (about 1 when the sets match; above 1 where samples crowd)
- coverage  = share of x_i whose nearest generated feature lies inside r_i

Strict inequalities, as the authors' implementation (clovaai/generative-evaluation-prdc), in float64,
``block`` rows at a time so memory stays at block x max(R, M).

**Ties at a ball's edge.** A set scored against itself puts every ball's k-th neighbour exactly on its
edge, so each comparison must see the same distance whichever way round it was computed. Distances
through a matrix product (||a||² + ||b||² - 2 a·b, what ``torch.cdist`` does by default) are not:
BLAS rounds a·b differently when the product is transposed or cut into other blocks (measured: up to
1.4e-14 apart on this suite's machine, 8.9e-16 on an Intel Xeon with MKL, which made the density of a
set against itself 1.005 instead of 1). So every decision is taken on exact squared distances,
sum((a - b)²), which are the same bits in either orientation and in any block. Computing all of them
costs 10-16x a matrix product (2,000-4,000 points, 768-1,024 features), so the product still does the
work: it decides every comparison its rounding bound cannot flip, and only the few pairs within that
bound of an edge are computed exactly (1.2-1.6x the product-only version; BENCHMARKS.md).
"""
from __future__ import annotations

import torch

K = 5


class _Distances:
    """Squared distances from a block of rows ``a`` to every row of ``b``: fast, with a bound on their
    rounding, and exact where a decision needs it."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, b_sq: torch.Tensor):
        self.a, self.b = a, b
        a_sq = (a * a).sum(1)
        self.fast = torch.addmm(a_sq[:, None] + b_sq[None, :], a, b.T, alpha=-2).clamp_(min=0)  # (n_a, n_b)
        # |fast - exact| <= (d + 2) u (||a||² + ||b||² + 2|a||b|) <= 2 (d + 2) u (||a||² + ||b||²), doubled for the
        # norms' own rounding; one bound for the block (the largest norms): a scalar costs no pass over the matrix
        self.slack = float(4 * (a.shape[1] + 2) * torch.finfo(torch.float64).eps * (a_sq.max() + b_sq.max()))

    def exact(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """sum((a - b)²) for the given (row, column) pairs: the same value in either orientation."""
        return ((self.a[rows] - self.b[cols]) ** 2).sum(1)

    def below(self, radius_sq: torch.Tensor) -> torch.Tensor:
        """(n_a, n_b) booleans: exact distance < radius, where ``radius_sq`` broadcasts against the matrix."""
        margin = self.fast - radius_sq
        inside = margin < -self.slack
        rows, cols = (margin.abs_() <= self.slack).nonzero(as_tuple=True)  # within rounding of the ball's edge
        if len(rows):
            inside[rows, cols] = self.exact(rows, cols) < radius_sq.expand_as(self.fast)[rows, cols]
        return inside

    def kth_smallest(self, k: int) -> torch.Tensor:
        """(n_a,) the exact k-th smallest squared distance of each row (k = 1 is the smallest)."""
        fast_kth = self.fast.kthvalue(k, dim=1).values
        # every pair whose exact distance could be at most the exact k-th is a candidate; the others stay infinite
        rows, cols = (self.fast <= (fast_kth + 2 * self.slack)[:, None]).nonzero(as_tuple=True)  # row-major
        counts = torch.bincount(rows, minlength=len(self.fast))  # k or a few more per row
        place = torch.arange(len(rows)) - (torch.cumsum(counts, 0) - counts)[rows]
        exact = torch.full((len(self.fast), int(counts.max())), float("inf"), dtype=self.fast.dtype)
        exact[rows, place] = self.exact(rows, cols)
        return exact.kthvalue(k, dim=1).values


def _blocks(a: torch.Tensor, b: torch.Tensor, block: int):
    b_sq = (b * b).sum(1)
    for start in range(0, len(a), block):
        yield start, _Distances(a[start:start + block], b, b_sq)


def knn_radii(x: torch.Tensor, k: int = K, block: int = 1024) -> torch.Tensor:
    """(N,) squared distance from each row to its k-th nearest other row, exact."""
    x = x.to(torch.float64)
    if len(x) <= k:
        raise ValueError(f"precision/recall with k = {k} needs more than {k} features per set, got {len(x)}")
    return torch.cat([d.kth_smallest(k + 1) for _, d in _blocks(x, x, block)])  # the row itself is the first


def prdc(real: torch.Tensor, fake: torch.Tensor, k: int = K, block: int = 1024) -> dict[str, float]:
    """``precision``, ``recall``, ``density``, ``coverage`` of generated features ``fake`` against ``real``."""
    real, fake = real.to(torch.float64), fake.to(torch.float64)
    r_real, r_fake = knn_radii(real, k, block), knn_radii(fake, k, block)
    inside_any = inside_count = 0
    for _, d in _blocks(fake, real, block):
        inside = d.below(r_real[None, :])  # (b, R): y_j in x_i's ball
        inside_any += int(inside.any(1).sum())
        inside_count += int(inside.sum())
    recalled = covered = 0
    for start, d in _blocks(real, fake, block):
        recalled += int(d.below(r_fake[None, :]).any(1).sum())
        # nearest generated feature inside x_i's ball <=> some generated feature is
        covered += int(d.below(r_real[start:start + block, None]).any(1).sum())
    m, r = len(fake), len(real)
    return {"precision": inside_any / m, "recall": recalled / r, "density": inside_count / (k * m),
            "coverage": covered / r}
