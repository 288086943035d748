"""Ties with meaning: "both good" and "both bad" through the store, the server, the exports and the report, and
studies made before the setting read as they were."""
import json
import math
import re

import httpx
import numpy as np
import pytest

from human_eval.admin import dashboard_html
from human_eval.analysis import analyze
from human_eval.errors import HumanEvalError
from human_eval.report import RESULT_COLUMNS, results_csv, share_text, summary
from human_eval.statistics.stats import Z95
from human_eval.store import Store, database_url
from human_eval.study import load_study

from .conftest import cast_tie_votes, check_tie_round_trip, serving, start_rater


def wilson(k: float, n: float) -> tuple[float, float]:
    """Wilson's score interval, written out from Wilson (1927)."""
    p, z2 = k / n, Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def test_both_good_and_both_bad_round_trip_through_sqlite_exports_and_report(good_bad_study, tmp_path):
    study = load_study(good_bad_study)
    assert study.ties == "good_bad" and study.answers == ("A", "B", "good", "bad")
    url = database_url(tmp_path / "votes.sqlite")
    store = Store(url, study.id)
    cast = cast_tie_votes(store, study)
    store.close()
    reopened = Store(url, study.id, create=False)  # what a restarted server or `report` reads
    results = check_tie_round_trip(study, reopened, cast, tmp_path / "report")
    text = summary(results)
    for q, found in results["both_bad"].items():
        for row in (r for r in found["models"] if r["category"] == "all"):
            assert f"both bad, {row['model']}: {share_text(row['rate'], *row['interval'])} of {row['votes']} votes" in text
        assert f"{q:>10}  prompts most often judged both bad: {json.dumps(found['prompts'][0]['text'])}" in text
    page = dashboard_html(results, reopened.counts(), False)
    assert page.count("<h2>Both bad: ") == len(study.question_ids)
    assert share_text(*(lambda r: (r["rate"], *r["interval"]))(results["both_bad"]["quality"]["models"][0])) in page
    reopened.close()


def test_both_bad_rate_interval_and_prompts_equal_a_direct_computation(good_bad_study, tmp_path):
    """Four raters answer every pair once. Within a category every prompt and every rater has the same share of
    both-bad votes, so the clustered variance is 0, the design effect 1 and the interval Wilson's on the votes
    themselves; over all categories the prompts differ, and the interval is Wilson's on the effective votes."""
    study = load_study(good_bad_study)
    store = Store(database_url(tmp_path / "votes.sqlite"), study.id)
    answers = {"a red cube": ["bad", "bad", "A", "B"], "a blue ball": ["A", "good", "bad", "bad"],  # 2 of 4 each
               "the word cat": ["bad"] * 4, "the word dog": ["bad"] * 4}  # 4 of 4
    for r in range(4):
        store.add_rater(f"r{r}")
        for pair in (p for p in study.pairs if p.kind == "main"):
            store.show(f"r{r}", pair.id, r % 2 == 0)
            store.vote(f"r{r}", pair.id, "quality", answers[study.prompts[pair.prompt].text][r], None)
    results = analyze(study, store.all_votes(), n_boot=50)
    rows = {(r["model"], r["category"]): r for r in results["both_bad"]["quality"]["models"]}
    for model in study.models:
        for category, bad in (("Colors", 4), ("Text", 8)):  # of 8 votes: two prompts, four raters
            row = rows[(model, category)]
            assert (row["votes"], row["both_bad"], row["rate"], row["design_effect"]) == (8, bad, bad / 8, 1.0)
            assert np.allclose(row["interval"], wilson(bad, 8))
        every = rows[(model, "all")]
        assert (every["votes"], every["both_bad"], every["rate"]) == (16, 12, 0.75)
        deff = every["design_effect"]
        assert deff > 1 and np.allclose(every["interval"], wilson(12 / deff, 16 / deff))
    named = results["both_bad"]["quality"]["prompts"]
    assert [(p["text"], p["both_bad"], p["votes"]) for p in named] == [
        ("the word cat", 4, 4), ("the word dog", 4, 4), ("a red cube", 2, 4), ("a blue ball", 2, 4)]
    unasked = results["both_bad"]["alignment"]  # no votes: one empty row per model, no interval, no prompt named
    assert [(r["model"], r["votes"], r["rate"]) for r in unasked["models"]] == [(m, 0, None) for m in study.models]
    assert unasked["prompts"] == []
    store.close()


def test_a_study_made_before_ties_had_kinds_reads_and_reports_as_it_did(good_bad_study, tmp_path):
    """A study file without the setting and a store of A, B and none votes, written with the store's own API."""
    old = tmp_path / "old"
    old.mkdir()
    data = json.loads((good_bad_study / "study.json").read_text())
    del data["ties"]
    (old / "study.json").write_text(json.dumps(data))
    study = load_study(old)
    assert study.ties == "one" and study.answers == ("A", "B", "none")
    store = Store(database_url(old / "votes.sqlite"), study.id)
    store.add_rater("old-rater")
    answers = ["A", "none", "B", "A"]
    for pair, answer in zip((p for p in study.pairs if p.kind == "main"), answers):
        store.show("old-rater", pair.id, False)
        store.vote("old-rater", pair.id, "quality", answer, 5)
    results = analyze(study, store.all_votes(), n_boot=50)
    assert set(results) == {"study", "study_name", "generated", "models", "model_info", "questions", "settings", "counts",
                            "comparisons", "bradley_terry", "style_control", "stopping", "agreement", "gold",
                            "consistency", "raters"}  # the keys results.json had before
    c = results["comparisons"][0]
    assert not {"both_good", "both_bad"} & set(c) and (c["ties"], c["decisive"]) == (1, 3)
    assert "both bad" not in summary(results) and "Both bad" not in dashboard_html(results, store.counts(), False)
    assert results_csv(results).splitlines()[0] == ",".join(RESULT_COLUMNS)
    store.close()
    for setting in ("both", ["good"]):  # a study file naming ties this version does not know is refused in one line
        (old / "study.json").write_text(json.dumps({**data, "ties": setting}))
        with pytest.raises(HumanEvalError, match=r"not a study this version wrote") as refused:
            load_study(old)
        assert "\n" not in str(refused.value)


def test_hostile_answers_are_refused_in_one_line(good_bad_study, two_model_study, tmp_path):
    """A good_bad study refuses "none" and unknown answers; a study with one tie refuses forged both-good/bad."""
    for folder, offered in ((good_bad_study, ["A", "B", "good", "bad"]), (two_model_study, ["A", "B", "none"])):
        study = load_study(folder)
        url = database_url(tmp_path / f"{folder.parent.name}.sqlite")
        store = Store(url, study.id)
        with serving(folder, url) as base, httpx.Client(base_url=base) as c:
            rater = start_rater(c, "mallory")
            p = c.get("/api/next", params={"rater": rater}).json()
            assert p["answers"] == offered
            vote = {"rater": rater, "pair": p["pair"], "question": "quality"}
            forged = [a for a in ("none", "good", "bad") if a not in offered]
            for answer in (*forged, "maybe", "Good", "BAD", "", "good " * 2, None, 1, ["good"], "a" * 5000):
                r = c.post("/api/vote", json={**vote, "answer": answer})
                assert r.status_code in (413, 422), (answer, r.text)
                detail = r.json()["detail"]
                assert isinstance(detail, str) and "\n" not in detail, (answer, r.text)
                assert not re.search(r"/(tmp|work|home|usr)/|Traceback", r.text), r.text
            for answer in forged:
                assert c.post("/api/vote", json={**vote, "answer": answer}).json()["detail"] == (
                    f"this study does not offer the answer {answer} (expected one of: {', '.join(offered)})")
            assert store.all_votes() == []
            tie = offered[2]
            assert c.post("/api/vote", json={**vote, "answer": tie}).json() == {"recorded": True}
            changed = c.post("/api/vote", json={**vote, "answer": offered[-1] if tie != offered[-1] else "A"})
            assert changed.status_code == 409  # a tie is as final as any vote
            assert [(v["answer"], v["choice"]) for v in store.all_votes()] == [(tie, tie)]
        store.close()
