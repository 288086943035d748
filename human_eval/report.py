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

from models.common import flip_text, interval_text, p_value_text, spreadsheet_cell

from .chart import DEFAULT_INTERVAL, INTERVALS
from .study import Study

VOTE_COLUMNS = ("vote_id", "created_at", "rater", "rater_label", "pair", "kind", "question", "answer", "left_model", "right_model",
                "choice", "preferred_model", "model_a", "model_b", "prompt_index", "prompt", "category", "image_index",
                "client_ms", "server_ms")
SHORT = {"clustered_wilson": "Wilson on effective votes", "two_way": "bootstrap by prompt and rater",
         "bootstrap_prompt": "bootstrap by prompt", "bootstrap_rater": "bootstrap by rater", "wilson": "Wilson"}
RESULT_COLUMNS = ("question", "model_a", "model_b", "category", "votes", "wins_a", "wins_b", "ties", "decisive",
                  "rate_a", *(f"{name}_{end}" for name in INTERVALS for end in ("lo", "hi")), "design_effect",
                  "tie_rate", "score_test_p", "sign_test_p")


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


def csv_text(header, rows) -> str:
    """A CSV file's text, every cell through ``spreadsheet_cell``."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    for row in [header, *rows]:
        writer.writerow([spreadsheet_cell(x) for x in row])
    return buf.getvalue()


def votes_csv(study: Study, votes: list[dict], labels: dict[str, str] | None = None) -> str:
    return csv_text(VOTE_COLUMNS, ([row[k] for k in VOTE_COLUMNS] for row in vote_rows(study, votes, labels)))


def votes_json(study: Study, votes: list[dict], labels: dict[str, str] | None = None) -> str:
    return json.dumps(vote_rows(study, votes, labels), indent=1)


def results_csv(results: dict) -> str:
    """One row per question, model pair and category ('all' first)."""
    rows = []
    for c in results["comparisons"]:
        for category, r in [("all", c)] + [(cat["category"], cat) for cat in c["categories"]]:
            row = {"question": c["question"], "model_a": c["model_a"], "model_b": c["model_b"], "category": category,
                   **{k: r.get(k) for k in ("votes", "wins_a", "wins_b", "ties", "decisive", "rate_a", "tie_rate",
                                            "design_effect", "score_test_p", "sign_test_p")}}
            for name in INTERVALS:
                lo, hi = r.get(name) or (None, None)
                row[f"{name}_lo"], row[f"{name}_hi"] = lo, hi
            rows.append([row[k] for k in RESULT_COLUMNS])
    return csv_text(RESULT_COLUMNS, rows)


def share_text(rate: float, lo: float, hi: float) -> str:
    """A share of decisive votes with its 95% interval, in percent, as every human-eval surface prints it (the
    report, the admin page, joined.html): "64.0 [50.8, 86.3]%", rounded outward, never a bound clear of 50% on it."""
    return f"{interval_text(100 * rate, 100 * lo, 100 * hi, threshold=50)}%"


def interval_only(lo: float | None, hi: float | None) -> str:
    """The bracket of ``share_text`` alone: "[50.8, 86.3]%"; "n/a" without an interval."""
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return "n/a"
    return share_text(lo, lo, hi).partition(" ")[2]  # the same digits: the estimate does not move the bounds


def votes_flip_text(flip: dict | None) -> str:
    """How many votes would flip a verdict, as every human-eval surface prints it beside the interval (the report, the
    admin page, joined.html): "flips without 7 of its votes"; "" where it cannot tell (or results written before)."""
    return flip_text(flip["count"], flip["exact"], "vote") if flip else ""


def _pct(x) -> str:
    return "  n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:5.1f}"


def _flipped(iv, flip: bool) -> tuple:
    lo, hi = iv or (None, None)
    return (1 - hi, 1 - lo) if flip and lo is not None else (lo, hi)


def preference_line(c: dict, interval: str = DEFAULT_INTERVAL) -> str:
    """One comparison in words, the preferred model first: its share of the decisive votes with the 95% interval
    (Wilson on effective votes), the score test read off that interval, and what they say. Digits are rounded
    outward and never put a bound clear of 50% on 50% (``models.common.interval_text``)."""
    flip = c["rate_a"] is not None and c["rate_a"] < 0.5  # the winner first: model b's share and interval
    first, second = (c["model_b"], c["model_a"]) if flip else (c["model_a"], c["model_b"])
    lo, hi = _flipped(c[DEFAULT_INTERVAL], flip)
    if lo is None:
        return f"{c['question']:>10}  {first} vs {second}: no decisive votes ({c['votes']} votes)"
    rate = 1 - c["rate_a"] if flip else c["rate_a"]
    verdict = f"{first} is preferred" if lo > 0.5 or hi < 0.5 else "cannot tell yet (the interval holds 50%)"
    flips = votes_flip_text(c.get("flip"))
    verdict += f", {flips}" if flips else ""
    other = ""
    if interval != DEFAULT_INTERVAL:
        olo, ohi = _flipped(c[interval], flip)
        other = f"; {SHORT[interval]} [{_pct(olo)}, {_pct(ohi)}]"
    deff = c.get("design_effect")
    return (f"{c['question']:>10}  {first} vs {second}: {first}'s share of {c['decisive']} decisive votes "
            f"{share_text(rate, lo, hi)} (95%, {SHORT[DEFAULT_INTERVAL]}, design "
            f"effect {'n/a' if deff is None else f'{deff:.2f}'}), {p_value_text(c['score_test_p'])}: {verdict}{other}; "
            f"ties {_pct(c['tie_rate']).strip()}%; sign test, votes as independent, {p_value_text(c['sign_test_p'])}")


def study_name(results: dict) -> str:
    """The study as people know it: its folder's own name (the random id names nothing a person chose; results
    written before the name was kept have only the id)."""
    return results.get("study_name") or results["study"]


def summary(results: dict, interval: str = DEFAULT_INTERVAL) -> str:
    """The headline numbers as text: the study and its counts, one line per question and model pair, then BT,
    agreement and checks."""
    lines = [f"study {study_name(results)}: {results['counts']['votes']} votes from {results['counts']['raters']} raters "
             f"({results['counts']['main_votes']} on main pairs"
             + (f"; excluded: {', '.join(results['counts']['excluded_raters'])}" if results['counts']['excluded_raters'] else "")
             + ")"]
    lines += [preference_line(c, interval) for c in results["comparisons"]]
    lines += both_bad_lines(results)
    for q, rows in results.get("bradley_terry", {}).items():
        ranked = sorted(rows, key=lambda r: r["rank"])
        lines.append(f"{q:>10}  Bradley-Terry: " + ", ".join(
            f"{r['model']} {r['score']:+.2f} [{r['interval'][0]:+.2f}, {r['interval'][1]:+.2f}]"
            + (f" ({votes_flip_text(r['flip'])})" if r.get("flip") else "") for r in ranked))
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
    return "\n".join(lines + planner_lines(results) + style_lines(results) + stopping_lines(results))


def both_bad_text(row: dict) -> str:
    """A model's both-bad share with its interval: "12.5 [6.01, 24.1]% of 40 votes" ("no votes" without any)."""
    lo, hi = row["interval"]
    if lo is None or row["rate"] is None:
        return "no votes"
    return f"{share_text(row['rate'], lo, hi)} of {row['votes']} votes"


BOTH_BAD_HEADERS = (["model", "category", "votes", "both bad", "share both bad, 95% Wilson on effective votes"],
                    ["prompts most often judged both bad", "category", "both bad", "votes"])


def both_bad_rows(found: dict) -> tuple[list[list], list[list]]:
    """One question's both-bad tables as the admin and joined pages show them (headers ``BOTH_BAD_HEADERS``): each
    model's share per category, and the prompts most often judged both bad."""
    return ([[r["model"], r["category"], r["votes"], r["both_bad"], both_bad_text(r)] for r in found["models"]],
            [[p["text"], p["category"], p["both_bad"], p["votes"]] for p in found["prompts"]])


def both_bad_lines(results: dict) -> list[str]:
    """A good_bad study's both-bad shares per question and model, overall and per category, and the prompts most
    often judged both bad (nothing for other studies)."""
    lines = []
    for q, found in results.get("both_bad", {}).items():
        for model in results["models"]:
            rows = [r for r in found["models"] if r["model"] == model]
            per_category = "; ".join(f"{r['category']} {both_bad_text(r)}" for r in rows if r["category"] != "all")
            lines.append(f"{q:>10}  both bad, {model}: {both_bad_text(rows[0])} (95%, {SHORT[DEFAULT_INTERVAL]})"
                         + (f"; by category: {per_category}" if per_category else ""))
        named = ", ".join(f"{json.dumps(p['text'])} ({p['both_bad']} of {p['votes']} votes)" for p in found["prompts"])
        lines.append(f"{q:>10}  prompts most often judged both bad: {named or 'none'}")
    return lines


def both_bad_csv(results: dict) -> str:
    """One row per question, model and category ("all" first): votes, both-bad votes, share and interval."""
    header = ("question", "model", "category", "votes", "both_bad", "rate", "lo", "hi", "design_effect")
    rows = [[q, r["model"], r["category"], r["votes"], r["both_bad"], r["rate"], *r["interval"], r["design_effect"]]
            for q, found in results.get("both_bad", {}).items() for r in found["models"]]
    return csv_text(header, rows)


def planner_lines(results: dict) -> list[str]:
    """Votes for an interval of the target width (the first comparison): what measuring the rate that finely takes,
    which the stopping rule does not wait for once an interval clears 50%."""
    c = results["comparisons"][0] if results["comparisons"] else None
    if not c:
        return []
    p = c["plan"]
    total = f", about {p['votes_needed']} votes in all with ties and clustering" if p["votes_needed"] else ""
    return [f"votes for a {p['target_width']:.2f}-wide interval (+-{50 * p['target_width']:.0f} points; "
            f"{c['question']}, {c['model_a']} vs {c['model_b']}): {p['decisive_needed_worst_case']} decisive at a "
            f"50% rate, "
            f"{p['decisive_needed_at_observed']} at the observed rate{total}; a comparison whose interval clears 50% "
            f"is settled sooner (stopping rule, below)"]


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
    forecast = (f"at the observed rates, settling every comparison takes about {predicted['adaptive']} main votes "
                f"with adaptive allocation, {predicted['uniform']} with uniform" if predicted["adaptive"] is not None
                else "the votes to settle every comparison cannot be forecast yet")
    state = (f"every comparison was settled after {s['met_at_votes']} of the {s['main_votes']} main votes"
             if s["met_at_votes"] is not None
             else f"not every comparison is settled after {s['main_votes']} main votes; open: {', '.join(s['open'])}")
    return [f"stopping rule (allocation {s['allocation']}): a comparison is settled once its 95% interval "
            f"({SHORT[DEFAULT_INTERVAL]}) excludes 50% or is under {s['target_width']:.2f} wide; {state}; {forecast}"]


def write_report(study: Study, votes: list[dict], results: dict, out: str | Path, interval: str = DEFAULT_INTERVAL,
                 labels: dict[str, str] | None = None) -> dict[str, Path]:
    """results.json, results.csv, votes.csv, votes.json and preference.png in `out`, and both_bad.csv for a study whose
    ties are good_bad; returns their paths."""
    from .chart import plot_preferences

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in ("results.json", "results.csv", "votes.csv", "votes.json", "preference.png")}
    paths["results.json"].write_text(json.dumps(results, indent=1))
    paths["results.csv"].write_text(results_csv(results))
    paths["votes.csv"].write_text(votes_csv(study, votes, labels))
    paths["votes.json"].write_text(votes_json(study, votes, labels))
    plot_preferences(results, paths["preference.png"], interval)
    if "both_bad" in results:
        paths["both_bad.csv"] = out / "both_bad.csv"
        paths["both_bad.csv"].write_text(both_bad_csv(results))
    return paths
