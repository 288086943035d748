"""`composer -n 2 dwb evaluate run` (CPU, gloo) gives the images and scores of one process."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from evaluate.run import evaluate_checkpoints

from ..conftest import REPO
from .test_run import _cfg

BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_two_processes_equal_one(tiny_run, shapes_data, inception_weights, tmp_path):
    ckpt = tiny_run / "ep0-ba4-rank0.pt"
    cfg = _cfg(tmp_path / "one", shapes_data, inception_weights, guidance=(3.0,), n_prompts=6, batch_size=2,
               kid_subset_size=6)
    [one] = evaluate_checkpoints(cfg, [ckpt])

    out = tmp_path / "two" / "results"
    args = [str(BIN / "dwb"), "evaluate", "run", str(ckpt), "--out", str(out), "--reference", cfg.reference,
            "--inception-weights", cfg.inception_weights, "--inception-features", "64", "--prompts", "shapes",
            "--n-prompts", "6", "--n-reference", "16", "--guidance", "3", "--steps", "2", "--size", "16",
            "--batch-size", "2", "--kid-subsets", "3", "--kid-subset-size", "6", "--device", "cpu"]
    run = subprocess.run([str(BIN / "composer"), "-n", "2", *args], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    [two] = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]

    assert two["n_images"] == one["n_images"] == 6
    assert two["fid"] == pytest.approx(one["fid"], rel=1e-9)  # only the order of float64 sums differs
    assert two["kid_mean"] == pytest.approx(one["kid_mean"], rel=1e-9)  # subsets hold every image
    m1 = (Path(cfg.out) / one["samples"] / "manifest.jsonl").read_text().splitlines()
    m2 = (out / two["samples"] / "manifest.jsonl").read_text().splitlines()
    assert [json.loads(a)["seed"] for a in m1] == [json.loads(b)["seed"] for b in m2]
    for line in m1:
        rel = json.loads(line)["path"]
        a = np.asarray(Image.open(Path(cfg.out) / one["samples"] / rel))
        b = np.asarray(Image.open(out / two["samples"] / rel))
        assert np.array_equal(a, b)  # the same batches, so bit-identical images
