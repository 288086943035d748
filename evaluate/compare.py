"""Paired comparison of two checkpoints scored on the same prompts and seeds: is B better than A, by how
much, and how sure.

Both rows' images share their prompts and seeds, so the comparison is paired: each bootstrap replicate
draws one set of prompt weights (``bootstrap.prompt_weights``) and applies it to both checkpoints'
images, and each metric's difference B - A gets the interval and two-sided p-value of ``bootstrap.py``
from those paired replicates (per-image metrics: weighted means; set metrics: the weighted generated
features against the one fixed reference). One rule gives both, so a metric's verdict (``verdict.py``)
reads the same from either; the overall verdict per metric family adjusts the p-values of the family's
metrics together (Holm). Rows scored on different prompts, seeds, numbers of images,
extractors or reference statistics are refused: FID and KID depend on the number of images, and the
pairing needs the same images' counterparts.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from models.checkpoints import entry_ref, is_entry, parse_entry
from models.errors import WorkbenchError
from models.common import write_text_whole
from models.shapes import parse_caption

from .statistics.bootstrap import (MIN_REPLICATES, SET_MIN_PROMPTS, flip, interval, mean_interval, p_floor, p_value,
                                   prompt_contributions, prompt_weights, set_too_few, weighted_means)
from .layout import comparison_file
from .statistics.metrics import FeatureStats
from .names import IMAGE_QUALITY, PREFERENCE_COLUMNS, difference_range, metric
from .reference import ReferenceStats
from .row import FEATURES, VERDICTS, RowImages, mean_values, set_replicates
from .samples import MANIFEST, read_manifest
from .store import ATTRIBUTE_COLUMNS, ResultsStore
from .verdict import family_replicates, overall, sentence, with_verdicts

MUST_MATCH = ("prompts", "n_images", "size", "aspect", "extractor", "n_reference", "dinov2")


def entry_text(who: str) -> str:
    """``BASE + FILE@S`` as an entry's row records it (``models.checkpoints.Entry.ref``: every strength written,
    "@1" where none was given); any other text as it is."""
    if not is_entry(who):
        return who
    return entry_ref(*parse_entry(who))


def rows_of(rows: list[dict], who: str) -> dict[tuple, dict]:
    """The latest scored row per (guidance, sampler) whose model label or checkpoint path (or entry, ``BASE +
    FILE@S``) is ``who``."""
    target = str(Path(who).resolve()) if Path(who).exists() else None
    written = entry_text(who)
    found = {}
    for r in rows:
        if r.get("status") == "ok" and (r["model"] == who or r["checkpoint"] in (who, written)
                                        or (target and str(Path(r["checkpoint"]).resolve()) == target)):
            found[(r["guidance"], r.get("sampler"))] = r
    return found


def load_references(paths: dict[str, str]) -> dict[str, ReferenceStats]:
    """The reference statistics a row was scored against, from their cache files (every kept feature)."""
    refs = {}
    for name, path in paths.items():
        if not Path(path).is_file():
            raise WorkbenchError(f"reference statistics {path} are gone (the cache was cleared): score the rows again")
        state = torch.load(path, map_location="cpu", weights_only=True)
        stats = FeatureStats.from_state_dict(state, kid_max=max(1, len(state["kept"])))
        refs[name] = ReferenceStats(stats, int(state["skipped"]), Path(path).stem.removeprefix("ref-"), True, Path(path))
    return refs


def load_row_images(out: Path, row: dict) -> tuple[RowImages, dict[str, str], dict[int, str], list[dict]]:
    """A scored row's images from its manifest and ``features.pt``: (images, reference files, captions, manifest)."""
    folder = out / row["samples"]
    if not (folder / FEATURES).is_file():
        raise WorkbenchError(f"{folder / FEATURES} not found: {row['model']} was scored before per-image features "
                             f"were kept; score it again to compare it")
    manifest = read_manifest(folder / MANIFEST)
    state = torch.load(folder / FEATURES, map_location="cpu", weights_only=True)
    keys = [tuple(k) for k in state["keys"].tolist()]
    if keys != [(m["prompt_index"], m["image_index"]) for m in manifest]:
        raise WorkbenchError(f"{folder}: {FEATURES} and {MANIFEST} list different images")
    clip = np.array([m["clip_score"] for m in manifest]) if manifest and "clip_score" in manifest[0] else None
    verdicts = ([None if m.get("attr_all") is None else {k: m.get(f"attr_{k}") for k in VERDICTS} for m in manifest]
                if manifest and "attr_all" in manifest[0] else [])
    check_verdict_captions(folder / MANIFEST, manifest, verdicts)
    preference = {k: np.array([m[k] for m in manifest]) for k in PREFERENCE_COLUMNS if manifest and k in manifest[0]}
    images = RowImages(keys, [m["category"] for m in manifest], clip, verdicts, state["features"], preference)
    return images, state["references"], {m["prompt_index"]: m["prompt"] for m in manifest}, manifest


def check_verdict_captions(path: Path, manifest: list[dict], verdicts: list[dict | None]) -> None:
    """Attribute verdicts are tallied by the kind of caption they judge: an image with verdicts whose prompt the
    shapes grammar cannot read (a manifest edited since scoring) is a one-line error naming the manifest."""
    for line, verdict in zip(manifest, verdicts):
        if verdict is not None and parse_caption(line["prompt"]) is None:
            raise WorkbenchError(f"{path}: prompt {line['prompt_index']} ({line['prompt'][:80]!r}) is not a shapes "
                                 f"caption, yet its image {line['image_index']} has attribute verdicts (attr_*): the "
                                 f"manifest was changed after scoring; score the checkpoint again")


def _check_rows(a: dict, b: dict) -> None:
    for key in MUST_MATCH:
        if a.get(key) != b.get(key):
            extra = (" (FID and KID depend on the number of images: score both on the same prompts, or compare "
                     "fid_infinity)") if key == "n_images" else ""
            raise WorkbenchError(f"cannot compare {a['model']} and {b['model']}: {key} differs ({a.get(key)} vs "
                                 f"{b.get(key)}){extra}")


def _check_images(a: dict, b: dict, ma: list[dict], mb: list[dict], refs_a: dict, refs_b: dict) -> None:
    same = [(x["prompt_index"], x["image_index"], x["prompt"], x["seed"]) for x in ma] == \
           [(y["prompt_index"], y["image_index"], y["prompt"], y["seed"]) for y in mb]
    if not same:
        raise WorkbenchError(f"cannot compare {a['model']} and {b['model']}: their images do not share prompts and seeds "
                             f"(score both with the same --prompts, --n-per-prompt and --seed)")
    if refs_a != refs_b:
        raise WorkbenchError(f"cannot compare {a['model']} and {b['model']}: they were scored against different "
                             f"reference statistics")


def _metrics(a: dict, b: dict) -> list[str]:
    """The metrics both rows have; a preference score only where both were scored by the same weights."""
    names = ["fid", "kid_mean", "clip_score", "cmmd", "fd_dinov2", *ATTRIBUTE_COLUMNS]
    models_a, models_b = a.get("preference_models", {}), b.get("preference_models", {})
    names += [k for k in PREFERENCE_COLUMNS if models_a.get(k) is not None and models_a.get(k) == models_b.get(k)]
    return [n for n in names if a.get(n) is not None and b.get(n) is not None]


def compare_rows(out: str | Path, a: dict, b: dict, replicates: int = 200, seed: int = 0,
                 set_flips: bool = False) -> dict:
    """Each metric's difference B - A with its paired bootstrap interval and p-value, the verdicts in words,
    and the overall verdict per metric family (``verdict.overall``). Each family gets ``replicates``, or more
    where it has several metrics (``verdict.family_replicates``); every family reads the first rows of one draw."""
    check_replicates(replicates)
    _check_rows(a, b)
    out = Path(out)
    ia, refs_a, captions, ma = load_row_images(out, a)
    ib, refs_b, _, mb = load_row_images(out, b)
    _check_images(a, b, ma, mb, refs_a, refs_b)
    references = load_references(refs_a)
    names = _metrics(a, b)
    sizes = Counter(metric(n).family for n in names)
    counts = {family: family_replicates(replicates, n) for family, n in sizes.items()}
    weights = prompt_weights(ia.prompts, max(counts.values()), seed)  # one draw for both checkpoints: paired
    set_weights = weights[:counts.get(IMAGE_QUALITY, replicates)]  # the costly ones: a Gram matrix per replicate
    reps, values = [], [mean_values(images, captions) for images in (ia, ib)]
    for images, means in zip((ia, ib), values):
        reps.append({**set_replicates(images, references, set_weights),
                     **{k: weighted_means(v, weights) for k, v in means.items()}})
    metrics = with_verdicts([metric_difference(name, a[name], b[name], (reps[1][name] - reps[0][name])[
        :counts[metric(name).family]], per_image(name, ia.prompts, values), len(np.unique(ia.prompts)))
        for name in names])
    metrics = with_flips(metrics, ia.prompts, values, lambda w, name: set_differences(ia, ib, references, w, name),
                         counts.get(IMAGE_QUALITY, replicates), seed, set_flips)
    return {"a": a["model"], "b": b["model"], "guidance": a["guidance"], **scored_settings(a, b),
            "n_images": a["n_images"], "n_prompts": int(len(np.unique(ia.prompts))), "bootstrap": replicates,
            "replicates": counts, "seed": seed, "metrics": metrics, "overall": overall(metrics)}


def per_image(name: str, prompts: np.ndarray, values: list[dict]) -> tuple | None:
    """(prompt ids, B's values, A's values) of a per-image mean metric; None for a set metric."""
    return (prompts, values[1][name], values[0][name]) if name in values[0] and name in values[1] else None


def metric_difference(name: str, a: float, b: float, replicates: np.ndarray, images: tuple | None = None,
                      n_prompts: int | None = None) -> dict:
    """One metric's B - A with its interval and p, and how many replicates are ``defined`` (a replicate that drew
    no image the metric judges is NaN: it does not count). A per-image mean (``images``: prompt ids, B's values,
    A's values) takes ``bootstrap.mean_interval`` (the t-interval on per-prompt contributions); a set metric,
    the paired replicates' interval, and below ``SET_MIN_PROMPTS`` prompts none (``unmeasured``)."""
    diff = float(b - a)
    counted = {"metric": name, "a": a, "b": b, "difference": diff, "replicates": len(replicates),
               "defined": int(np.isfinite(replicates).sum())}
    if images is not None:
        return {**counted, **mean_interval(*images, replicates, bounds=difference_range(name))}
    if n_prompts is not None and n_prompts < SET_MIN_PROMPTS:
        return {**counted, "lo": None, "hi": None, "p": None, "rule": "bootstrap", "too_few": set_too_few(n_prompts)}
    lo, hi = interval(diff, replicates, bounds=difference_range(name))
    return {**counted, "lo": lo, "hi": hi, "p": p_value(diff, replicates), "rule": "bootstrap"}


def with_flips(metrics: list[dict], prompts: np.ndarray, values: list[dict], set_difference, replicates: int,
               seed: int, set_flips: bool = False) -> list[dict]:
    """Each metric's ``flip``: for a verdict that is not "cannot tell", the fewest prompts whose removal makes its
    interval reach 0 (``count``) and which (``prompts``, their indices); ``exact`` False where the count is an upper
    bound. A per-image mean: ``bootstrap.flip`` on the per-prompt contributions, exact where every prompt has as
    many images with a value (otherwise by the contributions, ``exact`` False); a set metric: ``set_flip`` where
    ``set_flips`` asks (``count`` None otherwise: its search costs some ten bootstraps of the metric)."""
    out = []
    for m in metrics:
        if m["better"] is None:
            out.append({**m, "flip": None})
            continue
        images = per_image(m["metric"], prompts, values)
        if images is None:
            found = (set_flip(m, prompts, set_difference, replicates, seed) if set_flips
                     else {"count": None, "prompts": [], "exact": False})
        else:
            ids, contributions = prompt_contributions(*images)
            found = {**flip(ids, contributions, m["lo"] > 0), "exact": _same_counts(*images)}
        m = {**m, "flip": found}
        out.append({**m, "sentence": sentence(m, m["holm_over"])})  # the line names the count beside the interval
    return out


def _same_counts(prompts: np.ndarray, *sides: np.ndarray) -> bool:
    """Whether every prompt has the same number of images with a value, on each side."""
    counts = [np.unique(np.asarray(prompts)[~np.isnan(v)], return_counts=True)[1] for v in sides]
    return all(len(c) and c.min() == c.max() for c in counts)


def set_flip(m: dict, prompts: np.ndarray, set_difference, replicates: int, seed: int) -> dict:
    """A greedy upper bound for a set metric: prompts ordered by how far leaving each one out moves B - A towards 0,
    then the fewest of that order whose removal makes the recomputed interval (the bootstrap over the prompts left,
    ``replicates`` of them) reach 0, found by bisection. Fewer than ``SET_MIN_PROMPTS`` prompts left have no interval,
    so that many removals always flip it. ``set_difference(weights, name)`` gives the metric's B - A per weight row.

    Each bisection step is one more bootstrap of the metric: at 0.18 s a FID replicate (1,000 images, 2,048-d, 2 CPU
    cores; docs/evaluate.md) about 8 steps of 200 paired replicates and 250 left-out sets add some 10 minutes per set
    metric with a verdict, estimated, not measured end to end."""
    ids = np.unique(prompts)
    sign = 1.0 if m["lo"] > 0 else -1.0
    left_out = (prompts[None, :] != ids[:, None]).astype(np.float64)  # (P, N): each prompt left out once
    order = ids[np.argsort(sign * set_difference(left_out, m["metric"]), kind="stable")]
    reached, not_reached = max(1, len(ids) - SET_MIN_PROMPTS + 1), 0
    while reached - not_reached > 1:
        k = (reached + not_reached) // 2
        keep = ~np.isin(prompts, order[:k])
        weights = np.zeros((replicates, len(prompts)))
        weights[:, keep] = prompt_weights(prompts[keep], replicates, seed)
        point = float(set_difference(keep[None, :].astype(np.float64), m["metric"])[0])
        lo, hi = interval(point, set_difference(weights, m["metric"]), bounds=difference_range(m["metric"]))
        if sign * (lo if sign > 0 else hi) <= 0:
            reached = k
        else:
            not_reached = k
    return {"count": reached, "prompts": [int(p) for p in order[:reached]], "exact": False}


def set_differences(a: RowImages, b: RowImages, references: dict, weights: np.ndarray, name: str) -> np.ndarray:
    """Set metric ``name``'s B - A for each row of image ``weights``."""
    ra, rb = set_replicates(a, references, weights, (name,)), set_replicates(b, references, weights, (name,))
    return rb[name] - ra[name]


SCORED = ("sampler", "steps", "weights", "checkpoint_hash")  # what each side's images were made with, as rows record it


def scored_settings(a: dict, b: dict) -> dict:
    """``sampler_a``, ``steps_a``, ``weights_a``, ``checkpoint_hash_a`` and B's: what each compared row scored (None
    where an older row does not record it)."""
    return {f"{key}_{side}": row.get(key) for key in SCORED for side, row in (("a", a), ("b", b))}


def write_comparison(out: str | Path, result: dict) -> Path:
    """``OUT/compare/<A>-vs-<B>-cfg<g>.json``; the report lists every file there."""
    path = comparison_file(out, result["a"], result["b"], result["guidance"])
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_whole(path, json.dumps(result, indent=1))


def check_replicates(replicates: int) -> None:
    if replicates < MIN_REPLICATES:
        raise WorkbenchError(f"a comparison needs --bootstrap of at least {MIN_REPLICATES} replicates (a 95% interval "
                             f"needs one in each 2.5% tail; 200 resolve p-values down to {p_floor(200):.2g})")


def compare_store(out: str | Path, a: str, b: str, replicates: int = 200, seed: int = 0,
                  set_flips: bool = False) -> list[dict]:
    """Compare A and B at every (guidance, sampler) both were scored at in ``OUT``'s store; ``set_flips``: search
    the set metrics' flip counts too."""
    check_replicates(replicates)
    rows = ResultsStore(out).rows()
    ra, rb = rows_of(rows, a), rows_of(rows, b)
    for who, found in ((a, ra), (b, rb)):
        if not found:
            raise WorkbenchError(f"{who} has no scored rows in {Path(out) / 'results.jsonl'}")
    common = sorted(set(ra) & set(rb), key=lambda k: (k[0], str(k[1])))
    if not common:
        raise WorkbenchError(f"{a} and {b} share no guidance scale and sampler in {Path(out) / 'results.jsonl'}")
    return [compare_rows(out, ra[k], rb[k], replicates, seed, set_flips) for k in common]
