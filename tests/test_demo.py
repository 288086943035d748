import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from evaluate.names import display_name
from evaluate.verdict import tied

from .conftest import CHROMIUM, CHROMIUM_ARGS, REPO, needs_chromium, run_dwb

REPO_CONFIGS = REPO / "configs"


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory) -> SimpleNamespace:
    """`dwb demo --quick`, run once for the module, with its results folder copied as the demo left it (a test runs
    `dwb evaluate compare` over the original), and that command's output."""
    out = tmp_path_factory.mktemp("quick-demo") / "demo"
    r = run_dwb("demo", "--quick", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    left = out.parent / "eval-as-the-demo-left-it"
    shutil.copytree(out / "eval", left)
    compared = run_dwb("evaluate", "compare", "phase2/ba2", "phase2/ba4", "--out", str(out / "eval"))
    assert compared.returncode == 0, compared.stderr[-2000:]
    return SimpleNamespace(out=out, run=r, report=json.loads((out / "demo.json").read_text()), left=left,
                           compared=compared)


@pytest.mark.slow
def test_quick_demo_runs_every_stage(quick_demo):
    out, r, report = quick_demo.out, quick_demo.run, quick_demo.report
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
    compared = quick_demo.compared
    for answer in closing.split(": ", 1)[1].rstrip(".").split("; "):  # each metric alone, as asked beforehand
        said, p_value = answer.rsplit(" (", 1)
        lines = [line for line in compared.stdout.splitlines() if said in line]  # the line that metric's leads
        if not lines and said.endswith(": B - A = +0 [+0, +0]"):  # an exact tie: compare folds the ties in one line
            name = said.removeprefix("cannot tell on ").removesuffix(": B - A = +0 [+0, +0]")
            [line] = [line for line in compared.stdout.splitlines() if "tied: B - A = 0 [0, 0]" in line]
            assert name in line and p_value == "p = 1)"
            continue
        [line] = lines
        assert f"its own {p_value.rstrip(')')}" in line or f"alone: {answer}" in line or line.endswith(f"({p_value}")
    # ... and writes the comparison page `dwb evaluate compare` writes, which the report links
    page = Path(report["compare_page"])
    assert page == out / "eval" / "compare" / "phase2_ba2-vs-phase2_ba4.html" and page.is_file()
    assert f"compare:     {page}" in r.stdout
    assert f"../compare/{page.name}" in (quick_demo.left / "report" / "index.html").read_text()
    assert "Comparisons (dwb evaluate compare)" in (quick_demo.left / "report" / "index.html").read_text()
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


def _verdict_rows(page) -> dict[str, dict]:
    """Per metric row of the page's verdict table: its class and each cell's text by the cell's class."""
    return {tr.get_attribute("data-metric"): {"class": tr.get_attribute("class"),
                                              **{td.get_attribute("class"): td.text_content()
                                                 for td in tr.query_selector_all("td[class]")}}
            for tr in page.query_selector_all("table.verdict tr[data-metric]")}


def _bounds(text: str) -> tuple[float, float]:
    lo, hi = re.search(r"\[([-+0-9.e]+), ([-+0-9.e]+)\]", text).groups()
    return float(lo), float(hi)


def _p_holds(text: str, p: float) -> bool:
    """Whether a printed p ("p = 0.096", "p < 0.05", "p <= 0.02", "p < 0.001") is what ``p`` prints as."""
    _, kind, value = text.split()
    if kind == "=":
        return f"{p:.2g}" == value or float(f"{p:.2g}") == float(value)
    return p <= float(value) * (1 + 1e-9) if kind == "<=" else p < float(value)


@pytest.mark.slow
@needs_chromium
def test_the_demos_compare_page_says_what_compare_prints_and_its_json_holds(quick_demo):
    """The done-when check: the demo's comparison page, opened in Chromium, gives every metric the verdict,
    interval and p that `dwb evaluate compare` prints and that its JSON holds; the rows' colours follow the
    verdict after Holm's adjustment, and the family verdicts and what was scored are on it too."""
    from playwright import sync_api

    page_file = quick_demo.left / "compare" / "phase2_ba2-vs-phase2_ba4.html"
    [saved] = [json.loads(p.read_text()) for p in (quick_demo.left / "compare").glob("*.json")]
    printed = quick_demo.compared.stdout.splitlines()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(page_file.as_uri())
        rows = _verdict_rows(page)
        families = [li.text_content() for li in page.query_selector_all("div.overall li.family")]
        scored = page.query_selector("section.guidance p.scored").text_content()
        browser.close()

    assert set(rows) == {m["metric"] for m in saved["metrics"]} and len(rows) > 10
    for m in saved["metrics"]:
        row = rows[m["metric"]]
        lines = [line for line in printed if line == f"  {m['sentence']}"]  # the printed line, word for word
        assert row["sentence"] == m["sentence"]
        assert row["class"] == f"better-{m['better_holm'] or 'none'}"
        assert row["verdict"] == ("cannot tell" if m["better_holm"] is None else f"{m['better_holm']} is better")
        if not lines and tied(m):  # an exact tie, printed in the one line that folds the ties
            [line] = [line for line in printed if "tied: B - A = 0 [0, 0] on each" in line]
            assert display_name(m["metric"]) in line and m["difference"] == m["lo"] == m["hi"] == 0
            continue
        [line] = lines
        if m["lo"] is None:  # no interval: said why, and no p
            assert row["p"] == row["own-p"] == "" and m["unmeasured"] in line
            continue
        assert row["p"] in line and row["own-p"] in line  # the same p texts as the printed line
        assert _p_holds(row["p"], m["p_holm"]) and _p_holds(row["own-p"], m["p"])  # ... and the JSON's
        lo, hi = _bounds(row["interval"])  # B - A, signed
        assert lo <= m["lo"] and hi >= m["hi"]  # rounded outward from the JSON's interval
        assert (lo > 0 or hi < 0) == (m["better"] is not None)  # the interval says what the metric's own p says
        assert sorted(map(abs, (lo, hi))) == sorted(map(abs, _bounds(line)))  # the printed digits (a gain: -(B - A))
    assert families == [f["sentence"] for f in saved["overall"]["families"]]
    assert all(f"    {family}" in printed for family in families)
    header = next(line for line in printed if line.startswith("A = phase2/ba2, B = phase2/ba4, "))
    assert scored == f"Scored: {re.search(r'B = phase2/ba4, (.*), [0-9]+ images of', header).group(1)}."
    made = quick_demo.report["generation"]  # what the demo generated with; its checkpoints hold EMA weights
    assert scored == f"Scored: guidance {made['guidance']:g}, {made['sampler']}, {made['steps']} steps, EMA weights."


@pytest.mark.slow
def test_the_transformer_trains_for_the_unets_flops_and_is_compared_with_it(quick_demo, tmp_path):
    """`dwb demo --with-transformer`'s stage on the quick demo's data, parts and scores: the transformer's phase 2
    is as long as makes its counted training FLOPs the UNet's (within one of its batches), and its last checkpoint
    is compared with the UNet's last by `dwb evaluate compare`'s paired intervals (it runs last in the module: it adds
    to the demo's folder)."""
    from demo.run import transformer_at_equal_flops
    from demo.settings import QUICK
    from train.config import load_config
    from train.flops import batch_flops

    out = quick_demo.out
    stages: list = []
    result = transformer_at_equal_flops(out, QUICK, 0, True, stages, quick_demo.report["scores"])
    per_batch = batch_flops(load_config(REPO_CONFIGS / "tiny-mmdit-phase2.yaml",
                                        [f"model.pretrained={out / 'components'}", *QUICK["train"]]))
    assert abs(result["transformer_flops"] - result["unet_flops"]) <= per_batch / 2
    assert result["transformer_batches"]["phase1"] == result["unet_batches"]["phase1"] == 4
    phase2 = result["transformer_batches"]["phase2"]
    assert phase2 != result["unet_batches"]["phase2"]  # counted, not copied: the two step costs differ
    assert [s["model"] for s in result["scores"]] == [f"transformer-phase2/ba{phase2}"]
    comparison = result["comparison"]
    assert (comparison["a"], comparison["b"]) == ("phase2/ba4", f"transformer-phase2/ba{phase2}")
    assert Path(result["compare_page"]).is_file()
    assert [s["stage"].split(":")[0] for s in stages] == ["count", "train", "train", "evaluate"]
    from demo.run import write_study  # the blind study puts the transformer's last beside the UNet's checkpoints

    study = write_study(tmp_path, quick_demo.report["scores"], result["scores"][-1:])
    assert study["models"][-1] == f"transformer-phase2/ba{phase2}" and len(study["models"]) == 4
