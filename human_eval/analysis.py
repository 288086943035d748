"""From votes to results: every statistic the report and the dashboard show, as one JSON-ready dict.

Only main pairs count towards preference rates, Bradley-Terry scores and agreement; gold pairs measure
raters' attention and repeated pairs their self-consistency. Raters who fail the gold check can be
left out of everything else (`exclude_failing=True`). The stopping rule and the votes it is predicted
to take come from `human_eval.statistics.allocation`; strengths with and without image covariates from
`human_eval.statistics.style_control`.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from statistics import median

import numpy as np
from tqdm import tqdm

from .statistics.agreement import krippendorff_alpha_nominal
from .statistics.allocation import stopping_point, votes_to_settle
from .statistics.bradley_terry import (bootstrap_bradley_terry, bradley_terry_flip, exposure_weights, fit_bradley_terry,
                                      win_matrices)
from .statistics.resampling import DESIGN_EFFECT_REPLICATES, DESIGN_EFFECT_SEED, REPORT_BOOTSTRAP
from .statistics.stats import (Z95, bootstrap_rate, decisive_votes_needed, effective_votes, is_decisive, percentile_interval,
                               sign_test, two_way_interval, vote_flip, wilson_interval)
from .study import Study
from .statistics.style_control import bradley_terry_with_covariates, covariate_differences, interval

NO_CATEGORY = "(none)"


def json_ready(value):
    """nan -> None, numpy scalars -> Python, recursively (JSON has no nan)."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def preference(votes: list[dict]) -> dict:
    """Counts, the decisive preference rate of image a with its Wilson interval, the tie rate, the sign test."""
    wins_a = sum(v["choice"] == "a" for v in votes)
    wins_b = sum(v["choice"] == "b" for v in votes)
    ties = len(votes) - wins_a - wins_b
    decisive = wins_a + wins_b
    return {"votes": len(votes), "wins_a": wins_a, "wins_b": wins_b, "ties": ties, "decisive": decisive,
            "rate_a": wins_a / decisive if decisive else math.nan, "wilson": wilson_interval(wins_a, decisive),
            "tie_rate": ties / len(votes) if votes else math.nan, "tie_wilson": wilson_interval(ties, len(votes)),
            "sign_test_p": sign_test(wins_a, wins_b)}


def clustered(votes: list[dict], study: Study, n_boot: int, rng: np.random.Generator) -> dict:
    """Bootstrap intervals of the decisive rate, by prompt, by rater and both (``n_boot`` draws of ``rng``); the
    design effect of that clustering, Wilson's interval on the effective number of votes and its score test, from
    ``stats.effective_votes`` (its own fixed draws: the same on every surface)."""
    if not votes:
        return {"bootstrap_prompt": (math.nan, math.nan), "bootstrap_rater": (math.nan, math.nan),
                "two_way": (math.nan, math.nan), "design_effect": math.nan, "clustered_wilson": (math.nan, math.nan),
                "score_test_p": 1.0}
    wins = np.array([v["choice"] == "a" for v in votes], dtype=float)
    decisive = np.array([is_decisive(v["choice"]) for v in votes], dtype=float)
    prompts = np.array([study.by_id[v["pair_id"]].prompt for v in votes])
    raters = np.array([v["rater_id"] for v in votes])
    effective = effective_votes(wins, decisive, prompts, raters)
    return {"bootstrap_prompt": percentile_interval(bootstrap_rate(wins, decisive, prompts, n_boot, rng)),
            "bootstrap_rater": percentile_interval(bootstrap_rate(wins, decisive, raters, n_boot, rng)),
            "two_way": two_way_interval(wins, decisive, prompts, raters, variance=effective["variance"]),
            **{k: effective[k] for k in ("design_effect", "clustered_wilson", "score_test_p")}}


def sample_size_plan(result: dict, target_width: float) -> dict:
    """Decisive votes a `target_width` interval needs, worst case and at the observed rate, and all votes with the
    observed tie rate and the clustering's design effect."""
    rate, ties = result["rate_a"], result["tie_rate"]
    deff = result.get("design_effect", math.nan)
    worst = decisive_votes_needed(target_width, 0.5)
    observed = decisive_votes_needed(target_width, rate) if not math.isnan(rate) else worst
    total = observed / (1 - ties) if not math.isnan(ties) and ties < 1 else math.nan
    return {"target_width": target_width, "decisive_needed_worst_case": worst, "decisive_needed_at_observed": observed,
            "design_effect": deff, "votes_needed": math.ceil(total * max(1.0, deff if not math.isnan(deff) else 1.0))
            if not math.isnan(total) else None}


def gold_checks(votes: list[dict], study: Study, threshold: float) -> dict:
    per: dict[str, list[bool]] = defaultdict(list)
    for v in votes:
        pair = study.by_id[v["pair_id"]]
        if pair.kind == "gold":
            per[v["rater_id"]].append(v["choice"] == pair.gold)
    raters = [{"rater": r, "votes": len(ok), "passed": sum(ok), "pass_rate": sum(ok) / len(ok),
               "failing": sum(ok) / len(ok) < threshold} for r, ok in sorted(per.items())]
    total, passed = sum(r["votes"] for r in raters), sum(r["passed"] for r in raters)
    return {"threshold": threshold, "votes": total, "passed": passed, "pass_rate": passed / total if total else math.nan,
            "raters": raters, "failing_raters": [r["rater"] for r in raters if r["failing"]]}


def self_consistency(votes: list[dict], study: Study) -> dict:
    choice = {(v["rater_id"], v["pair_id"], v["question"]): v["choice"] for v in votes}
    per: dict[str, list[bool]] = defaultdict(list)
    for (rater, pair_id, question), c in choice.items():
        pair = study.by_id[pair_id]
        first = choice.get((rater, pair.repeat_of, question)) if pair.kind == "repeat" else None
        if first is not None:
            per[rater].append(first == c)
    raters = [{"rater": r, "repeats": len(ok), "agreed": sum(ok), "rate": sum(ok) / len(ok)} for r, ok in sorted(per.items())]
    total, agreed = sum(r["repeats"] for r in raters), sum(r["agreed"] for r in raters)
    return {"repeats": total, "agreed": agreed, "rate": agreed / total if total else math.nan, "raters": raters}


def _holding(point: float, interval: tuple[float, float]) -> tuple[float, float]:
    """The interval widened to hold its point: the replicates are fitted to a looser tolerance than the point
    (1e-8 against 1e-10), so where every replicate sees the same wins (unanimous votes) the point fell just
    outside a zero-width interval."""
    lo, hi = interval
    return (lo, hi) if math.isnan(lo) else (min(lo, point), max(hi, point))


def bradley_terry(votes: list[dict], study: Study, n_boot: int, rng: np.random.Generator) -> list[dict]:
    index = {m: i for i, m in enumerate(study.models)}
    decisive = [v for v in votes if is_decisive(v["choice"])]
    if not decisive:
        return []
    a = np.array([index[study.images[study.by_id[v["pair_id"]].a].model] for v in decisive])
    b = np.array([index[study.images[study.by_id[v["pair_id"]].b].model] for v in decisive])
    a_won = np.array([v["choice"] == "a" for v in decisive])
    prompt_ids, prompts = np.unique([study.by_id[v["pair_id"]].prompt for v in decisive], return_inverse=True)
    counted = win_matrices(a, b, a_won, prompts, len(study.models))  # (P, K, K)
    per_prompt = counted * exposure_weights(counted)  # each pair weighs as under equal exposure
    scores = fit_bradley_terry(per_prompt.sum(0))
    replicates = bootstrap_bradley_terry(per_prompt, n_boot, rng)
    order = np.argsort(-scores)
    rank = {int(i): r + 1 for r, i in enumerate(order)}
    intervals = [_holding(scores[i], percentile_interval(replicates[:, i])) for i in range(len(study.models))]
    return [{"model": m, "score": scores[i], "interval": intervals[i], "rank": rank[i],
             "wins": int(counted.sum(0)[i].sum()), "losses": int(counted.sum(0)[:, i].sum()),
             "flip": _named_flip(bradley_terry_flip(counted, i, n_boot), prompt_ids, study.models)
             if intervals[i][0] > 0 or intervals[i][1] < 0 else None}
            for i, m in enumerate(study.models)]


def _named_flip(found: dict, prompt_ids: np.ndarray, models: list[str]) -> dict:
    """``bradley_terry_flip``'s votes named by prompt and opponent model."""
    return {**found, "votes": [{"prompt": json_ready(prompt_ids[g].item()), "opponent": models[j]}
                               for g, j in found["votes"]]}


def stopping(main: list[dict], study: Study, comparisons: list[dict], target_width: float) -> dict:
    """When the stopping rule first held (replaying main votes in order), what is open, and the votes predicted."""
    deff = {(c["question"], c["model_a"], c["model_b"]): c["plan"]["design_effect"] for c in comparisons
            if not math.isnan(c["plan"]["design_effect"])}
    model_pair_of = {p.id: study.models_of(p) for p in study.pairs if p.kind == "main"}
    result = stopping_point(main, model_pair_of, study.question_ids, target_width, deff)
    predicted = votes_to_settle([{**c, "design_effect": deff.get((c["question"], c["model_a"], c["model_b"]))}
                                 for c in comparisons], target_width)
    return {"allocation": study.allocation, **result, "predicted_votes": predicted}


def style_control(votes: list[dict], study: Study, names: tuple[str, ...]) -> dict:
    """Model scores with and without the image covariates `names`, from one question's decisive main votes."""
    decisive = [v for v in votes if is_decisive(v["choice"])]
    pairs = [study.by_id[v["pair_id"]] for v in decisive]
    if not decisive or any(not study.images[t].covariates for p in pairs for t in (p.a, p.b)):
        return {}
    index = {m: i for i, m in enumerate(study.models)}
    a = np.array([index[study.images[p.a].model] for p in pairs])
    b = np.array([index[study.images[p.b].model] for p in pairs])
    diffs, kept = covariate_differences([study.images[p.a].covariates for p in pairs],
                                        [study.images[p.b].covariates for p in pairs], names)
    fit = bradley_terry_with_covariates(a, b, np.array([v["choice"] == "a" for v in decisive]), diffs, len(study.models))
    plain, controlled = fit["plain"], fit["controlled"]
    return {"votes": len(decisive), "covariates": kept, "constant": [n for n in names if n not in kept],
            "models": [{"model": m, "score": plain["scores"][i], "interval": interval(plain["scores"][i], plain["se"][i]),
                        "score_controlled": controlled["scores"][i],
                        "interval_controlled": interval(controlled["scores"][i], controlled["se"][i])}
                       for i, m in enumerate(study.models)],
            "coefficients": [{"covariate": n, "coef": controlled["coef"][j],
                              "interval": interval(controlled["coef"][j], controlled["coef_se"][j])}
                             for j, n in enumerate(kept)]}


def rater_table(votes: list[dict], gold: dict, consistency: dict, excluded: set[str], labels: dict[str, str]) -> list[dict]:
    """One row per rater: label, votes, median response time, gold pass rate, self-consistency, excluded."""
    gold_rate = {r["rater"]: r["pass_rate"] for r in gold["raters"]}
    consistent = {r["rater"]: r["rate"] for r in consistency["raters"]}
    per_rater: dict[str, list[dict]] = defaultdict(list)
    for v in votes:
        per_rater[v["rater_id"]].append(v)
    return [{"rater": r, "label": labels.get(r, r), "votes": len(vs),
             "median_response_ms": median([v["client_ms"] for v in vs if v.get("client_ms") is not None] or [math.nan]),
             "gold_pass_rate": gold_rate.get(r, math.nan), "self_consistency": consistent.get(r, math.nan),
             "excluded": r in excluded} for r, vs in sorted(per_rater.items())]


def analyze(study: Study, votes: list[dict], *, exclude_failing: bool = False, gold_threshold: float = 0.8,
            n_boot: int = REPORT_BOOTSTRAP, seed: int = 0, target_width: float = 0.1, covariates: tuple[str, ...] = (),
            labels: dict[str, str] | None = None, progress: bool = False) -> dict:
    """Every result for one study's votes (see the module doc); JSON-ready (nan as None).

    covariates: image covariates to control for in a second Bradley-Terry fit (style_control.COVARIATES);
    labels: rater id -> label, shown beside each rater.
    """
    rng = np.random.default_rng(seed)
    votes = [v for v in votes if v["pair_id"] in study.by_id]
    gold = gold_checks(votes, study, gold_threshold)
    excluded = set(gold["failing_raters"]) if exclude_failing else set()
    kept = [v for v in votes if v["rater_id"] not in excluded]
    main = [v for v in kept if study.by_id[v["pair_id"]].kind == "main"]

    comparisons = _comparisons(main, study, n_boot, rng, target_width, progress)
    bt = {}
    if len(study.models) >= 3:
        for q in study.question_ids:
            bt[q] = bradley_terry([v for v in main if v["question"] == q], study, max(200, n_boot // 2), rng)
    agreement = {q: _agreement([v for v in main if v["question"] == q]) for q in study.question_ids}
    consistency = self_consistency(kept, study)
    raters = rater_table(votes, gold, consistency, excluded, labels or {})

    controlled = {q: style_control([v for v in main if v["question"] == q], study, covariates)
                  for q in study.question_ids} if covariates else {}
    return json_ready({
        "study": study.id, "study_name": study.folder.resolve().name,  # the name people know it by
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "models": study.models,
        "model_info": {m: {k: study.model_info.get(m, {}).get(k, "") for k in ("checkpoint", "checkpoint_hash")}
                       for m in study.models},
        "questions": {q.id: q.text for q in study.questions},
        "settings": {"exclude_failing_raters": exclude_failing, "gold_threshold": gold_threshold, "bootstrap": n_boot,
                     "seed": seed, "design_effect_bootstrap": DESIGN_EFFECT_REPLICATES,
                     "design_effect_seed": DESIGN_EFFECT_SEED, "target_width": target_width,
                     "covariates": list(covariates), "z": Z95},
        "counts": {"votes": len(votes), "main_votes": len(main), "raters": len(raters),
                   "excluded_raters": sorted(excluded)},
        "comparisons": comparisons, "bradley_terry": bt, "style_control": {q: r for q, r in controlled.items() if r},
        "stopping": stopping(main, study, comparisons, target_width), "agreement": agreement, "gold": gold,
        "consistency": consistency, "raters": raters,
        **tie_results(main, study),
    })


def tie_results(main: list[dict], study: Study) -> dict:
    """A study's ``ties`` setting and its both-bad shares (``both_bad``), as the report and the joined page give them;
    nothing for a study whose ties are one answer."""
    return {"ties": study.ties, "both_bad": both_bad(main, study)} if study.ties != "one" else {}


def _comparisons(main: list[dict], study: Study, n_boot: int, rng: np.random.Generator, target_width: float,
                 progress: bool) -> list[dict]:
    """One result per question and model pair: preference rate, clustered interval, plan, rates per category."""
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for v in main:
        groups[(v["question"], *study.models_of(study.by_id[v["pair_id"]]))].append(v)
    comparisons = []
    model_pairs = [(a, b) for i, a in enumerate(study.models) for b in study.models[i + 1:]]
    keys = [(q, a, b) for q in study.question_ids for a, b in model_pairs]
    for q, a, b in tqdm(keys, desc="comparisons", disable=None if progress else True):
        group = groups.get((q, a, b), [])
        result = {"question": q, "model_a": a, "model_b": b, **preference(group), **clustered(group, study, n_boot, rng),
                  **_tie_kinds(group, study)}
        result["plan"] = sample_size_plan(result, target_width)
        result["flip"] = comparison_flip(group, study, result)
        by_category: dict[str, list[dict]] = defaultdict(list)
        for v in group:
            by_category[study.prompts[study.by_id[v["pair_id"]].prompt].category or NO_CATEGORY].append(v)
        result["categories"] = [{"category": c, **preference(vs), **_tie_kinds(vs, study)}
                                for c, vs in sorted(by_category.items())]
        comparisons.append(result)
    return comparisons


def _tie_kinds(votes: list[dict], study: Study) -> dict:
    """A good_bad study's ties split into "both good" and "both bad" votes (nothing for other studies)."""
    if study.ties != "good_bad":
        return {}
    return {"both_good": sum(v["choice"] == "good" for v in votes), "both_bad": sum(v["choice"] == "bad" for v in votes)}


def comparison_flip(group: list[dict], study: Study, result: dict) -> dict | None:
    """The fewest of the preferred image's votes whose removal makes the headline interval reach 50%
    (``stats.vote_flip``); None where it cannot tell."""
    if not result["decisive"]:
        return None
    side = "a" if result["wins_a"] * 2 > result["decisive"] else "b"
    leading = [v for v in group if v["choice"] == side]
    return vote_flip(leading, [study.by_id[v["pair_id"]].prompt for v in leading], result["wins_a"],
                     result["decisive"], result["design_effect"])


BOTH_BAD_PROMPTS = 5  # the prompts the report names as most often judged both bad, per question


def both_bad(main: list[dict], study: Study) -> dict:
    """Per question: each model's share of its main votes judged "both bad", overall and per category, with the
    headline interval of every human-eval share (``stats.effective_votes``: Wilson on the effective votes, clustered
    by prompt and rater); and the prompts most often judged both bad. A both-bad vote counts against both models of
    its pair. Empty for studies whose ties are not good_bad (their raters were never asked)."""
    if study.ties != "good_bad":
        return {}
    return {q: {"models": _both_bad_rates([v for v in main if v["question"] == q], study),
                "prompts": _both_bad_prompts([v for v in main if v["question"] == q], study)}
            for q in study.question_ids}


def _both_bad_rates(votes: list[dict], study: Study) -> list[dict]:
    """One row per model and category ("all" first): votes, both-bad votes, their share and its interval."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for v in votes:
        pair = study.by_id[v["pair_id"]]
        category = study.prompts[pair.prompt].category or NO_CATEGORY
        for model in study.models_of(pair):
            groups[(model, "all")].append(v)
            groups[(model, category)].append(v)
    rows = []
    for model in study.models:
        for category in ["all", *sorted({c for m, c in groups if m == model and c != "all"})]:
            group = groups.get((model, category), [])
            bad = np.array([v["choice"] == "bad" for v in group], dtype=float)
            prompts = np.array([study.by_id[v["pair_id"]].prompt for v in group])
            raters = np.array([v["rater_id"] for v in group])
            found = effective_votes(bad, np.ones_like(bad), prompts, raters) if group else {}
            rows.append({"model": model, "category": category, "votes": len(group), "both_bad": int(bad.sum()),
                         "rate": bad.mean() if group else math.nan,
                         "interval": found.get("clustered_wilson", (math.nan, math.nan)),
                         "design_effect": found.get("design_effect", math.nan)})
    return rows


def _both_bad_prompts(votes: list[dict], study: Study) -> list[dict]:
    """The prompts with the most both-bad votes (then the highest share of them), at most ``BOTH_BAD_PROMPTS``."""
    per: dict[int, list[int]] = defaultdict(lambda: [0, 0])  # prompt -> both-bad votes, votes
    for v in votes:
        counts = per[study.by_id[v["pair_id"]].prompt]
        counts[0] += v["choice"] == "bad"
        counts[1] += 1
    ranked = sorted((p for p, (bad, _) in per.items() if bad), key=lambda p: (-per[p][0], -per[p][0] / per[p][1], p))
    return [{"prompt": p, "text": study.prompts[p].text, "category": study.prompts[p].category or NO_CATEGORY,
             "both_bad": per[p][0], "votes": per[p][1], "rate": per[p][0] / per[p][1]}
            for p in ranked[:BOTH_BAD_PROMPTS]]


def _agreement(votes: list[dict]) -> dict:
    """Krippendorff's alpha between raters over the pairs of one question's votes."""
    units: dict[str, list[str]] = defaultdict(list)
    for v in votes:
        units[v["pair_id"]].append(v["choice"])
    return {"krippendorff_alpha": krippendorff_alpha_nominal(units.values()),
            "units_rated_twice_or_more": sum(len(u) >= 2 for u in units.values())}
