"""Fixtures for human_eval: sample sets written the way `evaluate` writes them, and a real server process.

Every image carries its generator's settings in PNG text chunks (model, checkpoint, scheduler), the
way diffusion front-ends write them, so tests can check that none of it reaches a rater.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from ..conftest import DWB, PROMPT_SETS, REPO
from ..servers import ServerProcess, free_port

DRAWBENCH = PROMPT_SETS / "drawbench.csv"


def model_secrets(name: str) -> dict:
    """The identifying strings of one synthetic model; none may appear in a rater-facing byte."""
    return {"model": f"{name}-modelname-7f3c", "checkpoint": f"/ckpts/{name}-secretckpt-91ab/ep3-ba800k-rank0.pt",
            "scheduler": f"{name}SecretSchedulerXq", "checkpoint_hash": f"c0ffee{name.encode().hex()[:10]}"}


def write_samples(folder: Path, name: str, prompts: list[tuple[str, str]], images_per_prompt: int = 1,
                  size: int = 32, seed: int = 0, absolute: bool = False, first_index: int = 0) -> Path:
    """A manifest.jsonl with one PNG per prompt and image index; returns the manifest's path.

    `prompts` are rows `first_index`, `first_index` + 1, ... of a prompt list (their prompt_index).
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "samples").mkdir(exist_ok=True)
    ids = model_secrets(name)
    rng = np.random.default_rng(seed)
    lines = []
    for i, (prompt, category) in enumerate(prompts, start=first_index):
        for k in range(images_per_prompt):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            info = PngImagePlugin.PngInfo()
            info.add_text("parameters", f"{prompt}; model: {ids['model']}; checkpoint: {ids['checkpoint']}; "
                                        f"scheduler: {ids['scheduler']}; seed: {1000 + k}")
            info.add_itxt("Software", f"diffusion-workbench {ids['model']}")
            path = folder / "samples" / f"{i:04d}_{k}.png"
            Image.fromarray(pixels).save(path, pnginfo=info)
            lines.append({"prompt": prompt, "prompt_index": i, "category": category, "image_index": k, "seed": 1000 + k,
                          "checkpoint": ids["checkpoint"], "model": ids["model"], "guidance": 7.5,
                          "sampler": ids["scheduler"], "steps": 50, "width": size, "height": size,
                          "path": str(path) if absolute else f"samples/{path.name}", "checkpoint_hash": ids["checkpoint_hash"],
                          "clip_score": round(float(pixels.mean()) / 255, 4)})
    manifest = folder / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return manifest


def photo_like(rng: np.random.Generator, size: int) -> np.ndarray:
    """(size, size, 3) uint8: smooth light, a few hard-edged objects and film grain of random strength.

    Like generated images, these differ in how much detail (and so how many PNG bytes) they hold.
    """
    yy, xx = np.mgrid[0:size, 0:size] / size
    light = rng.uniform(0, 255, (3, 3))
    pixels = light[:, 0] + np.multiply.outer(xx, light[:, 1] - light[:, 0]) + np.multiply.outer(yy, light[:, 2] - 128) / 2
    for _ in range(rng.integers(1, 6)):
        cx, cy, r = rng.uniform(0, 1, 3) * (1, 1, 0.4)
        inside = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
        pixels[inside] = rng.uniform(0, 255, 3)
    pixels += rng.normal(0, rng.uniform(0, 24), pixels.shape)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def drawbench(n: int | None = None) -> list[tuple[str, str]]:
    from human_eval.samples import read_prompts

    prompts = read_prompts("drawbench")
    return prompts if n is None else prompts[:n]


def start_rater(client: httpx.Client, label: str | None = None) -> str:
    """Start a new rater as the page does; the client then sends the rater's key with every request."""
    r = client.post("/api/session", json={"rater": label})
    assert r.status_code == 200, r.text
    client.headers["X-Rater-Key"] = r.json()["key"]
    return r.json()["rater"]


def cookie_attributes(set_cookie: str) -> dict[str, str]:
    """A Set-Cookie header's value and attributes, attribute names in lower case ('' for flags such as secure)."""
    first, *attributes = (part.strip() for part in set_cookie.split(";"))
    return {"value": first.split("=", 1)[1], **{k.lower(): v for k, _, v in (a.partition("=") for a in attributes)}}


class Server(ServerProcess):
    """`dwb human-eval serve STUDY --admin-token TOKEN EXTRA...` on 127.0.0.1, ready when /healthz answers
    (``token=None``: no --admin-token, so the server takes it from the environment or the study's file)."""

    def __init__(self, study: Path, *extra: str, port: int | None = None, token: str | None = "admin-secret-token",
                 env: dict | None = None):
        self.study, self.token = study, token
        port = port or free_port()
        token_args = ["--admin-token", token] if token is not None else []
        super().__init__([DWB, "human-eval", "serve", study, "--port", port, *token_args, *extra], port=port,
                         ready_path="/healthz", cwd=REPO, env=env)


@pytest.fixture(scope="module")
def two_model_study(tmp_path_factory) -> Path:
    """Two models on 12 DrawBench prompts x 2 images, with 2 gold and 2 repeated pairs (28 pairs)."""
    from human_eval.samples import read_manifest
    from human_eval.study import build_study

    root = tmp_path_factory.mktemp("two")
    prompts = drawbench(12)
    samples = read_manifest(write_samples(root / "alpha", "alpha", prompts, 2, seed=1))
    samples += read_manifest(write_samples(root / "beta", "beta", prompts, 2, seed=2))
    build_study(samples, root / "study", gold=2, repeats=2, seed=0, progress=False)
    return root / "study"


TIE_PROMPTS = [("a red cube", "Colors"), ("a blue ball", "Colors"), ("the word cat", "Text"), ("the word dog", "Text")]


@pytest.fixture(scope="module")
def good_bad_study(tmp_path_factory) -> Path:
    """Two models on 4 prompts in two categories, one 16 px image each, with the ties setting good_bad."""
    from human_eval.samples import read_manifest
    from human_eval.study import build_study

    root = tmp_path_factory.mktemp("ties")
    samples = read_manifest(write_samples(root / "alpha", "alpha", TIE_PROMPTS, 1, size=16, seed=1))
    samples += read_manifest(write_samples(root / "beta", "beta", TIE_PROMPTS, 1, size=16, seed=2))
    build_study(samples, root / "study", ties="good_bad", progress=False)
    return root / "study"


def cast_tie_votes(store, study) -> dict[tuple[str, str, str], tuple[str, str]]:
    """Three raters answer every main pair of `study` through the store's own API, both good and both bad among the
    answers, sides alternating; returns (rater, pair, question) -> (answer as displayed, the choice it means)."""
    cast = {}
    answers = ("good", "bad", "A", "bad", "B", "good", "bad")
    for r in range(3):
        rater = f"tie-rater-{r}"
        store.add_rater(rater, label=f"=label{r}")
        for i, pair in enumerate(p for p in study.pairs if p.kind == "main"):
            swapped = (r + i) % 2 == 1
            store.show(rater, pair.id, swapped)
            for j, q in enumerate(study.question_ids):
                answer = answers[(3 * r + 2 * i + j) % len(answers)]
                assert store.vote(rater, pair.id, q, answer, 10)[0] == "recorded"
                choice = answer if answer in ("good", "bad") else "ab"[(answer == "B") != swapped]
                cast[(rater, pair.id, q)] = (answer, choice)
    return cast


def check_tie_round_trip(study, store, cast: dict, out: Path) -> dict:
    """Votes read back from the store, its CSV and JSON exports and the report's files say what was cast; returns the
    results."""
    import csv
    import io

    from human_eval.analysis import analyze
    from human_eval.report import votes_csv, votes_json, write_report

    from models.common.escaping import spreadsheet_cell

    votes = store.all_votes()
    assert {(v["rater_id"], v["pair_id"], v["question"]): (v["answer"], v["choice"]) for v in votes} == cast

    # the CSV's cells as spreadsheet_cell writes them: a random pair id may start like a formula ("-...")
    cast_in_csv = {(r, spreadsheet_cell(p), q): a for (r, p, q), a in cast.items()}
    for rows, expected in ((list(csv.DictReader(io.StringIO(votes_csv(study, votes)))), cast_in_csv),
                           (json.loads(votes_json(study, votes)), cast)):
        assert {(r["rater"], r["pair"], r["question"]): (r["answer"], r["choice"]) for r in rows} == expected
        for r in rows:  # a tie prefers no model; a decisive vote names the one on the chosen side
            side = {"A": r["left_model"], "B": r["right_model"]}.get(r["answer"], "")
            assert r["preferred_model"] == side
    results = analyze(study, votes, n_boot=50)
    paths = write_report(study, votes, results, out)
    assert json.loads(paths["results.json"].read_text()) == results
    for c in results["comparisons"]:
        mine = [a for (_, _, q), a in cast.items() if q == c["question"]]
        good, bad = (sum(choice == kind for _, choice in mine) for kind in ("good", "bad"))
        assert (c["both_good"], c["both_bad"], c["ties"]) == (good, bad, good + bad)
        assert c["decisive"] == len(mine) - good - bad  # win rates leave ties out
    exported = list(csv.DictReader(io.StringIO(paths["both_bad.csv"].read_text())))
    assert [(r["question"], r["model"], r["category"], int(r["both_bad"])) for r in exported] == [
        (q, r["model"], r["category"], r["both_bad"]) for q, found in results["both_bad"].items() for r in found["models"]]
    return results


@contextlib.contextmanager
def serving(folder: Path, store_url: str | None = None):
    """The rating app under uvicorn in a thread of this process, its votes in ``store_url`` (default: the study's
    votes.sqlite); yields its URL. A `serve` process took 15 s to start on a loaded 2-core machine, this under 1 s."""
    import uvicorn

    from human_eval.server import create_app
    from human_eval.store import Store, database_url
    from human_eval.study import load_study

    study = load_study(folder)
    store = Store(store_url or database_url(folder / "votes.sqlite"), study.id)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(study, store, "admin-secret-token"), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        store.close()
