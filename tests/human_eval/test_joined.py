"""Humans beside metrics: a study joined to an evaluate results store by checkpoint hash, each metric's agreement
with raters (model pairs and image pairs), win rates per category, and the page `dwb human-eval report --results` writes."""
import csv
import json
import re
from html import escape
from pathlib import Path

import numpy as np
import pytest

from human_eval.analysis import analyze
from human_eval.joined import (PromptTable, category_win_rates, humans_beside_metrics, image_pair_agreement,
                               model_pair_agreement)
from human_eval.joined_page import page
from human_eval.report import both_bad_text, summary, votes_flip_text
from human_eval.samples import read_manifest
from human_eval.scores import join_scores, match_row, read_scores
from human_eval.store import Store, database_url
from human_eval.study import build_study, load_study

from ..conftest import run_dwb
from .conftest import cast_tie_votes, drawbench, model_secrets, write_samples

NAMES = ("m0", "m1", "m2", "m3")  # better with each step: mean CLIP score +0.02, FID -8 and FD-DINOv2 -30 a step
QUESTIONS = ("quality", "alignment")
CATEGORIES = ("Colors", "Counting", "Positional", "Text")  # DrawBench's; 5 prompts of each


def metrics_manifest(manifest: Path, step: int, rng: np.random.Generator) -> Path:
    """`write_samples`' manifest with evaluate's per-image values: a CLIP score that rises with `step`, attr_all."""
    lines = [json.loads(line) for line in manifest.read_text().splitlines()]
    for line in lines:
        line["clip_score"] = round(0.26 + 0.02 * step + float(rng.normal(0, 0.03)), 4)
        line["attr_all"] = bool(rng.random() < 0.3 + 0.15 * step) if line["prompt_index"] % 4 else None
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return manifest


def evaluate_row(name: str, step: int, clip: float, **extra) -> dict:
    """One results.jsonl row as `dwb evaluate run` writes it, with intervals; CMMD deliberately ranks backwards."""
    ids = model_secrets(name)
    row = {"model": ids["model"], "checkpoint": ids["checkpoint"], "checkpoint_hash": ids["checkpoint_hash"],
           "step": 1000 * (step + 1), "guidance": 7.5, "sampler": ids["scheduler"], "n_images": 20, "status": "ok",
           "fid": 60.0 - 8 * step, "fid_lo": 55.0 - 8 * step, "fid_hi": 66.0 - 8 * step, "fid_infinity": 52.0 - 8 * step,
           "fd_dinov2": 400.0 - 30 * step, "fd_dinov2_lo": 380.0 - 30 * step, "fd_dinov2_hi": 425.0 - 30 * step,
           "clip_score": clip, "clip_score_lo": clip - 0.01, "clip_score_hi": clip + 0.01,
           "cmmd": 0.5 + 0.1 * step, "cmmd_lo": 0.45 + 0.1 * step, "cmmd_hi": 0.56 + 0.1 * step,
           "kid_mean": 0.02 - 0.004 * step, "precision": 0.6, "recall": 0.4, "time": 1.7e9 + step}
    return {**row, **extra}


@pytest.fixture(scope="module")
def clip_study(tmp_path_factory) -> tuple[Path, Path]:
    """Four models on 20 DrawBench prompts of 4 categories, and an evaluate store scoring three of them."""
    root = tmp_path_factory.mktemp("joined")
    rng = np.random.default_rng(7)
    samples, clip = [], {}
    prompts = [p for c in CATEGORIES for p in [p for p in drawbench() if p[1] == c][:5]]
    for step, name in enumerate(NAMES):
        manifest = metrics_manifest(write_samples(root / name, name, prompts, 1, size=8, seed=step), step, rng)
        samples += read_manifest(manifest)
        clip[name] = float(np.mean([json.loads(line)["clip_score"] for line in manifest.read_text().splitlines()]))
    build_study(samples, root / "study", gold=2, seed=0, progress=False)
    rows = [evaluate_row(n, k, clip[n]) for k, n in enumerate(NAMES[:3])]  # m3 was never scored
    rows.append(evaluate_row("m0", 0, clip["m0"], guidance=3.0, fid=999.0))  # another guidance of m0's checkpoint
    rows.append(evaluate_row("m1", 1, clip["m1"], sampler="OtherSampler", fid=777.0))  # another sampler of m1's
    rows.append({"checkpoint": "/ckpts/broken.pt", "status": "unreadable", "error": "truncated"})
    (root / "eval").mkdir()
    (root / "eval" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"model": "cut sh')
    return root / "study", root / "eval"


def votes_by(study, choose, raters: int = 3) -> list[dict]:
    """Every main pair voted by each rater on both questions; `choose(pair)` returns 'a', 'b' or 'none'."""
    return [{"pair_id": p.id, "rater_id": f"r{r}", "question": q, "choice": choose(p)}
            for p in study.pairs if p.kind == "main" for r in range(raters) for q in QUESTIONS]


def higher_clip(study):
    return lambda p: "a" if study.images[p.a].metrics["clip_score"] > study.images[p.b].metrics["clip_score"] else "b"


def test_votes_that_follow_clip_score_agree_with_it(clip_study):
    folder, eval_out = clip_study
    study = load_study(folder)
    joined = humans_beside_metrics(study, votes_by(study, higher_clip(study)), read_scores([eval_out]), n_boot=300)
    for q in QUESTIONS:
        image = {x["metric"]: x for x in joined["agreement"][q]["image_pairs"]}
        assert image["clip_score"]["agreement"] == 1.0 and image["clip_score"]["interval"] == [1.0, 1.0]
        assert image["clip_score"]["votes"] == 3 * 6 * 20  # raters x model pairs x prompts
        pairs = {x["metric"]: x for x in joined["agreement"][q]["model_pairs"]}
        assert pairs["clip_score"]["source"] == "study images" and pairs["clip_score"]["model_pairs"] == 6
        assert pairs["clip_score"]["agreement"] == 1.0 and pairs["clip_score"]["interval"][0] >= 0.75
        # set metrics come from the rows of the three scored models (3 model pairs): FID agrees, CMMD is backwards
        assert pairs["fid"]["source"] == "evaluate rows" and pairs["fid"]["model_pairs"] == 3
        assert pairs["fid"]["agreement"] == 1.0 and pairs["fd_dinov2"]["agreement"] == 1.0
        assert pairs["cmmd"]["agreement"] == 0.0 and pairs["cmmd"]["interval"][1] < 0.5
        assert [p["agrees"] for p in pairs["cmmd"]["pairs"]] == [0.0, 0.0, None, 0.0, None, None]  # m3: no row
        assert pairs["precision"]["agreement"] == 0.5  # equal for every model: a tie on every pair
        # attribute accuracy per image: the study keeps evaluate's true/false, null does not count
        assert pairs["attr_all_all"]["source"] == "study images"


def test_shuffled_votes_agree_half_the_time(clip_study):
    folder, _ = clip_study
    study = load_study(folder)
    follow = votes_by(study, higher_clip(study), raters=1)
    rng = np.random.default_rng(3)
    image_shares, pair_shares, covered = [], [], 0
    for _ in range(20):
        flip = rng.random(len(follow)) < 0.5  # each vote's choice kept or turned round at random
        votes = [{**v, "choice": {"a": "b", "b": "a"}[v["choice"]] if f else v["choice"]} for v, f in zip(follow, flip)]
        image = {x["metric"]: x for x in image_pair_agreement(votes, study, 200, rng)}["clip_score"]
        covered += image["interval"][0] < 0.5 < image["interval"][1]
        image_shares.append(image["agreement"])
        pairs = {x["metric"]: x for x in model_pair_agreement(PromptTable(study, votes), {}, 100, rng)}
        pair_shares.append(pairs["clip_score"]["agreement"])
    assert abs(np.mean(image_shares) - 0.5) < 0.05 and covered >= 16  # a 95% interval: 19 of 20 expected
    assert abs(np.mean(pair_shares) - 0.5) < 0.15


def test_join_uses_checkpoint_hashes_not_labels(clip_study, tmp_path):
    folder, eval_out = clip_study
    study = load_study(folder)
    # a second store names m0's checkpoint "m1" and m1's "m0": the hashes still decide
    rows = [json.loads(line) for line in (eval_out / "results.jsonl").read_text().splitlines()[:2]]
    rows[0]["model"], rows[1]["model"] = rows[1]["model"], rows[0]["model"]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    joined, notes = join_scores(study, read_scores([tmp_path]))
    m = {name: model_secrets(name)["model"] for name in NAMES}
    assert joined[m["m0"]]["fid"] == 60.0 and joined[m["m1"]]["fid"] == 52.0
    assert joined[m["m2"]] is None and joined[m["m3"]] is None
    assert any(m["m3"] in n and "no evaluate row with checkpoint hash" in n for n in notes)
    # of m0's two rows, the one at the study's guidance (7.5, not 3.0)
    joined, notes = join_scores(study, read_scores([eval_out]))
    assert joined[m["m0"]]["guidance"] == 7.5 and joined[m["m0"]]["fid"] == 60.0
    assert joined[m["m1"]]["sampler"] == model_secrets("m1")["scheduler"] and joined[m["m1"]]["fid"] == 52.0
    assert any("2 lines of the results were not used" in n for n in notes)  # the unreadable row and the torn line
    # images from a folder carry no hash; one label over two checkpoints has no single row
    scores = read_scores([eval_out])
    assert match_row("folder-model", {"guidance": 7.5}, scores.rows) == (
        None, "folder-model: no checkpoint hash in its samples (images from a folder?), so no metrics")
    assert match_row("mixed", {"checkpoint_hash": "aa,bb"}, scores.rows)[0] is None


def test_win_rates_per_category_with_intervals(clip_study):
    folder, _ = clip_study
    study = load_study(folder)
    m0, m1 = model_secrets("m0")["model"], model_secrets("m1")["model"]
    categories = sorted({p.category for p in study.prompts})
    strong = categories[0]  # m0 wins every vote on its prompts, loses every other vote against m1

    def choose(p):
        a, b = study.models_of(p)
        if {a, b} != {m0, m1}:
            return "none"
        won = m0 if study.prompts[p.prompt].category == strong else m1
        return "a" if a == won else "b"

    rows = category_win_rates([v for v in votes_by(study, choose) if v["question"] == "quality"], study, 300,
                              np.random.default_rng(0))
    by = {(r["category"], r["model"]): r for r in rows}
    assert {c for c, _ in by} == set(categories)
    n_strong = sum(p.category == strong for p in study.prompts)
    assert by[strong, m0]["win_rate"] == 1.0 and by[strong, m0]["decisive"] == 3 * n_strong
    assert by[strong, m0]["bootstrap_prompt"] == (1.0, 1.0) and 0.5 < by[strong, m0]["wilson"][0] < 1.0
    for c in categories[1:]:
        assert by[c, m0]["win_rate"] == 0.0 and by[c, m1]["win_rate"] == 1.0
    assert np.isnan(by[strong, model_secrets("m2")["model"]]["win_rate"])  # no decisive vote: no rate
    few = [v for v in votes_by(study, choose) if study.by_id[v["pair_id"]].prompt < 2 and v["question"] == "quality"]
    two = {(r["category"], r["model"]): r for r in category_win_rates(few, study, 300, np.random.default_rng(0))}
    assert np.isnan(two[strong, m0]["bootstrap_prompt"][0]) and two[strong, m0]["wilson"][0] > 0.5  # 2 prompts: Wilson


def test_report_with_results_writes_the_joined_page(clip_study, tmp_path):
    folder, eval_out = clip_study
    study = load_study(folder)
    store = Store(database_url(folder / "votes.sqlite"), study.id)
    store.add_rater("r0")
    for p in study.pairs:
        store.show("r0", p.id, False)
        for q in QUESTIONS:
            choice = higher_clip(study)(p) if p.kind == "main" else p.gold
            store.vote("r0", p.id, q, {"a": "A", "b": "B"}[choice], 900)
    store.close()
    r = run_dwb("human-eval", "report", str(folder), "--results", str(eval_out), "--out", str(tmp_path / "out"),
                "--bootstrap", "200")
    assert r.returncode == 0, r.stderr
    m3 = model_secrets("m3")["model"]
    assert "CLIP score orders 100.0%" in r.stdout and f"note: {m3}: no evaluate row" in r.stdout
    html = (tmp_path / "out" / "joined.html").read_text()
    assert all(model_secrets(n)["model"] in html for n in NAMES)
    assert "<th>FID [95%]</th>" in html and "60 [55, 66]" in html and "400 [380, 425]" in html  # m0's FID, FD-DINOv2
    assert "no row" in html and f"{m3}: no evaluate row with checkpoint hash" in html
    m = [model_secrets(n)["model"] for n in NAMES]
    assert f"<td>{m[0]} vs {m[1]}; {m[0]} vs {m[2]}; {m[1]} vs {m[2]}</td>" in html  # CMMD orders all three backwards
    assert "Win rate per category" in html and study.prompts[0].category in html
    with open(tmp_path / "out" / "joined_models.csv") as f:
        models = list(csv.DictReader(f))
    assert len(models) == 2 * len(NAMES)
    row = next(x for x in models if x["model"] == model_secrets("m1")["model"] and x["question"] == "quality")
    assert float(row["fid"]) == 52.0 and float(row["fid_lo"]) == 47.0 and float(row["win_rate_lo"]) <= float(row["win_rate"])
    joined = json.loads((tmp_path / "out" / "joined.json").read_text())
    assert joined["table"][3]["metrics"] == {}
    assert (tmp_path / "out" / "joined_agreement.csv").read_text().count("\n") > 10
    flips = {(r["model"], q): votes_flip_text(r["human"][q]["flip"]) for r in joined["table"] for q in QUESTIONS}
    assert any(flips.values()) and "both_bad" not in joined and "Both bad" not in html  # ties are one answer here
    for (model, q), shown in flips.items():  # the page's "votes that would flip it", to the digit of the JSON's
        cells = re.findall(r"<td>(.*?)</td>", re.search(rf"<tr><td>{re.escape(escape(model))}</td>(.*?)</tr>",
                                                         _question_section(html, q)).group(1))
        assert cells[2] == escape(shown)


def _question_section(html: str, q: str) -> str:
    return html.split(f"<h2>{q}: ")[1].split("<h2>")[0]


def test_the_joined_page_gives_the_both_bad_shares_of_the_report(good_bad_study, clip_study, tmp_path):
    """A good_bad study: joined.json's both-bad shares are the report's, and the page shows each model's share per
    category and the prompts most often judged both bad, in the digits of the report's text."""
    study = load_study(good_bad_study)
    store = Store(database_url(tmp_path / "votes.sqlite"), study.id)
    cast_tie_votes(store, study)
    votes = store.all_votes()
    store.close()
    results = analyze(study, votes, n_boot=50)
    joined = humans_beside_metrics(study, votes, read_scores([clip_study[1]]), n_boot=50)
    assert joined["ties"] == "good_bad" and joined["both_bad"] == results["both_bad"]
    html, text = page(joined), summary(results)
    for q, found in joined["both_bad"].items():
        section = _question_section(html, q)
        assert section.count("<h3>Both bad</h3>") == 1 and found["prompts"]
        for r in found["models"]:
            shown = both_bad_text(r)
            assert (f"<tr><td>{escape(r['model'])}</td><td>{escape(r['category'])}</td><td>{r['votes']}</td>"
                    f"<td>{r['both_bad']}</td><td>{escape(shown)}</td></tr>") in section
            assert (f"both bad, {r['model']}: {shown}" if r["category"] == "all" else f"{r['category']} {shown}") in text
        for p in found["prompts"]:
            assert (f"<tr><td>{escape(p['text'])}</td><td>{escape(p['category'])}</td><td>{p['both_bad']}</td>"
                    f"<td>{p['votes']}</td></tr>") in section
            assert f"{json.dumps(p['text'])} ({p['both_bad']} of {p['votes']} votes)" in text


def test_labels_from_files_are_escaped_on_the_page(clip_study, tmp_path):
    from human_eval.joined_page import page

    folder, eval_out = clip_study
    study = load_study(folder)
    attack = "<script>alert(1)</script>"
    study.models[0] = attack
    study.model_info[attack] = study.model_info[model_secrets("m0")["model"]]
    for token, image in study.images.items():
        if image.model == model_secrets("m0")["model"]:
            study.images[token] = type(image)(**{**image.__dict__, "model": attack})
    html = page(humans_beside_metrics(study, votes_by(study, higher_clip(study), 1), read_scores([eval_out]), n_boot=50))
    assert attack not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_results_folder_without_a_store_is_a_one_line_error(clip_study, tmp_path):
    folder, _ = clip_study
    r = run_dwb("human-eval", "report", str(folder), "--results", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"))
    assert r.returncode != 0 and "no evaluate results at" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def _as_older_version(record: dict) -> dict:
    """A manifest line, results row or study model info as written before the sampler had one name."""
    record["scheduler"] = record.pop("sampler")
    return record


def test_files_of_an_older_version_say_scheduler_and_still_join(tmp_path):
    """Manifests, a results store and a study.json written when the sampler was called "scheduler": read as
    ``sampler``, so the join still picks each model's row at the study's sampler."""
    samples = []
    for step, name in enumerate(NAMES[:2]):
        manifest = write_samples(tmp_path / name, name, drawbench()[:4], 1, size=8, seed=step)
        lines = [_as_older_version(json.loads(line)) for line in manifest.read_text().splitlines()]
        manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
        samples += read_manifest(manifest)
    assert {s.settings["sampler"] for s in samples} == {model_secrets(n)["scheduler"] for n in NAMES[:2]}
    build_study(samples, tmp_path / "study", seed=0, progress=False)
    path = tmp_path / "study" / "study.json"
    data = json.loads(path.read_text())
    data["model_info"] = {m: _as_older_version(info) for m, info in data["model_info"].items()}
    path.write_text(json.dumps(data))
    rows = [_as_older_version(evaluate_row(n, k, 0.3)) for k, n in enumerate(NAMES[:2])]
    rows.append(_as_older_version(evaluate_row("m0", 0, 0.3, sampler="OtherSampler", fid=777.0, time=1.8e9)))  # newer
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    study = load_study(tmp_path / "study")
    joined, notes = join_scores(study, read_scores([tmp_path / "eval"]))
    m0, m1 = (model_secrets(n)["model"] for n in NAMES[:2])
    assert study.model_info[m0]["sampler"] == model_secrets("m0")["scheduler"]
    assert (joined[m0]["fid"], joined[m1]["fid"]) == (60.0, 52.0) and notes == []
    assert joined[m0]["sampler"] == model_secrets("m0")["scheduler"]
