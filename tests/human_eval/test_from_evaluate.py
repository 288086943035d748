"""From `dwb evaluate run` to a vote: two checkpoints scored on a prompt file that repeats a line, a study
created from the manifests evaluate wrote, and a vote taken through the API; every step a real `dwb` process."""
import csv
import json
import sqlite3

import httpx
import numpy as np
import pytest
from PIL import Image

from human_eval.samples import prompt_set_id
from human_eval.study import load_study

from ..conftest import run_dwb
from .conftest import Server, start_rater

PROMPTS = ["two blue circles", "one red square", "two blue circles", "a green triangle left of a red square",
           "two blue circles"]  # "two blue circles" is three prompts, as in the demo's held-out captions


def pixels(path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


@pytest.mark.slow
def test_evaluate_manifests_with_a_repeated_prompt_become_a_study_that_takes_votes(tiny_run, shapes_data,
                                                                                  inception_weights, tmp_path):
    prompt_file = tmp_path / "prompts.csv"
    with prompt_file.open("w", newline="") as f:
        csv.writer(f).writerows([("prompt", "category"), *((p, "shapes") for p in PROMPTS)])
    out = tmp_path / "eval"
    r = run_dwb("evaluate", "run", str(tiny_run / "ep0-ba2-rank0.pt"), str(tiny_run / "ep0-ba4-rank0.pt"),
                "--out", str(out), "--reference", str(shapes_data / "eval/32"), "--inception-weights",
                str(inception_weights), "--inception-features", "64", "--prompts", str(prompt_file), "--n-reference", "16",
                "--guidance", "4", "--steps", "2", "--size", "16", "--kid-subsets", "2", "--kid-subset-size", "4",
                "--device", "cpu", "--batch-size", "8")
    assert r.returncode == 0, r.stderr[-3000:]
    manifests = sorted(out.glob("samples/*/cfg4/manifest.jsonl"))
    assert len(manifests) == 2
    lines = [[json.loads(line) for line in m.read_text().splitlines()] for m in manifests]
    assert [row["prompt"] for row in lines[0]] == PROMPTS and len({row["prompt_set"] for m in lines for row in m}) == 1

    study_dir = tmp_path / "study"
    r = run_dwb("human-eval", "create", str(study_dir), *(a for m in manifests for a in ("--samples", str(m))))
    assert r.returncode == 0, r.stderr
    assert "2 models, 5 prompts, 5 pairs" in r.stdout
    study = load_study(study_dir)
    assert [(p.index, p.text) for p in study.prompts] == list(enumerate(PROMPTS))
    source = {(row["model"], row["prompt_index"]): m.parent / row["path"] for m, rows in zip(manifests, lines)
              for row in rows}
    for pair in study.pairs:  # each pair shows the two checkpoints' images of its own prompt
        for token in (pair.a, pair.b):
            image = study.images[token]
            original = source[image.model, study.prompts[pair.prompt].index]
            assert np.array_equal(pixels(study_dir / image.file), pixels(original))

    # a folder named <prompt_index>_<image_index>.png with the same prompt CSV pairs with evaluate's manifest
    folder = tmp_path / "folder-model"
    folder.mkdir()
    for row in lines[1]:
        Image.open(manifests[1].parent / row["path"]).save(folder / f"{row['prompt_index']}_{row['image_index']}.png")
    assert lines[0][0]["prompt_set"] == prompt_set_id(PROMPTS)
    r = run_dwb("human-eval", "create", str(tmp_path / "mixed"), "--samples", str(manifests[0]), "--folder", str(folder),
                "--prompts", str(prompt_file))
    assert r.returncode == 0 and "2 models, 5 prompts, 5 pairs" in r.stdout, r.stdout + r.stderr

    with Server(study_dir) as server, httpx.Client(base_url=server.url) as c:
        rater = start_rater(c, "first-rater")
        p = c.get("/api/next", params={"rater": rater}).json()
        assert p["prompt"] in PROMPTS
        vote = c.post("/api/vote", json={"rater": rater, "pair": p["pair"], "question": "quality", "answer": "B"})
        assert vote.json() == {"recorded": True}
    with sqlite3.connect(study_dir / "votes.sqlite") as conn:
        assert conn.execute("SELECT rater_id, pair_id, answer FROM votes").fetchall() == [(rater, p["pair"], "B")]

    # the report beside evaluate's rows: each model finds its own row by checkpoint hash
    r = run_dwb("human-eval", "report", str(study_dir), "--results", str(out), "--bootstrap", "50")
    assert r.returncode == 0, r.stderr
    joined = json.loads((study_dir / "report" / "joined.json").read_text())
    rows = {json.loads(line)["checkpoint_hash"]: json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()}
    assert joined["notes"] == [] and len(joined["table"]) == 2
    for model in joined["table"]:
        row = rows[model["checkpoint_hash"]]
        assert model["row"]["checkpoint"] == row["checkpoint"] and model["metrics"]["fid"]["value"] == row["fid"]
        assert model["metrics"]["fid"]["lo"] == row["fid_lo"] and model["row"]["sampler"] == row["sampler"]
