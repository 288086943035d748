"""Humans beside metrics: per model, raters' scores next to evaluate's; per metric, how often it orders as raters do.

Per model and question: the Bradley-Terry score (bootstrap by prompt) and the win rate, the share of the
model's decisive main votes it won, with the report's headline interval (Wilson's on effective votes) and its p,
next to the metrics of its evaluate row (`human_eval.scores`), each with the row's 95% interval.

Agreement of a metric with raters, two ways, each with a 95% bootstrap interval that resamples prompts
(all votes and images of one prompt together):

* *model pairs*: the share of model pairs the metric orders as raters do (the model raters prefer in more
  than half of the pair's decisive votes is the one with the better metric); a tie on either side counts
  a half. Each replicate recomputes the raters' order from the resampled votes and, for a per-image metric
  (CLIP score, attribute accuracy, PickScore, HPSv2.1, ImageReward, the aesthetic score, from the study's
  images), the metric's order from the resampled images;
  a set metric (FID, CMMD, ...) keeps its row's value.
* *image pairs* (per-image metrics): the share of decisive votes whose preferred image has the higher
  metric (votes on two images with equal values are left out).

Per category (DrawBench / PartiPrompts): each model's win rate with its intervals, prompts of the category
resampled.
"""
from __future__ import annotations

import itertools
import math
import time
from collections import defaultdict

import numpy as np

from .analysis import NO_CATEGORY, bradley_terry, json_ready, tie_results
from .scores import LABELS, METRICS, ROW_KEYS, ScoreRows, join_scores, metric_values
from .statistics.stats import (bootstrap_rate, effective_votes, is_decisive, percentile_interval, ratio, vote_flip,
                               wilson_interval)
from .study import Study

# A prompt bootstrap needs prompts to resample: in a simulation (6 votes a prompt, per-prompt rates spread by
# 0.1) its 95% interval covered the true rate in 74% of draws with 2 prompts and 87-90% with 3-10 (Wilson:
# 93-97%); one prompt gives zero width. Under MIN_PROMPTS a win rate has no bootstrap-by-prompt interval (its
# headline interval, Wilson's on effective votes, keeps Wilson's coverage at any number of prompts).
MIN_PROMPTS = 5
# row column -> the study image's metric (the preference scores keep their names)
PER_IMAGE = {"clip_score": "clip_score", "attr_all_all": "attr_all",
             **{k: k for k in ("pickscore", "hps", "imagereward", "aesthetic")}}


def win_rate(votes: list[dict], model: str, study: Study, n_boot: int, rng: np.random.Generator) -> dict:
    """The share of `model`'s decisive votes it won, with Wilson's interval, the bootstrap-by-prompt interval (with
    MIN_PROMPTS prompts or more), and Wilson's on the effective number of votes with its score test's p: the
    report's headline interval, from the same function (``stats.effective_votes``: prompts and raters clustered, its
    own fixed draws), so a model of a two-model study reads here as in the report and on the admin page."""
    mine = [v for v in votes if model in study.models_of(study.by_id[v["pair_id"]])]
    won = np.array([is_decisive(v["choice"]) and study.models_of(study.by_id[v["pair_id"]])["ab".index(v["choice"])] == model
                    for v in mine], dtype=float)
    decisive = np.array([is_decisive(v["choice"]) for v in mine], dtype=float)
    prompts = np.array([study.by_id[v["pair_id"]].prompt for v in mine], dtype=np.int64)
    raters = np.array([v["rater_id"] for v in mine])
    wins, n = int(won.sum()), int(decisive.sum())
    enough = len(np.unique(prompts[decisive > 0])) >= MIN_PROMPTS
    effective = effective_votes(won, decisive, prompts, raters) if mine else {
        "design_effect": math.nan, "clustered_wilson": (math.nan, math.nan), "score_test_p": 1.0}
    leading = [v for v, w, d in zip(mine, won, decisive) if d and bool(w) == (2 * wins > n)]  # the side ahead
    flip = vote_flip(leading, [study.by_id[v["pair_id"]].prompt for v in leading], wins, n,
                     effective["design_effect"]) if n else None
    return {"votes": len(mine), "decisive": n, "wins": wins, "win_rate": wins / n if n else math.nan, "flip": flip,
            "wilson": wilson_interval(wins, n), **{k: effective[k] for k in ("design_effect", "clustered_wilson",
                                                                              "score_test_p")},
            "bootstrap_prompt": percentile_interval(bootstrap_rate(won, decisive, prompts, n_boot, rng)) if enough
            else (math.nan, math.nan)}


class PromptTable:
    """Main votes and study images as per-prompt sums, so a prompt bootstrap is a matrix product.

    Prompts are the study's prompts that appear in a main pair; ``weights`` (B, P) counts how often each
    prompt is drawn in each replicate.
    """

    def __init__(self, study: Study, votes: list[dict]):
        self.study = study
        main = [p for p in study.pairs if p.kind == "main"]
        self.prompts = sorted({p.prompt for p in main})
        self.row = {p: i for i, p in enumerate(self.prompts)}
        self.model_pairs = list(itertools.combinations(study.models, 2))
        col = {pair: k for k, pair in enumerate(self.model_pairs)}
        self.wins_a = np.zeros((len(self.prompts), len(self.model_pairs)))  # (P, K) decisive votes won by model a
        self.decisive = np.zeros_like(self.wins_a)  # (P, K)
        for v in votes:
            pair = study.by_id[v["pair_id"]]
            if is_decisive(v["choice"]):
                k = col[study.models_of(pair)]
                self.decisive[self.row[pair.prompt], k] += 1
                self.wins_a[self.row[pair.prompt], k] += v["choice"] == "a"
        self.images = {}  # (model, prompt, image index) -> metrics, each image once however many pairs show it
        for p in main:
            for token in (p.a, p.b):
                image = study.images[token]
                self.images[(image.model, p.prompt, p.image_index)] = image.metrics

    def image_sums(self, metric: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(P, M) sums and counts of a per-image metric by prompt and model; None unless every model has it."""
        index = {m: i for i, m in enumerate(self.study.models)}
        sums = np.zeros((len(self.prompts), len(index)))
        counts = np.zeros_like(sums)
        for (model, prompt, _), metrics in self.images.items():
            if metric in metrics:
                sums[self.row[prompt], index[model]] += metrics[metric]
                counts[self.row[prompt], index[model]] += 1
        return (sums, counts) if counts.sum(0).all() else None

    def draws(self, n_boot: int, rng: np.random.Generator) -> np.ndarray:
        p = len(self.prompts)
        return rng.multinomial(p, np.full(p, 1 / p), size=n_boot).astype(float)  # (B, P)


def pair_agreement(rate_a: np.ndarray, values: np.ndarray, pairs: np.ndarray, higher_better: bool) -> np.ndarray:
    """Per model pair, whether a metric orders it as raters do: 1, 0, a half for a tie on either side.

    rate_a: (..., K) raters' preference for model a of each pair (nan: no decisive vote); values: (..., M)
    the metric per model (nan: none); pairs: (K, 2) model indices. Returns (..., K), nan where either is missing.
    """
    human = np.sign(rate_a - 0.5)
    metric = np.sign(values[..., pairs[:, 0]] - values[..., pairs[:, 1]]) * (1 if higher_better else -1)
    agree = np.where((human == 0) | (metric == 0), 0.5, (human == metric).astype(float))
    return np.where(np.isfinite(human) & np.isfinite(metric), agree, np.nan)


def concordance(agree: np.ndarray) -> np.ndarray:
    """The share of usable model pairs ordered as raters do: (..., K) -> (...,), nan without one."""
    usable = np.isfinite(agree)
    with np.errstate(invalid="ignore"):
        return np.where(usable, agree, 0).sum(-1) / usable.sum(-1)


def _metric_per_model(name: str, table: PromptTable, rows: dict[str, dict | None], draws: np.ndarray):
    """The metric per model, point (M,) and replicates (B, M), and where it comes from; None if under two models."""
    per_image = table.image_sums(PER_IMAGE[name]) if name in PER_IMAGE else None
    if per_image is not None:
        sums, counts = per_image
        return sums.sum(0) / counts.sum(0), ratio(draws @ sums, draws @ counts), "study images"
    point = np.array([metric_values(rows[m]).get(name, {}).get("value", math.nan) if rows.get(m) else math.nan
                      for m in table.study.models])
    if np.isfinite(point).sum() < 2:
        return None
    return point, np.broadcast_to(point, (len(draws), len(point))), "evaluate rows"


def model_pair_agreement(table: PromptTable, rows: dict[str, dict | None], n_boot: int,
                         rng: np.random.Generator) -> list[dict]:
    """Per metric: the share of model pairs it orders as raters do, with a prompt-bootstrap interval."""
    if not table.model_pairs:
        return []
    draws = table.draws(n_boot, rng)
    rate = ratio(table.wins_a.sum(0), table.decisive.sum(0))  # (K,)
    rate_reps = ratio(draws @ table.wins_a, draws @ table.decisive)  # (B, K)
    index = {m: i for i, m in enumerate(table.study.models)}
    pairs = np.array([(index[a], index[b]) for a, b in table.model_pairs])
    out = []
    for name, higher in METRICS.items():
        found = _metric_per_model(name, table, rows, draws)
        if found is None:
            continue
        point, reps, source = found
        agree = pair_agreement(rate, point, pairs, higher)  # (K,)
        detail = [{"model_a": a, "model_b": b, "human_rate_a": rate[k], "metric_a": point[index[a]],
                   "metric_b": point[index[b]], "agrees": agree[k]} for k, (a, b) in enumerate(table.model_pairs)]
        out.append({"metric": name, "label": LABELS[name], "source": source, "higher_is_better": higher,
                    "model_pairs": int(np.isfinite(agree).sum()), "agreement": float(concordance(agree)),
                    "interval": percentile_interval(concordance(pair_agreement(rate_reps, reps, pairs, higher))),
                    "pairs": detail})
    return out


def image_pair_agreement(votes: list[dict], study: Study, n_boot: int, rng: np.random.Generator) -> list[dict]:
    """Per per-image metric: how often the preferred image is the one with the higher value, prompt-bootstrapped."""
    out = []
    for row_name, name in PER_IMAGE.items():
        agree, prompts, ties = [], [], 0
        for v in votes:
            pair = study.by_id[v["pair_id"]]
            a, b = study.images[pair.a].metrics.get(name), study.images[pair.b].metrics.get(name)
            if not is_decisive(v["choice"]) or a is None or b is None:
                continue
            if a == b:
                ties += 1
                continue
            agree.append((a > b) == (v["choice"] == "a"))
            prompts.append(pair.prompt)
        if not agree:
            continue
        hits = np.array(agree, dtype=float)
        reps = bootstrap_rate(hits, np.ones_like(hits), np.array(prompts), n_boot, rng)
        out.append({"metric": row_name, "label": LABELS[row_name], "image_metric": name, "votes": len(hits),
                    "equal_values": ties, "agreement": float(hits.mean()), "interval": percentile_interval(reps)})
    return out


def category_win_rates(votes: list[dict], study: Study, n_boot: int, rng: np.random.Generator) -> list[dict]:
    """Each model's win rate per prompt category, with Wilson and bootstrap-by-prompt intervals."""
    by_category: dict[str, list[dict]] = defaultdict(list)
    for v in votes:
        by_category[study.prompts[study.by_id[v["pair_id"]].prompt].category or NO_CATEGORY].append(v)
    return [{"category": c, "model": m, **win_rate(vs, m, study, n_boot, rng)}
            for c, vs in sorted(by_category.items()) for m in study.models]


def model_table(votes: list[dict], study: Study, rows: dict[str, dict | None], n_boot: int,
                rng: np.random.Generator) -> list[dict]:
    """Per model: its evaluate row (settings and metrics with intervals) and, per question, its human scores."""
    human: dict[str, dict] = {m: {} for m in study.models}
    for q in study.question_ids:
        mine = [v for v in votes if v["question"] == q]
        bt = {r["model"]: r for r in bradley_terry(mine, study, n_boot, rng)}
        for m in study.models:
            human[m][q] = {**win_rate(mine, m, study, n_boot, rng), "bt_score": bt.get(m, {}).get("score", math.nan),
                           "bt_interval": bt.get(m, {}).get("interval", (math.nan, math.nan)),
                           "bt_flip": bt.get(m, {}).get("flip")}
    return [{"model": m, "checkpoint_hash": study.model_info.get(m, {}).get("checkpoint_hash", ""),
             "study_settings": {k: study.model_info.get(m, {}).get(k) for k in ("guidance", "sampler")},
             "row": {k: rows[m].get(k) for k in ROW_KEYS} if rows.get(m) else None,
             "metrics": metric_values(rows[m]) if rows.get(m) else {}, "human": human[m]} for m in study.models]


def humans_beside_metrics(study: Study, votes: list[dict], scores: ScoreRows, *, excluded: set[str] = frozenset(),
                          n_boot: int = 2000, seed: int = 0) -> dict:
    """The joined report of one study's votes and evaluate's rows of its models (see the module doc); JSON-ready."""
    rng = np.random.default_rng(seed)
    main = [v for v in votes if v["pair_id"] in study.by_id and study.by_id[v["pair_id"]].kind == "main"
            and v["rater_id"] not in excluded]
    rows, notes = join_scores(study, scores)
    per_question = {q: [v for v in main if v["question"] == q] for q in study.question_ids}
    return json_ready({
        "study": study.id, "study_name": study.folder.resolve().name,  # the name people know it by
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "results": scores.sources,
        "questions": {q.id: q.text for q in study.questions}, "models": study.models,
        "settings": {"bootstrap": n_boot, "seed": seed, "excluded_raters": sorted(excluded)},
        "counts": {"main_votes": len(main), "decisive": sum(is_decisive(v["choice"]) for v in main)},
        "notes": notes, "table": model_table(main, study, rows, n_boot, rng),
        "agreement": {q: {"model_pairs": model_pair_agreement(PromptTable(study, vs), rows, n_boot, rng),
                          "image_pairs": image_pair_agreement(vs, study, n_boot, rng)} for q, vs in per_question.items()},
        "categories": {q: category_win_rates(vs, study, n_boot, rng) for q, vs in per_question.items()},
        **tie_results(main, study),
    })
