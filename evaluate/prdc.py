"""Precision and recall (Kynkaanniemi et al. 2019), density and coverage (Naeem et al. 2020), k = 5.

Every reference feature x_i gets a radius r_i, the distance to its k-th nearest neighbour among the
reference features (itself excluded); every generated feature y_j likewise among the generated ones.
With M generated and R reference features:

- precision = share of y_j inside some reference ball: exists i, |y_j - x_i| < r_i
- recall    = share of x_i inside some generated ball: exists j, |x_i - y_j| < r(y_j)
- density   = (1 / kM) sum_j #{i : |y_j - x_i| < r_i}  (about 1 when the sets match; above 1 where samples crowd)
- coverage  = share of x_i whose nearest generated feature lies inside r_i

Strict inequalities, as the authors' implementation (clovaai/generative-evaluation-prdc). Euclidean
distances in float64, computed ``block`` rows at a time so memory stays at block x max(R, M).
"""
from __future__ import annotations

import torch

K = 5


def knn_radii(x: torch.Tensor, k: int = K, block: int = 1024) -> torch.Tensor:
    """(N,) distance from each row to its k-th nearest other row."""
    x = x.to(torch.float64)
    if len(x) <= k:
        raise ValueError(f"precision/recall with k = {k} needs more than {k} features per set, got {len(x)}")
    return torch.cat([torch.cdist(x[i:i + block], x).kthvalue(k + 1, dim=1).values for i in range(0, len(x), block)])


def prdc(real: torch.Tensor, fake: torch.Tensor, k: int = K, block: int = 1024) -> dict[str, float]:
    """``precision``, ``recall``, ``density``, ``coverage`` of generated features ``fake`` against ``real``."""
    real, fake = real.to(torch.float64), fake.to(torch.float64)
    r_real, r_fake = knn_radii(real, k, block), knn_radii(fake, k, block)
    inside_any = inside_count = 0
    for j in range(0, len(fake), block):
        inside = torch.cdist(fake[j:j + block], real) < r_real[None, :]  # (b, R): y_j in x_i's ball
        inside_any += int(inside.any(1).sum())
        inside_count += int(inside.sum())
    recalled = covered = 0
    for i in range(0, len(real), block):
        d = torch.cdist(real[i:i + block], fake)  # (b, M)
        recalled += int((d < r_fake[None, :]).any(1).sum())
        covered += int((d.min(1).values < r_real[i:i + block]).sum())
    m, r = len(fake), len(real)
    return {"precision": inside_any / m, "recall": recalled / r, "density": inside_count / (k * m),
            "coverage": covered / r}
