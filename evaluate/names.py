"""What each metric column is, in one table: its display name, which direction is better, its family and its
natural range.

The command line, the report and ``compare`` take names and directions from here, and every interval is
kept inside its metric's range (``range``, handed to ``bootstrap.interval``): FID, KID, CMMD and FD-DINOv2
are never below 0, accuracies and shares stay in [0, 1]. The app may not import evaluate, so every results
folder gets the table as ``OUT/metrics.json`` beside ``results.jsonl`` (``write_metrics_table``), in the form
``{"fid": {"name": "FID", "lower_is_better": true, "family": "image quality", "range": [0, null]}, ...}``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from models.common import write_text_whole
from models.errors import WorkbenchError
from models.shapes import asked_attributes, ATTRIBUTES, KINDS

from .attribute_accuracy import attr_column

METRICS_FILE = "metrics.json"
IMAGE_QUALITY, TEXT_ALIGNMENT, ATTRIBUTE_ACCURACY = "image quality", "text alignment", "attribute accuracy"
HUMAN_PREFERENCE = "human preference"
SUBJECT_FIDELITY, DRIFT = "subject fidelity", "drift"  # the adapter report's (evaluate/adapter_report.py)
FAMILIES = (IMAGE_QUALITY, TEXT_ALIGNMENT, ATTRIBUTE_ACCURACY, HUMAN_PREFERENCE, SUBJECT_FIDELITY, DRIFT)


@dataclass(frozen=True)
class Metric:
    """One results column: ``range`` is (low, high), None where unbounded."""

    key: str
    name: str
    lower_is_better: bool
    family: str
    range: tuple[float | None, float | None]

    def as_json(self) -> dict:
        return {"name": self.name, "lower_is_better": self.lower_is_better, "family": self.family,
                "range": list(self.range)}


DISTANCE, SHARE = (0, None), (0, 1)
KIND_NAMES = {"single": "one group", "object": "one object", "pair": "two groups", "all": "all prompts"}
VERDICT_NAMES = {"color": "colour", "shape": "shape", "count": "count", "position": "position",
                 "all": "every attribute right"}


def _attribute_metrics() -> list[Metric]:
    """``attr_<kind>_<verdict>``: "colour (one group)", "every attribute right (all prompts)"."""
    asked = {**{kind: asked_attributes(kind) for kind in KINDS}, "all": ATTRIBUTES}
    return [Metric(attr_column(kind, v), f"{VERDICT_NAMES[v]} ({KIND_NAMES[kind]})", False, ATTRIBUTE_ACCURACY, SHARE)
            for kind, verdicts in asked.items() for v in (*verdicts, "all")]


_TABLE = [
    Metric("fid", "FID", True, IMAGE_QUALITY, DISTANCE),
    Metric("fid_infinity", "FD-infinity", True, IMAGE_QUALITY, DISTANCE),
    Metric("kid_mean", "KID", True, IMAGE_QUALITY, DISTANCE),
    Metric("cmmd", "CMMD", True, IMAGE_QUALITY, DISTANCE),
    Metric("fd_dinov2", "FD-DINOv2", True, IMAGE_QUALITY, DISTANCE),
    Metric("precision", "precision", False, IMAGE_QUALITY, SHARE),
    Metric("recall", "recall", False, IMAGE_QUALITY, SHARE),
    Metric("density", "density", False, IMAGE_QUALITY, DISTANCE),
    Metric("coverage", "coverage", False, IMAGE_QUALITY, SHARE),
    Metric("clip_score", "CLIP score", False, TEXT_ALIGNMENT, (-100, 100)),  # 100 x cosine, not clipped at 0
    *_attribute_metrics(),
    # learned from people's choices (evaluate/scorers/preference.py): higher is preferred
    Metric("pickscore", "PickScore", False, HUMAN_PREFERENCE, (-100, 100)),  # CLIP logit: 100 x cosine
    Metric("hps", "HPSv2.1", False, HUMAN_PREFERENCE, (-1, 1)),  # a cosine
    Metric("imagereward", "ImageReward", False, HUMAN_PREFERENCE, (None, None)),  # standardised, unbounded
    Metric("aesthetic", "aesthetic score", False, HUMAN_PREFERENCE, (None, None)),  # a linear head: unbounded
    # an adapter against its base (evaluate/adapter_report.py): DreamBench's subject fidelity, each image's mean
    # cosine to the training images, and the drift on neutral prompts from the base's own image at the same seed
    Metric("dino_i", "DINO similarity to the training images", False, SUBJECT_FIDELITY, (-1, 1)),
    Metric("clip_i", "CLIP image similarity to the training images", False, SUBJECT_FIDELITY, (-1, 1)),
    Metric("drift_dino", "DINO distance from the base's image (neutral prompts)", True, DRIFT, (0, 2)),
    *(Metric(f"neutral_{key}", f"{name} on neutral prompts", False, DRIFT, bounds) for key, name, bounds in (
        ("pickscore", "PickScore", (-100, 100)), ("hps", "HPSv2.1", (-1, 1)),
        ("imagereward", "ImageReward", (None, None)), ("aesthetic", "aesthetic score", (None, None)))),
]
PREFERENCE_COLUMNS = ("pickscore", "hps", "imagereward", "aesthetic")
METRICS: dict[str, Metric] = {m.key: m for m in _TABLE}


def metric(key: str) -> Metric:
    """The table's entry for a results column; a column the table does not hold is a one-line error."""
    if key not in METRICS:
        raise WorkbenchError(f"unknown metric {key!r} (known: {', '.join(METRICS)})")
    return METRICS[key]


def display_name(key: str) -> str:
    """The metric's name for people ("every attribute right (two groups)"); an unknown column as it is."""
    return METRICS[key].name if key in METRICS else key


def with_direction(key: str) -> str:
    """"FID (lower is better)"."""
    m = metric(key)
    return f"{m.name} ({'lower' if m.lower_is_better else 'higher'} is better)"


def value_range(key: str) -> tuple[float | None, float | None]:
    """The metric's natural range; (None, None) for a column the table does not hold."""
    return METRICS[key].range if key in METRICS else (None, None)


def difference_range(key: str) -> tuple[float | None, float | None]:
    """The range of a difference B - A of this metric: [low - high, high - low] ([-1, 1] for an accuracy)."""
    low, high = value_range(key)
    if low is None or high is None:
        return None, None
    return low - high, high - low


def metrics_table() -> dict[str, dict]:
    return {key: m.as_json() for key, m in METRICS.items()}


def write_metrics_table(folder: str | Path) -> Path:
    """``FOLDER/metrics.json``: the table, for readers that may not import evaluate (the app)."""
    return write_text_whole(Path(folder) / METRICS_FILE, json.dumps(metrics_table(), indent=1) + "\n")
