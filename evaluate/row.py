"""One (checkpoint, guidance) row: what is measured on its images, batch by batch, merged across ranks.

Each rank feeds ``RowScorer.on_batch`` the images it generated and hands ``part()`` to rank 0, which
computes the row's metrics (``row_metrics``): FID / KID on the extractor's features, CLIP score, CMMD,
FD-DINOv2 with precision / recall / density / coverage, attribute accuracy, FD-infinity, a 95% bootstrap
interval on every metric (``bootstrap.py``), and CLIP score, the human-preference scores (``preference.py``)
and attribute accuracy per prompt category. Per-image values (CLIP score, preference scores, attribute
verdicts) go to the manifest; per-image features are saved
beside it (``FEATURES``), so two rows can be compared image by image later (``compare.py``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from models.common import torch_save_whole
from models.shapes import parse_caption, read_scenes

from .attribute_accuracy import VERDICTS, AttributeTally, attribute_values, judge
from .statistics.bootstrap import interval, mean_interval, prompt_weights, weighted_means
from .statistics.fd_infinity import fd_infinity
from .statistics.metrics import FeatureStats, cmmd, cmmd_replicates, kernel_inception_distance, kid_replicates
from .names import value_range
from .statistics.prdc import prdc
from .scorers.preference import scores_of
from .prompts import Prompt

FEATURES = "features.pt"


def key_order(parts: list[dict]) -> list[int]:
    """Where each image of the ranks' parts, joined in rank order, goes in (prompt index, image index) order."""
    keys = [k for p in parts for k in p["keys"]]
    return sorted(range(len(keys)), key=keys.__getitem__)


def merged_stats(states: list[dict], kid_max: int, order: list[int] | None = None) -> FeatureStats:
    """One set's statistics from every rank's ``FeatureStats.state_dict()``, in rank order.

    Ranks take batches in turn, so the joined KID sample holds the images in another order than one process's;
    KID draws its subsets by position, and 6 images on 4 ranks gave another KID than on one process. While the
    sample holds every image, ``order`` (``key_order``) puts it in (prompt, image) order, as one process keeps it.
    """
    merged = FeatureStats.from_state_dict(states[0], kid_max=kid_max)
    for state in states[1:]:
        merged.merge(FeatureStats.from_state_dict(state, kid_max=kid_max))
    if order is not None and len(merged.kept) == merged.n:  # nothing dropped: the ranks' rows, joined in rank order
        merged.kept = [merged.kept[i] for i in order]
    return merged


class RowScorer:
    """Streams one row's images through every extractor; keeps per-image values and features.

    Feature sets by name: ``fid`` (the FID extractor, or the shapes scorer's features), ``cmmd`` (CLIP
    image embeddings), ``fd_dinov2`` (DINOv2). Features are kept per image in float32 (N x D x 4 bytes:
    8 MiB per 1,000 images at 2,048-d) for the intervals, FD-infinity and later comparisons.
    """

    def __init__(self, extractor, *, scorer=None, clip=None, clip_images=None, dinov2=None, preference=None,
                 kid_max: int = 10000, seed: int = 0):
        self.extractors = {"fid": extractor, "cmmd": clip_images, "fd_dinov2": dinov2}
        self.extractors = {k: v for k, v in self.extractors.items() if v is not None}
        self.scorer, self.clip = scorer, clip
        if clip is not None:
            clip.reset()
        self.stats = {k: FeatureStats(e.dim, kid_max=kid_max, seed=seed) for k, e in self.extractors.items()}
        self.features: dict[str, list[torch.Tensor]] = {k: [] for k in self.extractors}
        self.keys: list[tuple[int, int]] = []
        self.categories: list[str] = []
        self.clip_scores: list[float] = []
        self.preference = preference or {}  # column name -> scorer (preference.load_preference_scorers)
        self.preference_scores: dict[str, list[float]] = {k: [] for k in self.preference}
        self.verdicts: list[dict | None] = []  # per image: the attribute verdicts, None without one
        self.seconds = 0.0

    def on_batch(self, images: torch.Tensor, chunk: list[tuple[Prompt, int]]) -> None:
        """``images``: (B, 3, H, W) uint8 of the batch's (prompt, image index) jobs, in order (one size a batch)."""
        t = time.perf_counter()
        captions = [p.text for p, _ in chunk]
        self.keys += [(p.index, i) for p, i in chunk]
        self.categories += [p.category for p, _ in chunk]
        for name, extractor in self.extractors.items():
            if name == "fid" and self.scorer is not None:
                f, logits = self.scorer.run(images)
                self.verdicts += [_verdict(c, seen) for c, seen in zip(captions, read_scenes(logits))]
            else:
                f = extractor(images)
            self.stats[name].update(f)
            self.features[name].append(f.to(torch.float32))
        if self.clip is not None:
            self.clip_scores += self.clip.update(images, captions).tolist()
        for name, preference in self.preference.items():
            self.preference_scores[name] += scores_of(preference, images, captions).tolist()
        self.seconds += time.perf_counter() - t

    def part(self) -> dict:
        """This rank's share, picklable (``dist.all_gather_object``)."""
        return {"keys": self.keys, "categories": self.categories, "clip_score": self.clip_scores,
                "verdicts": self.verdicts, "preference": self.preference_scores, "stats": {k: s.state_dict() for k, s in self.stats.items()},
                "features": {k: torch.cat(v) if v else torch.zeros(0, self.stats[k].dim) for k, v in self.features.items()}}


def _verdict(caption: str, seen) -> dict | None:
    asked = parse_caption(caption)
    return None if asked is None else judge(asked, seen)  # captions outside the shapes grammar get no verdict


@dataclass
class RowImages:
    """Every rank's images of a row, in (prompt index, image index) order."""

    keys: list[tuple[int, int]]
    categories: list[str]
    clip_score: np.ndarray | None  # (N,)
    verdicts: list[dict | None]
    features: dict[str, torch.Tensor]  # name -> (N, D) float32
    preference: dict[str, np.ndarray] = field(default_factory=dict)  # column name -> (N,) per-image scores
    prompts: np.ndarray = field(init=False)  # (N,) prompt index of each image: the bootstrap's unit

    def __post_init__(self) -> None:
        self.prompts = np.array([k[0] for k in self.keys], dtype=np.int64)

    @classmethod
    def gather(cls, parts: list[dict]) -> "RowImages":
        joined = {name: [x for p in parts for x in p[name]] for name in ("keys", "categories", "clip_score", "verdicts")}
        order = key_order(parts)
        ordered = {name: [values[i] for i in order] if values else [] for name, values in joined.items()}
        features = {k: torch.cat([p["features"][k] for p in parts])[order] for k in parts[0]["features"]}
        clip = np.array(ordered["clip_score"]) if ordered["clip_score"] else None
        preference = {k: np.array([x for p in parts for x in p.get("preference", {})[k]])[order]
                      for k in parts[0].get("preference", {})}
        return cls(ordered["keys"], ordered["categories"], clip, ordered["verdicts"], features, preference)

    def attribute_matrix(self, captions: dict[int, str]) -> tuple[list[str], np.ndarray]:
        """The tally keys and an (N, K) matrix of 1 / 0 per image, NaN where an image does not count."""
        values = [attribute_values(parse_caption(captions[k[0]]), v) if v else {} for k, v in zip(self.keys, self.verdicts)]
        names = sorted({n for v in values for n in v})
        return names, np.array([[v.get(n, np.nan) for n in names] for v in values]).reshape(len(values), len(names))

    def per_image(self) -> dict[tuple[int, int], dict]:
        """The manifest's per-image metric values: ``clip_score`` and ``attr_<verdict>`` (true / false / null)."""
        out = {}
        for i, key in enumerate(self.keys):
            extra = {}
            if self.clip_score is not None:
                extra["clip_score"] = round(float(self.clip_score[i]), 4)
            extra.update({k: round(float(v[i]), 6) for k, v in self.preference.items()})
            if self.verdicts:
                v = self.verdicts[i] or {}
                extra.update({f"attr_{k}": v.get(k) for k in VERDICTS})
            out[key] = extra
        return out


SET_METRICS = ("fid", "kid_mean", "cmmd", "fd_dinov2")


def set_replicates(images: RowImages, references: dict, weights: np.ndarray,
                   names: tuple[str, ...] = SET_METRICS) -> dict[str, np.ndarray]:
    """Bootstrap replicates of the set metrics (those of ``names`` the row has): the weighted generated features
    against the fixed reference."""
    f, reps = images.features["fid"], {}
    if "fid" in names:
        reps["fid"] = references["fid"].frechet.replicates(f, weights)
    if "kid_mean" in names:
        reps["kid_mean"] = kid_replicates(references["fid"].stats.features(), f, weights)
    if "cmmd" in images.features and "cmmd" in names:
        reps["cmmd"] = cmmd_replicates(references["cmmd"].stats.features(), images.features["cmmd"], weights)
    if "fd_dinov2" in images.features and "fd_dinov2" in names:
        reps["fd_dinov2"] = references["fd_dinov2"].frechet.replicates(images.features["fd_dinov2"], weights)
    return reps


def mean_values(images: RowImages, captions: dict[int, str]) -> dict[str, np.ndarray]:
    """Per-image metrics by column name: ``clip_score``, the preference scores and the ``attr_*`` accuracies
    (NaN: does not count)."""
    values = {} if images.clip_score is None else {"clip_score": images.clip_score}
    values.update(images.preference)
    if images.verdicts:
        names, matrix = images.attribute_matrix(captions)
        values.update({f"attr_{n}": matrix[:, j] for j, n in enumerate(names)})
    return values


def _intervals(points: dict, replicates: dict[str, np.ndarray], digits: dict[str, int], prompts: np.ndarray,
               values: dict[str, np.ndarray]) -> dict:
    """``<name>_lo`` and ``<name>_hi`` of each metric: a per-image mean's by ``bootstrap.mean_interval`` (the
    t-interval on per-prompt contributions), a set metric's by ``bootstrap.interval``."""
    out = {}
    for name, reps in replicates.items():
        if name in values and points.get(name) is not None:
            found = mean_interval(prompts, values[name], None, reps, bounds=value_range(name))
            lo, hi = found["lo"], found["hi"]
        else:
            lo, hi = interval(points.get(name), reps, bounds=value_range(name))
        d = digits.get(name)
        out[f"{name}_lo"], out[f"{name}_hi"] = (lo, hi) if d is None or lo is None else (round(lo, d), round(hi, d))
    return out


def category_table(images: RowImages, values: dict[str, np.ndarray], bootstrap: int, seed: int) -> list[dict]:
    """CLIP score, the preference scores and attribute accuracy per prompt category, each with its interval (prompts of the
    category resampled)."""
    table = []
    categories = np.array(images.categories)
    for category in sorted(set(images.categories)):
        idx = categories == category
        row = {"category": category, "n_prompts": int(len(np.unique(images.prompts[idx]))), "n_images": int(idx.sum())}
        weights = prompt_weights(images.prompts[idx], bootstrap, seed) if bootstrap else None
        for name, v in values.items():
            v = v[idx]
            if np.isnan(v).all():
                continue
            row[name] = round(float(np.nanmean(v)), 4)
            if weights is not None:
                row.update(_intervals(row, {name: weighted_means(v, weights)}, {name: 4}, images.prompts[idx],
                                      {name: v}))
        table.append(row)
    return table


def _attributes(images: RowImages, captions: dict[int, str]) -> dict:
    tally = AttributeTally()
    for (prompt, _), verdict in zip(images.keys, images.verdicts):
        if verdict is not None:
            tally.add(parse_caption(captions[prompt]), verdict)
    return tally.summary()


def _point_metrics(images: RowImages, stats: dict[str, FeatureStats], references: dict, captions: dict[int, str],
                   kid_subsets: int, kid_subset_size: int, seed: int) -> dict:
    ref = references["fid"]
    cols = {"fid": ref.frechet.distance_to(stats["fid"])}
    cols["kid_mean"], cols["kid_std"] = kernel_inception_distance(ref.stats.features(), stats["fid"].features(),
                                                                  kid_subsets, kid_subset_size, seed=seed)
    cols["clip_score"] = float(images.clip_score.mean()) if images.clip_score is not None else None
    cols.update({k: float(v.mean()) for k, v in images.preference.items()})
    cols["cmmd"] = cmmd(references["cmmd"].stats.features(), stats["cmmd"].features()) if "cmmd" in stats else None
    if "fd_dinov2" in stats:
        dino = references["fd_dinov2"]
        cols["fd_dinov2"] = dino.frechet.distance_to(stats["fd_dinov2"])
        real, fake = dino.stats.features(), images.features["fd_dinov2"]
        if min(len(real), len(fake)) > 5:  # k = 5 nearest neighbours within each set
            cols.update(prdc(real, fake))
    if images.verdicts:
        cols.update(_attributes(images, captions))
    return cols


def row_metrics(parts: list[dict], references: dict, prompts: list[Prompt], *, kid_subsets: int, kid_subset_size: int,
                bootstrap: int, seed: int) -> tuple[dict, RowImages]:
    """The row's metric columns (points, intervals, FD-infinity, ``categories``) and its images, from every
    rank's ``RowScorer.part()``; ``references`` maps feature-set names to ``ReferenceStats``."""
    images = RowImages.gather(parts)
    order = key_order(parts)
    stats = {k: merged_stats([p["stats"][k] for p in parts], kid_subset_size * 10, order) for k in parts[0]["stats"]}
    captions = {p.index: p.text for p in prompts}
    cols = _point_metrics(images, stats, references, captions, kid_subsets, kid_subset_size, seed)
    cols["fid_infinity"] = fd_infinity(references["fid"].frechet, images.features["fid"], seed=seed)
    t = time.perf_counter()
    values = mean_values(images, captions)
    if bootstrap:
        weights = prompt_weights(images.prompts, bootstrap, seed)
        reps = {**set_replicates(images, references, weights), **{k: weighted_means(v, weights) for k, v in values.items()}}
        cols.update(_intervals(cols, reps, {k: 4 for k in values if k.startswith("attr_")}, images.prompts, values))
    cols["categories"] = category_table(images, values, bootstrap, seed)
    cols["bootstrap"] = bootstrap
    cols["seconds_bootstrap"] = round(time.perf_counter() - t, 3)
    return cols, images


def save_features(path: Path, images: RowImages, references: dict) -> Path:
    """``features.pt`` beside the manifest: per-image features (float32) by set name, their (prompt index,
    image index) keys and the reference statistics files they were scored against (read with weights_only)."""
    state = {"keys": torch.tensor(images.keys, dtype=torch.int64).reshape(-1, 2), "features": images.features,
             "references": {k: str(r.path) for k, r in references.items() if k in images.features}}
    return torch_save_whole(state, path)
