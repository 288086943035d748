"""Inter-rater agreement: Krippendorff's alpha for nominal answers (a, b, and ties as answered: none, good, bad).

alpha = 1 - D_o / D_e, observed over expected disagreement, from the coincidence matrix of values
given to the same unit (Krippendorff 2011, "Computing Krippendorff's Alpha-Reliability"). It allows
any number of raters per unit and missing answers; units rated once carry no information and drop out.
1 is perfect agreement, 0 what chance gives, below 0 systematic disagreement.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable


def krippendorff_alpha_nominal(units: Iterable[Iterable[Hashable]]) -> float:
    """Alpha for nominal values; `units` holds, per unit, the values its raters gave (missing ones left out).

    Returns nan when fewer than two values are pairable or only one value occurs.
    """
    coincidence: Counter = Counter()  # (c, k) -> o_ck
    for values in units:
        values = list(values)
        m = len(values)
        if m < 2:
            continue
        counts = Counter(values)
        for c, n_c in counts.items():
            for k, n_k in counts.items():
                pairs = n_c * (n_k - 1) if c == k else n_c * n_k
                if pairs:
                    coincidence[c, k] += pairs / (m - 1)
    n_c: Counter = Counter()
    for (c, _k), o in coincidence.items():
        n_c[c] += o
    n = sum(n_c.values())
    if n < 2 or len(n_c) < 2:
        return math.nan
    observed = sum(o for (c, k), o in coincidence.items() if c != k)
    expected = (n * n - sum(v * v for v in n_c.values())) / (n - 1)
    return 1 - observed / expected
