"""`dwb human-eval report` on a store of simulated votes: numbers, exports, the chart, gold exclusion."""
import csv
import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from human_eval.statistics.allocation import settled
from human_eval.analysis import analyze
from human_eval.report import summary
from human_eval.samples import read_manifest
from human_eval.statistics.stats import sign_test, wilson_interval
from human_eval.store import Store, database_url
from human_eval.study import GOLD_MODEL, build_study, load_study
from human_eval.statistics.style_control import COVARIATES

from ..conftest import run_dwb
from .conftest import drawbench, model_secrets, write_samples

STRENGTH = {"alpha": 0.9, "beta": 0.3, "gamma": -0.6}  # Bradley-Terry log-strengths of the simulated raters


@pytest.fixture(scope="module")
def rated_study(tmp_path_factory) -> tuple[Path, dict]:
    """Three models on 20 DrawBench prompts, 4 gold and 6 repeated pairs, 12 raters; 'careless' fails every gold pair."""
    root = tmp_path_factory.mktemp("report")
    samples = []
    for i, name in enumerate(STRENGTH):
        samples += read_manifest(write_samples(root / name, name, drawbench()[::10], 1, size=8, seed=i))
    build_study(samples, root / "study", gold=4, repeats=6, seed=1, progress=False)
    study = load_study(root / "study")
    store = Store(database_url(root / "study" / "votes.sqlite"), study.id)
    rng = random.Random(0)
    strength = {m: STRENGTH[m.split("-")[0]] for m in study.models}
    for r in range(12):
        rater = "careless" if r == 0 else f"rater{r:02d}"
        store.add_rater(rater)
        shown = study.order_for(rater)  # careless rates every pair, so meets every gold pair; the others 40 of 70
        for pair_id in shown if rater == "careless" else shown[:40]:
            pair = study.by_id[pair_id]
            swapped = rng.random() < 0.5
            store.show(rater, pair_id, swapped)
            for q in study.question_ids:
                if pair.kind == "gold":
                    choice = "b" if rater == "careless" else "a"
                elif rng.random() < 0.15:
                    choice = "none"
                else:
                    a, b = study.models_of(pair)
                    choice = "a" if rng.random() < 1 / (1 + np.exp(strength[b] - strength[a])) else "b"
                answer = "none" if choice == "none" else ("A" if (choice == "a") != swapped else "B")
                assert store.vote(rater, pair_id, q, answer, rng.randint(300, 5000)) == ("recorded", choice)
    votes = store.all_votes()
    store.close()
    return root / "study", {"votes": votes}


def rows_as_json(rows: list[dict]) -> list[dict]:
    """CSV rows with the JSON export's types (CSV has only strings) and text as stored: the CSV puts a ``'``
    before text a spreadsheet would run as a formula (a pair id can start with ``-``)."""
    from models.common import FORMULA_STARTS

    def stored(value: str) -> str:
        return value[1:] if value.startswith("'") and value[1:].startswith(FORMULA_STARTS) else value

    ints = ("vote_id", "prompt_index", "image_index", "client_ms", "server_ms")
    return [{k: (int(v) if k in ints and v != "" else stored(v)) for k, v in row.items()} for row in rows]


def test_report_writes_results_exports_and_chart(rated_study, tmp_path):
    folder, data = rated_study
    study = load_study(folder)
    r = run_dwb("human-eval", "report", str(folder), "--out", str(tmp_path / "out"), "--bootstrap", "300",
                "--covariates", "all")
    assert r.returncode == 0, r.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    votes = data["votes"]
    # for joining with automated metrics: each model's checkpoint hash, each image's manifest metrics
    assert {m: i["checkpoint_hash"] for m, i in results["model_info"].items()} == {
        model_secrets(name)["model"]: model_secrets(name)["checkpoint_hash"] for name in STRENGTH}
    assert all(isinstance(image.metrics["clip_score"], float) for image in study.images.values()
               if image.model != GOLD_MODEL)
    stop = results["stopping"]
    assert stop["main_votes"] == results["counts"]["main_votes"] and stop["allocation"] == "uniform"
    assert stop["predicted_votes"]["adaptive"] <= stop["predicted_votes"]["uniform"]
    assert "stopping rule" in r.stdout
    for q, control in results["style_control"].items():
        assert control["covariates"][:2] == ["brightness", "saturation"] and "pixels" in control["constant"]  # all 8x8
        assert sorted(control["covariates"] + control["constant"]) == sorted(COVARIATES)
        assert [m["model"] for m in control["models"]] == study.models
        assert len(control["coefficients"]) == len(control["covariates"])

    # the numbers, recomputed from the raw votes
    main = [v for v in votes if study.by_id[v["pair_id"]].kind == "main"]
    for c in results["comparisons"]:
        mine = [v for v in main if v["question"] == c["question"]
                and study.models_of(study.by_id[v["pair_id"]]) == (c["model_a"], c["model_b"])]
        count = Counter(v["choice"] for v in mine)
        assert (c["wins_a"], c["wins_b"], c["ties"]) == (count["a"], count["b"], count["none"])
        assert c["rate_a"] == pytest.approx(count["a"] / (count["a"] + count["b"]))
        assert c["wilson"] == pytest.approx(list(wilson_interval(count["a"], count["a"] + count["b"])))
        assert c["sign_test_p"] == pytest.approx(sign_test(count["a"], count["b"]))
        for name in ("bootstrap_prompt", "bootstrap_rater", "two_way"):
            lo, hi = c[name]
            assert lo < c["rate_a"] < hi
        assert sum(cat["votes"] for cat in c["categories"]) == c["votes"]
        assert {cat["category"] for cat in c["categories"]} <= {p.category for p in study.prompts}
        assert c["plan"]["decisive_needed_worst_case"] > 300
    rates = {(c["question"], c["model_a"].split("-")[0], c["model_b"].split("-")[0]): c["rate_a"]
             for c in results["comparisons"]}
    assert rates[("quality", "alpha", "gamma")] > 0.7  # simulated: 1 / (1 + e^-1.5) = 0.82
    for q, rows in results["bradley_terry"].items():
        ranked = [row["model"].split("-")[0] for row in sorted(rows, key=lambda row: row["rank"])]
        assert ranked == ["alpha", "beta", "gamma"]
    assert results["gold"]["failing_raters"] == ["careless"]
    assert results["consistency"]["repeats"] > 0
    assert all(a["units_rated_twice_or_more"] > 0 for a in results["agreement"].values())

    # exports: every vote, named by model; one results row per question, pair and category
    with open(tmp_path / "out" / "votes.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(votes)
    assert {row["rater_label"] for row in rows} == {row["rater"] for row in rows}  # stored without labels: the id
    for row in rows:
        expected = {"a": row["model_a"], "b": row["model_b"], "none": ""}[row["choice"]]
        assert row["preferred_model"] == expected
        shown = {"A": row["left_model"], "B": row["right_model"], "none": ""}[row["answer"]]
        assert shown == expected  # the clicked side holds the preferred model
    assert json.loads((tmp_path / "out" / "votes.json").read_text()) == rows_as_json(rows)
    with open(tmp_path / "out" / "results.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == sum(1 + len(c["categories"]) for c in results["comparisons"])
    with Image.open(tmp_path / "out" / "preference.png") as im:
        assert im.format == "PNG" and im.width > 800
        assert np.asarray(im.convert("L")).std() > 20  # a drawn chart, not a blank canvas
    assert "Bradley-Terry" in r.stdout and "gold checks" in r.stdout and "careless" in r.stdout
    for rows in results["bradley_terry"].values():  # a score clear of 0 says how many votes would flip it, greedily
        for row in rows:
            clear = row["interval"][0] > 0 or row["interval"][1] < 0
            assert (row["flip"] is not None) == clear
            if clear:
                assert not row["flip"]["exact"] and len(row["flip"]["votes"]) == row["flip"]["count"]
                assert f"[{row['interval'][0]:+.2f}, {row['interval'][1]:+.2f}] (flips without at most " \
                       f"{row['flip']['count']} of its votes)" in r.stdout
    assert any(row["flip"] for rows in results["bradley_terry"].values() for row in rows)  # alpha's, at least


def test_failing_raters_can_be_excluded(rated_study):
    folder, data = rated_study
    study = load_study(folder)
    kept = analyze(study, data["votes"], n_boot=100)
    dropped = analyze(study, data["votes"], n_boot=100, exclude_failing=True)
    careless_main = sum(v["rater_id"] == "careless" and study.by_id[v["pair_id"]].kind == "main" for v in data["votes"])
    assert careless_main > 0
    assert dropped["counts"]["excluded_raters"] == ["careless"]
    assert dropped["counts"]["main_votes"] == kept["counts"]["main_votes"] - careless_main
    assert next(r for r in dropped["raters"] if r["rater"] == "careless")["excluded"] is True
    assert next(r for r in kept["raters"] if r["rater"] == "careless")["gold_pass_rate"] == 0


def test_report_errors_are_one_line(rated_study, tmp_path):
    folder, _ = rated_study
    r = run_dwb("human-eval", "report", str(folder), "--db", str(tmp_path / "none.sqlite"))
    assert r.returncode == 1 and r.stderr.strip() == f"error: no votes database at {tmp_path / 'none.sqlite'} " \
                                                     "(serve the study first, or pass --db)"
    r = run_dwb("human-eval", "report", str(tmp_path / "nothing"))
    assert r.returncode == 1 and "no study in" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_dwb("human-eval", "report", str(folder), "--target-width", "2")
    assert r.returncode == 2 and "between 0 and 1" in r.stderr


def test_the_stopping_rule_reads_the_interval_the_report_shows(rated_study):
    """A comparison the rule calls settled has, in the report, an interval clear of 50% or narrower than the target."""
    folder, data = rated_study
    results = analyze(load_study(folder), data["votes"], n_boot=200, target_width=0.3)
    for c in results["comparisons"]:
        lo, hi = c["clustered_wilson"]
        rule = settled(c["wins_a"], c["decisive"], 0.3, c["design_effect"])
        assert rule == (lo > 0.5 or hi < 0.5 or hi - lo < 0.3), c
        assert (lo > 0.5 or hi < 0.5) == (c["score_test_p"] < 0.05)
    lines = summary(results).splitlines()
    planner = next(line for line in lines if line.startswith("votes for a 0.30-wide interval"))
    assert "settled sooner" in planner and any(line.startswith("stopping rule") for line in lines)


def test_three_votes_for_one_model_name_it_first_with_an_honest_interval(tmp_path):
    samples = []
    for i, name in enumerate(("alpha", "beta")):
        samples += read_manifest(write_samples(tmp_path / name, name, drawbench()[:3], 1, size=8, seed=i))
    build_study(samples, tmp_path / "study", seed=1, progress=False)
    study = load_study(tmp_path / "study")
    store = Store(database_url(tmp_path / "study" / "votes.sqlite"), study.id)
    for r, pair in enumerate(p for p in study.pairs if p.kind == "main"):  # three raters, model b every time
        store.add_rater(f"r{r}")
        store.show(f"r{r}", pair.id, False)
        assert store.vote(f"r{r}", pair.id, "quality", "B", 500) == ("recorded", "b")
    results = analyze(study, store.all_votes(), n_boot=200)
    store.close()
    [c] = [c for c in results["comparisons"] if c["question"] == "quality"]
    assert c["rate_a"] == 0.0 and c["two_way"] == [0.0, 0.0]  # a bootstrap has no spread to show
    lo, hi = c["clustered_wilson"]
    assert 0.0 <= lo < hi <= 1.0 and hi > 0.5  # 3 votes cannot rule out 50%
    [line] = [line for line in summary(results).splitlines() if line.strip().startswith("quality") and "share" in line]
    winner, loser = c["model_b"], c["model_a"]
    assert line.split(":")[0].split() == ["quality", winner, "vs", loser]  # the winner first
    assert f"{winner}'s share of 3 decisive votes 100" in line
    assert "cannot tell yet" in line


def test_a_report_of_unanimous_votes_draws_its_chart(tmp_path):
    """Every rater picks the same model on every pair: the Bradley-Terry replicates all fit the same wins, so
    their interval has no width and the score must still lie inside it (the chart's error bars were negative
    by the fit's rounding, and matplotlib refused to draw them)."""
    samples = []
    for i, name in enumerate(("alpha", "beta", "gamma")):
        samples += read_manifest(write_samples(tmp_path / name, name, drawbench()[:4], 1, size=8, seed=i))
    build_study(samples, tmp_path / "study", seed=1, progress=False)
    study = load_study(tmp_path / "study")
    store = Store(database_url(tmp_path / "study" / "votes.sqlite"), study.id)
    rank = {m: i for i, m in enumerate(sorted(study.models))}  # the first model wins every pair it is in
    store.add_rater("r0")
    for pair in (p for p in study.pairs if p.kind == "main"):
        store.show("r0", pair.id, False)
        a, b = study.models_of(pair)
        for q in study.question_ids:
            store.vote("r0", pair.id, q, "A" if rank[a] < rank[b] else "B", 500)
    store.close()
    run = run_dwb("human-eval", "report", str(tmp_path / "study"), "--bootstrap", "50")
    assert run.returncode == 0, run.stderr
    results = json.loads(next((tmp_path / "study").rglob("results.json")).read_text())
    for rows in results["bradley_terry"].values():
        assert all(r["interval"][0] <= r["score"] <= r["interval"][1] for r in rows)
