"""Our checkpoint against an SDXL and a Flux.1 checkpoint, as a team asks it: scored by `dwb evaluate run`,
compared by `dwb evaluate compare`, and put into a blind study that takes a vote; every step a real `dwb`
process on the tiny folders diffusers wrote (tests/family_fixtures.py)."""
from __future__ import annotations

import json

import httpx
import pytest

from ..conftest import run_dwb
from ..human_eval.conftest import Server, start_rater


@pytest.mark.slow
def test_ours_against_sdxl_and_flux_scored_compared_and_rated(tiny_run, family_folders, shapes_data,
                                                             inception_weights, tmp_path):
    ours, sdxl, flux = tiny_run / "ep0-ba4-rank0.pt", family_folders["sdxl"], family_folders["flux-dev"]
    out = tmp_path / "eval"
    run = run_dwb("evaluate", "run", str(ours), str(sdxl), str(flux), "--out", str(out), "--reference",
                  str(shapes_data / "eval/32"), "--inception-weights", str(inception_weights), "--inception-features",
                  "64", "--prompts", "shapes", "--n-prompts", "6", "--n-reference", "16", "--guidance", "3", "--steps",
                  "2", "--size", "16", "--batch-size", "6", "--kid-subset-size", "6", "--kid-subsets", "2",
                  "--sampler", "Euler", "--device", "cpu")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["model"].split("/")[-1] for r in rows) == ["ep0-ba4-rank0", "flux-dev", "sdxl"]
    assert all(r["fid"] >= 0 for r in rows)

    for other in (sdxl, flux):
        run = run_dwb("evaluate", "compare", str(ours), str(other), "--out", str(out))
        assert run.returncode == 0, run.stderr[-2000:]
        assert f"B = {other.name}" in run.stdout and "FID" in run.stdout
    assert len(list((out / "compare").glob("*.json"))) == 2

    manifests = sorted(out.glob("samples/*/cfg3*/manifest.jsonl"))
    assert len(manifests) == 3
    study = tmp_path / "study"
    run = run_dwb("human-eval", "create", str(study), *(a for m in manifests for a in ("--samples", str(m))))
    assert run.returncode == 0 and "3 models, 6 prompts" in run.stdout, run.stdout + run.stderr
    with Server(study) as server, httpx.Client(base_url=server.url) as client:
        rater = start_rater(client, "rater")
        pair = client.get("/api/next", params={"rater": rater}).json()
        vote = client.post("/api/vote", json={"rater": rater, "pair": pair["pair"], "question": "quality",
                                              "answer": "A"})
        assert vote.json() == {"recorded": True}
