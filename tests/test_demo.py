import json
import re

import numpy as np
import pytest
from PIL import Image

from .conftest import run_dwb


@pytest.mark.slow
def test_quick_demo_runs_every_stage(tmp_path):
    out = tmp_path / "demo"
    r = run_dwb("demo", "--quick", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((out / "demo.json").read_text())
    stages = [s["stage"].split(":")[0] for s in report["stages"]]
    assert stages == ["data", "prepare", "scorer", "precompute", "train", "train", "export", "grids", "evaluate",
                      "study"]
    assert (out / "latents" / "32" / "precompute.json").is_file()  # the phases trained on stored latents
    assert all(s["seconds"] >= 0 and s["peak_rss_mib"] > 0 for s in report["stages"])
    # the run in sight: both phases' curves in one figure, the cost table, the cost carried into phase 2
    assert (out / "curves.png").is_file() and "| measured |" in report["cost_table"]
    assert report["final_checkpoint_cost"]["gpu_hours_total"] > report["final_checkpoint_cost"]["gpu_hours"] > 0
    # one grid per checkpoint of both phases, each a real picture with content
    ckpts = sorted((out / "runs").glob("*/checkpoints/ep*-ba*-rank0.pt"))
    assert len(ckpts) == 4 and len(report["grids"]) == 4
    for grid in report["grids"]:
        pixels = np.asarray(Image.open(grid).convert("RGB"))
        assert pixels.shape[0] > 100 and pixels.std() > 10
    # the export is a plain diffusers pipeline
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(out / "export")
    image = pipe("a red circle", num_inference_steps=2, height=32, width=32, output_type="np").images
    assert image.shape == (1, 32, 32, 3)
    assert "grids:" in r.stdout and "export:" in r.stdout
    # every checkpoint scored by the shapes scorer: domain FID and attribute accuracy, with a report
    assert [s["model"] for s in report["scores"]] == ["phase1/ba2", "phase1/ba4", "phase2/ba2", "phase2/ba4"]
    for s in report["scores"]:
        assert np.isfinite(s["fid"]) and 0.0 <= s["attr_all_all"] <= 1.0 and 0.0 <= s["attr_single_color"] <= 1.0
    assert (out / "eval" / "report" / "attributes_vs_step.png").is_file()
    assert "all right" in r.stdout and "scores:" in r.stdout
    # its own guidance and steps, the workbench's sampler and weights: in demo.json, each row and each grid's PNG
    assert report["generation"] == {"guidance": 3.0, "steps": 4, "sampler": "DPM++ 2M", "weights": "auto"}
    assert {s["weights"] for s in report["scores"]} == {"ema"} and "(ema weights;" in r.stdout
    with Image.open(report["grids"][-1]) as grid:
        assert "Steps: 4, Sampler: DPM++ 2M, CFG scale: 3," in grid.text["parameters"]
        assert "Weights: EMA" in grid.text["parameters"]
    # ... and closes with the answer, in `dwb evaluate compare`'s words, intervals and p-values
    comparison = report["comparison"]
    assert (comparison["a"], comparison["b"]) == ("phase2/ba2", "phase2/ba4")
    closing = r.stdout.strip().splitlines()[-1]
    claim = r"(B is better|A is better) on {0} by [\d.]+ \[[\d.]+, [\d.]+\]|cannot tell on {0}: B - A = \S+ \[\S+, \S+\]"
    p = r"\(p (=|<|<=) [\d.]+\)"
    assert re.fullmatch(rf"Last checkpoint vs middle \(B = phase2/ba4, A = phase2/ba2, paired over the same 8 prompts "
                        rf"and seeds\): ({claim.format('FID')}) {p}; ({claim.format(re.escape('every attribute right (all prompts)'))}) {p}\.",
                        closing), closing
    compared = run_dwb("evaluate", "compare", "phase2/ba2", "phase2/ba4", "--out", str(out / "eval"))
    assert compared.returncode == 0, compared.stderr[-2000:]
    for answer in closing.split(": ", 1)[1].rstrip(".").split("; "):
        said, p_value = answer.rsplit(" (", 1)
        assert f"  {said}, {p_value.rstrip(')')}" in compared.stdout, (answer, compared.stdout)
    # ... and ends with a blind study of its first, middle and last checkpoints, from its own manifests
    study = report["study"]
    assert study["models"] == ["phase1/ba2", "phase2/ba2", "phase2/ba4"] and study["pairs"] > 0
    assert f"dwb human-eval serve {study['folder']}" in r.stdout and f"dwb human-eval report {study['folder']}" in r.stdout
    import httpx

    from .human_eval.conftest import Server, start_rater

    with Server(out / "study") as server, httpx.Client(base_url=server.url) as c:
        rater = start_rater(c, "demo-rater")
        shown = c.get("/api/next", params={"rater": rater}).json()
        assert shown["prompt"]
        vote = c.post("/api/vote", json={"rater": rater, "pair": shown["pair"], "question": "quality", "answer": "A"})
        assert vote.json() == {"recorded": True}
