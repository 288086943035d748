"""`dwb human-eval` as users run it: create from manifests or folders, serve, and one-line errors."""
import json
import shutil
import socket

import httpx
import numpy as np
from PIL import Image

from ..conftest import run_dwb
from .conftest import Server, drawbench, free_port, model_secrets, start_rater, write_samples


def one_line_error(r, needle: str) -> None:
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_help_lists_the_commands():
    out = run_dwb("human-eval", "--help").stdout
    for command in ("create", "serve", "report"):
        assert command in out
    assert "human-eval" in run_dwb("--help").stdout


def test_create_from_manifests_with_labels(tmp_path):
    prompts = drawbench(5)
    a = write_samples(tmp_path / "a", "a", prompts, 2, seed=1)
    b = write_samples(tmp_path / "b", "b", prompts, 2, seed=2)
    r = run_dwb("human-eval", "create", str(tmp_path / "study"), "--samples", f"ours={a}", "--samples", str(b),
                "--gold", "2", "--repeats", "1", "--per-rater", "5", "--images-per-prompt", "1")
    assert r.returncode == 0, r.stderr
    assert "2 models, 5 prompts, 5 pairs" in r.stdout and "2 gold, 1 repeated" in r.stdout
    data = json.loads((tmp_path / "study" / "study.json").read_text())
    assert data["models"] == ["ours", model_secrets("b")["model"]] and data["per_rater"] == 5
    assert len(data["pairs"]) == 8 and {p["image_index"] for p in data["pairs"]} == {0}


def test_create_from_folders_and_a_shipped_prompt_set(tmp_path):
    for name, seed in (("sd2", 1), ("ours", 2)):
        (tmp_path / name).mkdir()
        rng = np.random.default_rng(seed)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / name / f"{i}_0.png")
    r = run_dwb("human-eval", "create", str(tmp_path / "study"), "--folder", str(tmp_path / "sd2"),
                "--folder", f"mine={tmp_path / 'ours'}", "--prompts", "drawbench")
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "study" / "study.json").read_text())
    assert data["models"] == ["sd2", "mine"] and len(data["pairs"]) == 3
    assert [p["category"] for p in data["prompts"]] == ["Colors"] * 3


def test_create_errors_are_one_line(tmp_path, dwb):
    a = write_samples(tmp_path / "a", "a", drawbench(2), 1)
    one_line_error(dwb("human-eval", "create", str(tmp_path / "s"), "--samples", str(tmp_path / "nope.jsonl")),
                   f"manifest not found: {tmp_path / 'nope.jsonl'}")
    one_line_error(dwb("human-eval", "create", str(tmp_path / "s")), "nothing to compare")
    one_line_error(dwb("human-eval", "create", str(tmp_path / "s"), "--folder", str(tmp_path)), "--folder needs --prompts")
    one_line_error(dwb("human-eval", "create", str(tmp_path / "s"), "--samples", str(a)), "two or more models")
    (tmp_path / "broken.jsonl").write_text('{"prompt": "x", "image_index": 0}\n')
    one_line_error(dwb("human-eval", "create", str(tmp_path / "s"), "--samples", str(tmp_path / "broken.jsonl")),
                   "broken.jsonl:1: missing key 'path'")
    r = dwb("human-eval", "create", str(tmp_path / "s"), "--samples", str(a), "--gold", "-1")
    assert r.returncode == 2 and "non-negative" in r.stderr
    assert not (tmp_path / "s" / "study.json").exists()


def test_serve_errors_are_one_line(two_model_study, tmp_path):
    one_line_error(run_dwb("human-eval", "serve", str(tmp_path / "none")), "no study in")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        one_line_error(run_dwb("human-eval", "serve", str(two_model_study), "--port", str(port)),
                       f"cannot listen on 127.0.0.1:{port}")
    # a database that belongs to another study is refused, so votes never land on the wrong pairs
    other = tmp_path / "other"
    shutil.copytree(two_model_study, other, ignore=shutil.ignore_patterns("votes.sqlite*", "admin_token"))
    data = json.loads((other / "study.json").read_text())
    data["id"] = "another-study"
    (other / "study.json").write_text(json.dumps(data))
    from human_eval.store import Store, database_url
    from human_eval.study import load_study

    Store(database_url(two_model_study / "votes.sqlite"), load_study(two_model_study).id).close()  # the first study's
    one_line_error(run_dwb("human-eval", "serve", str(other), "--db", str(two_model_study / "votes.sqlite"),
                           "--port", str(free_port())), "holds the votes of another study")


def test_two_instances_share_one_store(two_model_study):
    """Several server instances on one database: a rater can move between them mid-pair."""
    with Server(two_model_study) as one, Server(two_model_study) as two:
        with httpx.Client(base_url=one.url) as c1, httpx.Client(base_url=two.url) as c2:
            traveller = start_rater(c1, "traveller")
            c2.headers["X-Rater-Key"] = c1.headers["X-Rater-Key"]  # one browser, two instances behind a balancer
            p = c2.get("/api/next", params={"rater": traveller}).json()
            c2.post("/api/vote", json={"rater": traveller, "pair": p["pair"], "question": "quality", "answer": "B"})
            again = c1.get("/api/next", params={"rater": traveller}).json()
            assert (again["pair"], again["images"], again["answered"]) == (p["pair"], p["images"], {"quality": "B"})
            r = c1.post("/api/vote", json={"rater": traveller, "pair": p["pair"], "question": "quality", "answer": "A"})
            assert r.status_code == 409
