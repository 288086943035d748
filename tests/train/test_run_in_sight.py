"""A run in sight while it trains: validation loss, previews, TensorBoard, curves, cost and `dwb plan`.

Three short real runs shared by the module: phase 1 straight (4 batches), the same phase 1 SIGKILLed after
its batch-2 checkpoint and resumed, and a 2-batch phase 2 from the straight run's last checkpoint."""
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from models.checkpoints import read_checkpoint
from train.config import load_config
from models.errors import WorkbenchError
from train.trainer import train

from ..conftest import REPO, kill_once_saved, tiny_overrides

PHASE1, PHASE2 = REPO / "configs/tiny-phase1.yaml", REPO / "configs/tiny-phase2.yaml"
PROMPTS = ["a red circle", "two blue squares"]
BIN = Path(sys.executable).parent


def _over(shapes_data, components, folder, **extra) -> list[str]:
    """Validation on 4 held-out samples at 3 timesteps (raw and EMA): each pass costs about one training batch."""
    keys = dict(max_duration="4ba", save_interval="2ba", autoresume="true", eval_interval="2ba", preview_interval="4ba",
                loggers="[file,tensorboard]", **{"validation.path": shapes_data / "eval" / "32",
                "validation.max_samples": 4, "validation.timesteps": "[100,500,900]",
                "previews.prompts": json.dumps(PROMPTS), "previews.steps": 3, "ema.enabled": "true",
                "cost.usd_per_gpu_hour": 2.0})
    return tiny_overrides(shapes_data, components, folder, **{**keys, **extra})


@pytest.fixture(scope="module")
def runs(shapes_data, components, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("in-sight")
    straight = root / "straight" / "checkpoints"
    train(load_config(PHASE1, _over(shapes_data, components, straight)))

    killed = root / "killed" / "checkpoints"
    over = _over(shapes_data, components, killed)
    proc = subprocess.Popen([str(BIN / "dwb"), "train", str(PHASE1), *over], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    kill_once_saved(proc, killed / "ep0-ba2-rank0.pt")
    time.sleep(2)  # an idle gap between the kill and the resume: not counted
    t0 = time.monotonic()
    train(load_config(PHASE1, over))
    resume_seconds = time.monotonic() - t0

    phase2 = root / "phase2" / "checkpoints"
    train(load_config(PHASE2, _over(shapes_data, components, phase2, max_duration="2ba", eval_interval="1ba",
                                    load_path=straight / "ep0-ba4-rank0.pt", preview_interval="null")))
    return {"straight": straight, "killed": killed, "phase2": phase2, "resume_seconds": resume_seconds}




def _callback(ckpt: Path, name: str) -> dict:
    return read_checkpoint(ckpt)["callbacks"][name]


@pytest.mark.slow
def test_validation_loss_is_bit_identical_straight_or_through_a_kill_and_resume(runs):
    for name in ("ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt"):
        straight = _callback(runs["straight"] / name, "ValidationLoss")["last"]
        resumed = _callback(runs["killed"] / name, "ValidationLoss")["last"]
        assert straight == resumed and straight["batch"] == int(name.split("-ba")[1].split("-")[0])
    last = _callback(runs["straight"] / "ep0-ba4-rank0.pt", "ValidationLoss")["last"]
    assert {"validation/loss", "validation_ema/loss", "validation/loss_low", "validation/loss_mid",
            "validation/loss_high"} <= set(last)
    assert last["validation/loss"] != last["validation_ema/loss"]  # the EMA weights are measured, not the raw twice


@pytest.mark.slow
def test_gpu_hours_add_up_across_a_resume_and_into_phase_2(runs):
    before = _callback(runs["killed"] / "ep0-ba2-rank0.pt", "RunCost")
    after = _callback(runs["killed"] / "ep0-ba4-rank0.pt", "RunCost")
    assert after["resumes"] == 1 and 0 < after["segment_seconds"] <= runs["resume_seconds"]
    assert after["wall_seconds"] == pytest.approx(before["wall_seconds"] + after["segment_seconds"], rel=1e-9)
    assert after["gpu_hours"] == pytest.approx(after["wall_seconds"] / 3600)  # one process
    first = _callback(runs["straight"] / "ep0-ba4-rank0.pt", "RunCost")
    second = _callback(runs["phase2"] / "ep0-ba2-rank0.pt", "RunCost")
    assert second["gpu_hours_total"] == pytest.approx(first["gpu_hours_total"] + second["gpu_hours"], rel=1e-9)


@pytest.mark.slow
def test_preview_cells_equal_dwb_sample_of_the_checkpoint(runs, dwb, tmp_path):
    preview = runs["straight"].parent / "previews" / "ba4.png"
    params = json.loads(preview.with_suffix(".json").read_text())
    assert params["prompts"] == PROMPTS and params["seeds"] == [0, 1] and params["steps"] == 3
    out = tmp_path / "sample.png"
    args = [a for p in PROMPTS for a in ("--prompt", p)]
    r = dwb("sample", str(runs["straight"] / "ep0-ba4-rank0.pt"), str(out), *args, "--seeds", "2", "--steps", "3",
            "--guidance", str(params["guidance"]), "--size", "16", "--weights", "ema" if params["ema"] else "raw")
    assert r.returncode == 0, r.stderr
    a, b = np.asarray(Image.open(preview)), np.asarray(Image.open(out))
    assert a.shape == b.shape
    cells = (slice(24, None), slice(300, None))  # below the title, right of the prompt labels
    assert np.array_equal(a[cells], b[cells]) and a[cells].std() > 0


@pytest.mark.slow
def test_tensorboard_events_hold_the_scalars_and_the_previews(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = next((runs["straight"].parent / "tensorboard").iterdir())
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    validation = events.Scalars("validation/loss")
    assert [e.step for e in validation] == [2, 4]
    last = _callback(runs["straight"] / "ep0-ba4-rank0.pt", "ValidationLoss")["last"]
    assert validation[-1].value == pytest.approx(last["validation/loss"], rel=1e-6)
    assert {"loss/train/total", "cost/gpu_hours", "cost/usd", "validation_ema/loss_high"} <= set(events.Tags()["scalars"])
    images = events.Images("previews")
    assert [e.step for e in images] == [4] and images[0].width == Image.open(
        runs["straight"].parent / "previews" / "ba4.png").width


@pytest.mark.slow
def test_curves_have_both_phases_and_the_restart(runs, dwb, tmp_path):
    from train.callbacks import laid_out

    phase1, phase2 = runs["killed"].parent, runs["phase2"].parent
    placed, marks = laid_out([phase1, phase2])
    assert len(marks["resumes"]) == 1 and 0 < marks["resumes"][0] <= 32  # resumed at batch 2 of 8 samples
    assert marks["phases"] == [32]  # phase 2 starts where phase 1's 4 x 8 samples ended
    assert {seg.run for _, seg, _ in placed} == {"killed", "phase2"}
    assert all("validation/loss" in seg.series for _, seg, _ in placed if seg.run == "phase2")
    r = dwb("runs", "plot", str(phase1), str(phase2), "--out", str(tmp_path / "curves.png"))
    assert r.returncode == 0, r.stderr
    assert Image.open(tmp_path / "curves.png").size[0] > 500
    assert (phase1 / "curves.png").is_file()  # `dwb train` draws its own


def test_dwb_plan_reproduces_the_published_a100_table(dwb):
    r = dwb("plan", "--measured", "8:128.2", "--measured", "128:1618.4", "--config", "configs/sd2-base-phase1.yaml",
            "--config", "configs/sd2-base-phase2.yaml", "--usd-per-gpu-hour", "2", "--gpus", "8,64,128")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("2.867B samples")  # 550k + 850k batches of 2048
    rows = {int(line.split("|")[1]): [c.strip() for c in line.split("|")[2:-1]]
            for line in r.stdout.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()}
    days, hours, usd = (float(rows[8][k].strip("$").replace(",", "")) for k in (1, 2, 3))
    assert abs(days - 258.8) <= 0.1 and abs(hours - 49_696) / 49_696 < 1e-3 and abs(usd - 99_000) < 1_000
    assert float(rows[128][1]) == 20.5 and rows[128][4] == rows[8][4] == "measured"
    assert rows[64][4].startswith("extrapolated")


@pytest.mark.parametrize("override, says", [
    ("eval_interval=0ba", "eval_interval"), ("preview_interval=1ep", "preview_interval"),
    ("validation.timesteps=[1000]", "validation.timesteps"), ("cost.usd_per_gpu_hour=-1", "cost.usd_per_gpu_hour"),
    ("previews.sampler=nope", "unknown sampler")])
def test_bad_run_in_sight_keys_are_one_line(override, says):
    with pytest.raises(WorkbenchError, match=says.replace(".", r"\.")):
        load_config(PHASE1, [override])


@pytest.mark.slow
def test_evaluate_report_plots_metrics_against_gpu_hours(runs, tmp_path):
    from evaluate.report import checkpoint_costs, plot_metrics_vs_cost

    ckpts = [runs["straight"] / "ep0-ba2-rank0.pt", runs["straight"] / "ep0-ba4-rank0.pt", runs["phase2"] / "ep0-ba2-rank0.pt"]
    rows = [{"model": c.parent.parent.name, "checkpoint": str(c), "step": 2, "guidance": 3.0, "fid": 30.0 - i}
            for i, c in enumerate(ckpts)]
    costs = checkpoint_costs(rows)  # rows without cost columns (a store from before them): read from the files
    hours = [costs[str(c)]["gpu_hours"] for c in ckpts]
    assert hours == sorted(hours) and hours[0] > 0  # phase 2's checkpoint carries phase 1's hours
    assert [costs[str(c)]["usd"] for c in ckpts] == [h * 2.0 for h in hours]  # cost.usd_per_gpu_hour: 2.0
    out = plot_metrics_vs_cost(rows, tmp_path / "metrics_vs_cost.png")
    assert out is not None and Image.open(out).size[0] > 300
    assert plot_metrics_vs_cost([{**rows[0], "checkpoint": str(tmp_path / "gone.pt")}], tmp_path / "none.png") is None
