"""FD-infinity: the Frechet distance extrapolated to infinitely many generated images (Chong & Forsyth 2020,
"Effectively Unbiased FID and Inception Score and where to find them", CVPR).

FID is biased upward by an amount that falls as 1/N with the number N of generated images, and that
amount depends on the model, so FIDs at different N, and even two models at the same N, do not compare
cleanly. The paper computes FID on random subsets of several sizes, fits FID_N = FD_inf + k / N by least
squares and reports the intercept (15 sizes from 5,000 to 50,000 images). Here: ``SIZES`` sizes evenly
spaced from N/5 to N (the paper's span of 10x, halved so that a 1,000-image row still has a fit), one
random subset each, against the fixed reference statistics.
"""
from __future__ import annotations

import numpy as np
import torch

from .metrics import FrechetReference

SIZES = 15
SMALLEST = 0.2  # the smallest subset, as a fraction of N
MIN_IMAGES = 50  # fewer images than this: no fit (a handful of sizes of a few images each says nothing)


def subset_sizes(n: int, sizes: int = SIZES, smallest: float = SMALLEST) -> np.ndarray:
    return np.unique(np.linspace(max(2, round(smallest * n)), n, sizes).round().astype(int))


def fd_infinity(reference: FrechetReference, features: torch.Tensor, sizes: int = SIZES, smallest: float = SMALLEST,
                seed: int = 0) -> float | None:
    """The intercept at 1/N = 0 of the least-squares line through (1/n, FID of a random n-subset); ``None``
    below ``MIN_IMAGES`` images."""
    n = len(features)
    if n < MIN_IMAGES:
        return None
    ns = subset_sizes(n, sizes, smallest)
    rng = np.random.default_rng(seed)
    weights = np.zeros((len(ns), n))
    for row, k in zip(weights, ns):
        row[rng.choice(n, k, replace=False)] = 1.0
    fids = reference.replicates(features, weights)
    _, intercept = np.polyfit(1.0 / ns, fids, 1)
    return float(intercept)
