"""Report files: results and raw votes as JSON and CSV, the chart as PNG, and a text summary.

Used by `dwb human-eval report` and by the admin dashboard's downloads.
"""
from __future__ import annotations

import csv
import io
import json
import math
import time
from pathlib import Path

from .study import Study

VOTE_COLUMNS = ("vote_id", "created_at", "rater", "rater_label", "pair", "kind", "question", "answer", "left_model", "right_model",
                "choice", "preferred_model", "model_a", "model_b", "prompt_index", "prompt", "category", "image_index",
                "client_ms", "server_ms")
SHORT = {"two_way": "by prompt and rater", "bootstrap_prompt": "by prompt", "bootstrap_rater": "by rater",
         "wilson": "Wilson"}
RESULT_COLUMNS = ("question", "model_a", "model_b", "category", "votes", "wins_a", "wins_b", "ties", "decisive",
                  "rate_a", "wilson_lo", "wilson_hi", "bootstrap_prompt_lo", "bootstrap_prompt_hi", "bootstrap_rater_lo",
                  "bootstrap_rater_hi", "two_way_lo", "two_way_hi", "tie_rate", "sign_test_p")


def vote_rows(study: Study, votes: list[dict], labels: dict[str, str] | None = None) -> list[dict]:
    """Every vote with the models behind it, one dict per vote (admin-side: these name the models).

    labels: rater id -> what the rater typed or the crowd platform's worker id (Store.labels).
    """
    labels = labels or {}
    rows = []
    for v in votes:
        pair = study.by_id.get(v["pair_id"])
        if pair is None:
            continue
        ma, mb = study.models_of(pair)
        left, right = (mb, ma) if v["swapped"] else (ma, mb)
        prompt = study.prompts[pair.prompt]
        values = (v["id"], time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(v["created_at"])) + "Z", v["rater_id"],
                  labels.get(v["rater_id"], v["rater_id"]), pair.id,
                  pair.kind, v["question"], v["answer"], left, right, v["choice"], {"a": ma, "b": mb}.get(v["choice"], ""),
                  ma, mb, pair.prompt, prompt.text, prompt.category, pair.image_index, v["client_ms"], v["server_ms"])
        rows.append(dict(zip(VOTE_COLUMNS, values)))
    return rows


def votes_csv(study: Study, votes: list[dict], labels: dict[str, str] | None = None) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, VOTE_COLUMNS)
    writer.writeheader()
    writer.writerows(vote_rows(study, votes, labels))
    return buf.getvalue()


def votes_json(study: Study, votes: list[dict], labels: dict[str, str] | None = None) -> str:
    return json.dumps(vote_rows(study, votes, labels), indent=1)


def results_csv(results: dict) -> str:
    """One row per question, model pair and category ('all' first)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(RESULT_COLUMNS)
    for c in results["comparisons"]:
        for category, r in [("all", c)] + [(cat["category"], cat) for cat in c["categories"]]:
            row = {"question": c["question"], "model_a": c["model_a"], "model_b": c["model_b"], "category": category,
                   **{k: r.get(k) for k in ("votes", "wins_a", "wins_b", "ties", "decisive", "rate_a", "tie_rate",
                                            "sign_test_p")}}
            for name in ("wilson", "bootstrap_prompt", "bootstrap_rater", "two_way"):
                lo, hi = r.get(name) or (None, None)
                row[f"{name}_lo"], row[f"{name}_hi"] = lo, hi
            writer.writerow([row[k] for k in RESULT_COLUMNS])
    return buf.getvalue()


def _pct(x) -> str:
    return "  n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:5.1f}"


def summary(results: dict, interval: str = "two_way") -> str:
    """The headline numbers as text: one line per question and model pair, then BT, agreement and checks."""
    lines = [f"{results['counts']['votes']} votes from {results['counts']['raters']} raters "
             f"({results['counts']['main_votes']} on main pairs"
             + (f"; excluded: {', '.join(results['counts']['excluded_raters'])}" if results['counts']['excluded_raters'] else "")
             + ")"]
    for c in results["comparisons"]:
        lo, hi = c[interval] if c[interval] else (None, None)
        wlo, whi = c["wilson"]
        lines.append(f"{c['question']:>10}  {c['model_a']} vs {c['model_b']}: {c['model_a']} preferred in "
                     f"{_pct(c['rate_a'])}% of {c['decisive']} decisive votes, 95% {SHORT[interval]} [{_pct(lo)}, {_pct(hi)}] "
                     f"(Wilson [{_pct(wlo)}, {_pct(whi)}]), ties {_pct(c['tie_rate'])}%, sign test p={c['sign_test_p']:.3g}")
    for q, rows in results.get("bradley_terry", {}).items():
        ranked = sorted(rows, key=lambda r: r["rank"])
        lines.append(f"{q:>10}  Bradley-Terry: " + ", ".join(
            f"{r['model']} {r['score']:+.2f} [{r['interval'][0]:+.2f}, {r['interval'][1]:+.2f}]" for r in ranked))
    for q, a in results["agreement"].items():
        alpha = a["krippendorff_alpha"]
        lines.append(f"{q:>10}  Krippendorff's alpha {'n/a' if alpha is None else f'{alpha:.3f}'} "
                     f"over {a['units_rated_twice_or_more']} pairs rated twice or more")
    gold = results["gold"]
    if gold["votes"]:
        lines.append(f"gold checks: {gold['passed']}/{gold['votes']} passed; raters under {gold['threshold']:.0%}: "
                     f"{', '.join(gold['failing_raters']) or 'none'}")
    cons = results["consistency"]
    if cons["repeats"]:
        lines.append(f"self-consistency: {cons['agreed']}/{cons['repeats']} repeated answers agree")
    c = results["comparisons"][0] if results["comparisons"] else None
    if c:
        p = c["plan"]
        lines.append(f"planner ({c['question']}, {c['model_a']} vs {c['model_b']}): a {p['target_width']:.2f}-wide interval needs {p['decisive_needed_worst_case']} decisive "
                     f"votes at 50% ({p['decisive_needed_at_observed']} at the observed rate"
                     + (f"; about {p['votes_needed']} votes with ties and clustering" if p["votes_needed"] else "") + ")")
    return "\n".join(lines + style_lines(results) + stopping_lines(results))


def style_lines(results: dict) -> list[str]:
    """Bradley-Terry scores without and with the image covariates, per question."""
    lines = []
    for q, r in results.get("style_control", {}).items():
        scores = ", ".join(f"{m['model']} {m['score']:+.2f} -> {m['score_controlled']:+.2f}" for m in r["models"])
        coefs = ", ".join(f"{c['covariate']} {c['coef']:+.2f} [{c['interval'][0]:+.2f}, {c['interval'][1]:+.2f}]"
                          for c in r["coefficients"])
        lines.append(f"{q:>10}  controlling for {', '.join(r['covariates']) or 'nothing (all constant)'}: {scores}"
                     + (f"; per SD of difference: {coefs}" if coefs else ""))
    return lines


def stopping_lines(results: dict) -> list[str]:
    """Whether every comparison is settled (its interval clear of 50% or narrower than the target), and when."""
    s = results.get("stopping")
    if not s:
        return []
    predicted = s["predicted_votes"]
    forecast = (f"the planner predicts about {predicted['adaptive']} main votes with adaptive allocation, "
                f"{predicted['uniform']} with uniform" if predicted["adaptive"] is not None else
                "the planner cannot predict it yet (a comparison sits at exactly 50%)")
    state = (f"met after {s['met_at_votes']} of {s['main_votes']} main votes" if s["met_at_votes"] is not None
             else f"not met after {s['main_votes']} main votes; open: {', '.join(s['open'])}")
    return [f"stopping rule (every interval clear of 50% or under {s['target_width']:.2f} wide; allocation "
            f"{s['allocation']}): {state}; {forecast}"]


def write_report(study: Study, votes: list[dict], results: dict, out: str | Path, interval: str = "two_way",
                 labels: dict[str, str] | None = None) -> dict[str, Path]:
    """results.json, results.csv, votes.csv, votes.json and preference.png in `out`; returns their paths."""
    from .chart import plot_preferences

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in ("results.json", "results.csv", "votes.csv", "votes.json", "preference.png")}
    paths["results.json"].write_text(json.dumps(results, indent=1))
    paths["results.csv"].write_text(results_csv(results))
    paths["votes.csv"].write_text(votes_csv(study, votes, labels))
    paths["votes.json"].write_text(votes_json(study, votes, labels))
    plot_preferences(results, paths["preference.png"], interval)
    return paths
