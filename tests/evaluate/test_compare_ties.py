"""`dwb evaluate compare` of two models that draw alike: the metrics they tie on exactly are one line, not one
"+0 [+0, +0] (p = 1)" each (a new user's compare printed that line for each of 14 metrics)."""
from __future__ import annotations

import numpy as np

from evaluate.compare import metric_difference
from evaluate.names import ATTRIBUTE_ACCURACY, METRICS, display_name
from evaluate.verdict import comparison_lines, overall, with_verdicts


def _result(metrics: list[dict]) -> dict:
    return {"a": "ba2", "b": "ba2-again", "guidance": 3.0, "sampler_a": "DPM++ 2M", "sampler_b": "DPM++ 2M",
            "steps_a": 20, "steps_b": 20, "weights_a": "ema", "weights_b": "ema", "n_images": 64, "n_prompts": 32,
            "bootstrap": 200, "replicates": {}, "metrics": metrics, "overall": overall(metrics)}


def test_metrics_that_tie_exactly_are_folded_into_one_line():
    rng = np.random.default_rng(0)
    prompts = np.repeat(np.arange(32), 2)
    tied_names = [k for k, m in METRICS.items() if m.family == ATTRIBUTE_ACCURACY][:14]
    metrics = []
    for name in tied_names:  # the same images: the same per-image values on both sides
        values = rng.integers(0, 2, size=64).astype(float)
        metrics.append(metric_difference(name, values.mean(), values.mean(), np.zeros(200),
                                         (prompts, values, values), 32))
    clip_a, clip_b = rng.normal(0.3, 0.02, 64), rng.normal(0.32, 0.02, 64)  # a metric that differs stays its line
    metrics.append(metric_difference("clip_score", clip_a.mean(), clip_b.mean(), rng.normal(0.02, 0.005, 200),
                                     (prompts, clip_b, clip_a), 32))
    lines = comparison_lines(_result(with_verdicts(metrics)))
    folded = [line for line in lines if "tied" in line]
    assert folded == [f"  cannot tell on 14 metrics, tied: B - A = 0 [0, 0] on each "
                      f"({', '.join(display_name(n) for n in tied_names)})"]
    assert not any("+0 [+0, +0]" in line for line in lines)
    assert sum("CLIP score" in line for line in lines) == 1


def test_one_tie_keeps_its_own_line():
    prompts = np.repeat(np.arange(32), 2)
    values = np.ones(64)
    tie = metric_difference("attr_all_all", 1.0, 1.0, np.zeros(200), (prompts, values, values), 32)
    lines = comparison_lines(_result(with_verdicts([tie])))
    assert not any("tied" in line for line in lines) and len(lines) > 1
