"""`composer -n N dwb evaluate run` (CPU, gloo) gives the images and scores of one process: on 3 ranks with fewer
prompts than ranks (ranks with one batch beside one with none). Ranks holding two batches beside ranks holding one
are merged as one process scores them in `test_scores_merged_from_four_ranks_equal_one`, without a launch (each
launch of ranks costs 15 to 25 s of two cores per rank here)."""
import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from evaluate.statistics.metrics import FeatureStats
from evaluate.prompts import shapes_prompts
from evaluate.reference import ReferenceStats
from evaluate.row import FEATURES, RowScorer, row_metrics
from evaluate.run import check_output_folder, evaluate_checkpoints
from evaluate.samples import plan_batches
from models.errors import WorkbenchError

from ..ranks import run_ranks
from .test_run import _cfg

BIN = Path(sys.executable).parent
TIMINGS = {"time", "seconds_generate", "seconds_metrics", "seconds_bootstrap", "seconds_total", "seconds_checkpoint"}
RANKS_HANG_AFTER = 300  # three ranks share two cores here: about 60 s when nothing hangs


# ---- merging the ranks' parts -------------------------------------------------------------------------------------


def _assert_same(a, b, where: str) -> None:
    """Equal values; floats up to the order of float64 sums, which depends on how the images were split."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where


class PixelFeatures:
    """A feature extractor for the merge's tests: an image's first 8 pixel values."""
    name, dim = "pixels", 8

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return images.reshape(len(images), -1)[:, :self.dim].to(torch.float32)


def _ranks_parts(prompts: list, world: int) -> list[dict]:
    """Every rank's ``RowScorer.part()`` for its batches of one image, as ``score_guidance`` deals them."""
    parts = []
    for rank in range(world):
        scorer = RowScorer(PixelFeatures(), kid_max=20, seed=rank)
        for chunk in plan_batches(prompts, 1, 1, rank, world):
            [(prompt, i)] = chunk
            g = torch.Generator().manual_seed(1000 * prompt.index + i)
            scorer.on_batch(torch.randint(0, 256, (1, 3, 4, 4), dtype=torch.uint8, generator=g), chunk)
        parts.append(scorer.part())
    return parts


@pytest.mark.parametrize("n_prompts", [3, 6])  # fewer prompts than ranks; an uneven split
def test_scores_merged_from_four_ranks_equal_one(n_prompts):
    prompts = shapes_prompts(n_prompts)
    reference = FeatureStats(PixelFeatures.dim)
    reference.update(torch.rand(16, PixelFeatures.dim, generator=torch.Generator().manual_seed(7)) * 255)
    references = {"fid": ReferenceStats(reference, 0, "pixels", False)}

    def scores(world: int) -> dict:
        cols, _ = row_metrics(_ranks_parts(prompts, world), references, prompts, kid_subsets=3, kid_subset_size=2,
                              bootstrap=20, seed=0)
        return {k: v for k, v in cols.items() if k not in TIMINGS}

    one, four = scores(1), scores(4)
    assert [len(p["keys"]) for p in _ranks_parts(prompts, 4)] == ([1, 1, 1, 0] if n_prompts == 3 else [2, 2, 1, 1])
    _assert_same(one, four, "row")  # KID's subsets too, drawn from 2 of the images


def test_ranks_probing_the_output_folder_at_once_all_go_on(tmp_path):
    """Every rank checks that the output folder can be written at the same moment; none may find another's probe."""
    errors, start = [], threading.Barrier(4)

    def rank() -> None:
        start.wait()
        for _ in range(200):
            try:
                check_output_folder(tmp_path)
            except WorkbenchError as e:
                errors.append(str(e))
                return

    threads = [threading.Thread(target=rank) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and list(tmp_path.iterdir()) == []


# ---- four ranks: fewer prompts than ranks ----------------------------------------------------------------------


def _one_process_cfg(out, shapes_data, inception_weights, n_prompts: int):
    """One image per prompt in batches of one, so every rank holds whole prompts; a KID subset of 2 of the images,
    so KID depends on which images each subset draws, not only on the whole set."""
    return _cfg(out, shapes_data, inception_weights, guidance=(3.0,), n_prompts=n_prompts, batch_size=1,
                kid_subset_size=2)


@pytest.fixture(scope="module")
def one_process(tiny_run, shapes_data, inception_weights, tmp_path_factory):
    """``n_prompts`` -> the results folder of one process scoring the tiny checkpoint (run once per count)."""
    done = {}

    def results(n_prompts: int) -> Path:
        if n_prompts not in done:
            out = tmp_path_factory.mktemp(f"one-{n_prompts}")
            cfg = _one_process_cfg(out, shapes_data, inception_weights, n_prompts)
            evaluate_checkpoints(cfg, [tiny_run / "ep0-ba4-rank0.pt"])
            done[n_prompts] = Path(cfg.out)
        return done[n_prompts]

    return results


def _on_ranks(ckpt: Path, cfg, out: Path, nproc: int) -> None:
    args = [str(BIN / "dwb"), "evaluate", "run", str(ckpt), "--out", str(out), "--reference", cfg.reference,
            "--inception-weights", cfg.inception_weights, "--inception-features", "64", "--prompts", "shapes",
            "--n-prompts", str(cfg.n_prompts), "--n-reference", "16", "--guidance", "3", "--steps", "2", "--size", "16",
            "--batch-size", "1", "--kid-subsets", "3", "--kid-subset-size", "2", "--device", "cpu"]
    run = run_ranks(args, nproc, hang_after=RANKS_HANG_AFTER)
    assert not run.hung and run.returncode == 0, run.explain()


def _assert_results_equal(one: Path, many: Path) -> None:
    """Every column of results.jsonl but the timings, every manifest line, the features and each PNG bit for bit."""
    [row1] = [json.loads(line) for line in (one / "results.jsonl").read_text().splitlines()]
    [row4] = [json.loads(line) for line in (many / "results.jsonl").read_text().splitlines()]
    assert row1.keys() == row4.keys()
    _assert_same({k: v for k, v in row1.items() if k not in TIMINGS},
                 {k: v for k, v in row4.items() if k not in TIMINGS}, "row")
    samples1, samples4 = one / row1["samples"], many / row4["samples"]
    m1 = [json.loads(x) for x in (samples1 / "manifest.jsonl").read_text().splitlines()]
    m4 = [json.loads(x) for x in (samples4 / "manifest.jsonl").read_text().splitlines()]
    _assert_same(m1, m4, "manifest")
    assert len(m1) == row1["n_images"]
    for line in m1:  # the same batches, so bit-identical images
        a, b = (np.asarray(Image.open(folder / line["path"])) for folder in (samples1, samples4))
        assert np.array_equal(a, b)
    f1 = torch.load(samples1 / FEATURES, weights_only=True)
    f4 = torch.load(samples4 / FEATURES, weights_only=True)
    assert torch.equal(f1["keys"], f4["keys"]) and torch.equal(f1["features"]["fid"], f4["features"]["fid"])


@pytest.mark.slow
def test_three_ranks_with_fewer_prompts_than_ranks_equal_one(one_process, tiny_run, shapes_data, inception_weights,
                                                             tmp_path):
    """2 prompts in batches of one on 3 ranks: rank 2 generates nothing, yet joins every gather and barrier; the
    images, features and every score are one process's."""
    ckpt = tiny_run / "ep0-ba4-rank0.pt"
    cfg = _one_process_cfg(tmp_path, shapes_data, inception_weights, 2)
    _on_ranks(ckpt, cfg, tmp_path / "three", nproc=3)
    _assert_results_equal(one_process(2), tmp_path / "three")
