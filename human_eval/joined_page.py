"""The joined report's files: one HTML page, the JSON, and three CSVs (models, agreement, categories).

Written by `dwb human-eval report STUDY --results EVAL_OUT`. Every label on the page comes from files
anyone could have written (manifests, results stores), so each is escaped.
"""
from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path

from models.common import p_value_text

from .report import BOTH_BAD_HEADERS, both_bad_rows, csv_text, share_text, study_name, votes_flip_text
from .scores import LABELS, METRICS

FILES = ("joined.html", "joined.json", "joined_models.csv", "joined_agreement.csv", "joined_categories.csv")
CSS = ("body{font-family:sans-serif;margin:2em;max-width:75em}table{border-collapse:collapse;margin:1em 0}"
       "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right}td:first-child,th:first-child{text-align:left}"
       ".note{color:#8a5300}")


def _num(x, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


def _with_interval(value, interval, digits: int = 3) -> str:
    lo, hi = interval or (None, None)
    return _num(value, digits) + ("" if lo is None else f" [{_num(lo, digits)}, {_num(hi, digits)}]")


def _pct(value, interval) -> str:
    lo, hi = interval or (None, None)
    if value is None:
        return "n/a"
    return f"{100 * value:.1f}%" + ("" if lo is None else f" [{100 * lo:.1f}, {100 * hi:.1f}]")


def _share(value, interval) -> str:
    """A win rate with its headline interval, as the report and the admin page print a share (``share_text``)."""
    lo, hi = interval or (None, None)
    return "n/a" if value is None or lo is None else share_text(value, lo, hi)


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def shown_metrics(joined: dict) -> list[str]:
    """The metric columns any model has, in the table's order."""
    return [m for m in METRICS if any(m in r["metrics"] for r in joined["table"])]


def _model_section(joined: dict, q: str) -> str:
    metrics = shown_metrics(joined)
    rows = []
    for r in joined["table"]:
        h = r["human"][q]
        p = "n/a" if h.get("score_test_p") is None else p_value_text(h["score_test_p"])
        bt_flip = votes_flip_text(h.get("bt_flip"))
        rows.append([r["model"], _with_interval(h["bt_score"], h["bt_interval"], 2) + (f" ({bt_flip})" if bt_flip else ""),
                     _share(h["win_rate"], h["clustered_wilson"]), votes_flip_text(h.get("flip")), p, h["decisive"],
                     *(_with_interval(r["metrics"][m]["value"], (r["metrics"][m]["lo"], r["metrics"][m]["hi"]))
                       if m in r["metrics"] else "no row" if r["row"] is None else "n/a" for m in metrics)])
    return _table(["model", "Bradley-Terry [95%]", "win rate [95% Wilson, effective votes]", "votes that would flip it",
                   "p (50/50)",
                   "decisive votes", *(LABELS[m] + " [95%]" for m in metrics)], rows)


def _both_bad_section(joined: dict, q: str) -> list[str]:
    """A good_bad study's both-bad shares of one question, as the report and the admin page give them (``both_bad_rows``);
    nothing for other studies."""
    found = joined.get("both_bad", {}).get(q)
    if not found:
        return []
    return ["<h3>Both bad</h3>", *(_table(header, rows) for header, rows in zip(BOTH_BAD_HEADERS, both_bad_rows(found)))]


def _agreement_section(joined: dict, q: str) -> str:
    a = joined["agreement"][q]
    rows = [[f"{x['label']} ({'lower' if not x['higher_is_better'] else 'higher'} is better)", "model pairs", x["source"],
             x["model_pairs"], _pct(x["agreement"], x["interval"]),
             "; ".join(f"{p['model_a']} vs {p['model_b']}" for p in x["pairs"] if p["agrees"] == 0)]
            for x in a["model_pairs"]]
    rows += [[x["label"], "image pairs", "study images", x["votes"], _pct(x["agreement"], x["interval"]), ""]
             for x in a["image_pairs"]]
    return _table(["metric", "unit", "metric from", "pairs / votes", "agrees with raters [95% by prompt]",
                   "model pairs it orders against raters"], rows)


def _category_section(joined: dict, q: str) -> str:
    rows = [[c["category"], c["model"], c["decisive"], _pct(c["win_rate"], c["bootstrap_prompt"]),
             _pct(c["win_rate"], c["wilson"])] for c in joined["categories"][q]]
    return _table(["category", "model", "decisive votes", "win rate [95% by prompt]", "[95% Wilson]"], rows)


def page(joined: dict) -> str:
    """The joined report as one self-contained HTML page."""
    parts = [f"<h1>Humans beside metrics: study {escape(study_name(joined))}</h1>",
             f"<p>{joined['counts']['main_votes']} main votes ({joined['counts']['decisive']} decisive); metrics from "
             f"{escape(', '.join(joined['results']))}; intervals are 95%, bootstrap by prompt "
             f"({joined['settings']['bootstrap']} resamples) unless said.</p>"]
    parts += [f"<p class=note>{escape(n)}</p>" for n in joined["notes"]]
    for q, text in joined["questions"].items():
        parts += [f"<h2>{escape(q)}: {escape(text)}</h2>", "<h3>Models</h3>", _model_section(joined, q),
                  *_both_bad_section(joined, q), "<h3>Agreement of each metric with raters</h3>", _agreement_section(joined, q),
                  "<h3>Win rate per category</h3>", _category_section(joined, q)]
    return ("<!doctype html><html><head><meta charset=utf-8><title>Humans beside metrics</title>"
            f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>")


def _csv(header: list[str], rows: list[list]) -> str:
    return csv_text(header, [["" if x is None else x for x in row] for row in rows])


def models_csv(joined: dict) -> str:
    """One line per model and question: human scores, then each metric with its interval."""
    metrics = shown_metrics(joined)
    header = ["question", "model", "checkpoint_hash", "guidance", "sampler", "n_images", "bt_score", "bt_lo", "bt_hi",
              "decisive", "win_rate", "win_rate_lo", "win_rate_hi", "win_rate_p",
              *(c for m in metrics for c in (m, f"{m}_lo", f"{m}_hi"))]
    rows = []
    for q in joined["questions"]:
        for r in joined["table"]:
            h, row = r["human"][q], r["row"] or {}
            rows.append([q, r["model"], r["checkpoint_hash"], row.get("guidance"), row.get("sampler"), row.get("n_images"),
                         h["bt_score"], *h["bt_interval"], h["decisive"], h["win_rate"], *h["clustered_wilson"],
                         h.get("score_test_p"),
                         *(r["metrics"].get(m, {}).get(k) for m in metrics for k in ("value", "lo", "hi"))])
    return _csv(header, rows)


def agreement_csv(joined: dict) -> str:
    rows = [[q, unit, x["metric"], x.get("source", "study images"), x.get("model_pairs", x.get("votes")), x["agreement"],
             *x["interval"]] for q, a in joined["agreement"].items() for unit in ("model_pairs", "image_pairs")
            for x in a[unit]]
    return _csv(["question", "unit", "metric", "metric_from", "n", "agreement", "agreement_lo", "agreement_hi"], rows)


def categories_csv(joined: dict) -> str:
    rows = [[q, c["category"], c["model"], c["votes"], c["decisive"], c["wins"], c["win_rate"], *c["wilson"],
             *c["bootstrap_prompt"]] for q, cs in joined["categories"].items() for c in cs]
    return _csv(["question", "category", "model", "votes", "decisive", "wins", "win_rate", "wilson_lo", "wilson_hi",
                 "bootstrap_prompt_lo", "bootstrap_prompt_hi"], rows)


def write_joined(joined: dict, out: str | Path) -> dict[str, Path]:
    """The page, the JSON and the CSVs in `out`; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    texts = dict(zip(FILES, (page(joined), json.dumps(joined, indent=1), models_csv(joined), agreement_csv(joined),
                             categories_csv(joined))))
    paths = {name: out / name for name in FILES}
    for name, text in texts.items():
        paths[name].write_text(text)
    return paths


def joined_lines(joined: dict) -> list[str]:
    """The headline of the joined report as text: each metric's agreement with raters, and the notes."""
    lines = [f"note: {n}" for n in joined["notes"]]
    for q, a in joined["agreement"].items():
        for x in a["model_pairs"]:
            lines.append(f"{q:>10}  {x['label']} orders {_pct(x['agreement'], x['interval'])} of {x['model_pairs']} "
                         f"model pairs as raters do ({x['source']})")
        for x in a["image_pairs"]:
            lines.append(f"{q:>10}  the image with the higher {x['label']} is preferred in "
                         f"{_pct(x['agreement'], x['interval'])} of {x['votes']} decisive votes")
    return lines
