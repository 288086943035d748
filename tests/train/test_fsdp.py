"""FSDP on CPU ranks (gloo), as the SD2 configs train (`fsdp: true`): every feature of a run, on 2 ranks.

Each run goes through Composer's launcher with a watchdog (``tests.ranks``): a hang fails in a bounded time
with every rank's stack.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from ..conftest import REPO, tiny_overrides
from ..ranks import dwb_train_on_ranks

CONFIG = REPO / "configs" / "tiny-phase1.yaml"


def fsdp_overrides(shapes_data, components, folder, **extra) -> list[str]:
    """2 ranks of 8 on the 16 px bucket, 4 batches, checkpoints at 2 and 4, EMA from batch 1; a preview grid
    through the EMA weights at 2 and 4; validation at 4 on 3 held-out samples one at a time (rank 0 gets 2
    batches, rank 1 one)."""
    keys = {"global_train_batch_size": 16, "device_train_microbatch_size": 8, "max_duration": "4ba",
            "save_interval": "2ba", "fsdp": "true", "run_name": "fsdp", "ema.enabled": "true",
            "ema.ema_start": "1ba", "eval_interval": "4ba", "validation.path": shapes_data / "eval" / "32",
            "validation.max_samples": 3, "validation.batch_size": 1, "validation.timesteps": "[100,900]",
            "preview_interval": "2ba", "previews.steps": 2, "previews.ema": "true",
            "previews.prompts": "['a red circle']", "previews.seeds": "[0]"}
    keys.update(extra)
    return tiny_overrides(shapes_data, components, folder, **keys)


@dataclass
class Run:
    folder: Path  # its checkpoints
    overrides: list[str]


def train_on_two_ranks(shapes_data, components, folder: Path, **extra) -> Run:
    overrides = fsdp_overrides(shapes_data, components, folder, **extra)
    run = dwb_train_on_ranks(CONFIG, overrides, nproc=2)
    assert run.returncode == 0 and not run.hung, run.explain()
    return Run(folder, overrides)


@pytest.fixture(scope="module")
def fsdp_run(shapes_data, components, tmp_path_factory) -> Run:
    """The configs' strategy, SHARD_GRAD_OP."""
    return train_on_two_ranks(shapes_data, components, tmp_path_factory.mktemp("fsdp") / "fsdp" / "checkpoints")


@pytest.fixture(scope="module")
def full_shard_run(shapes_data, components, tmp_path_factory) -> Run:
    """FULL_SHARD: every UNet call gathers the weights, validation at every checkpoint."""
    return train_on_two_ranks(shapes_data, components, tmp_path_factory.mktemp("fsdp") / "full" / "checkpoints",
                              fsdp_sharding_strategy="FULL_SHARD", eval_interval="2ba", **{"validation.max_samples": 1})


@pytest.mark.slow
def test_previews_under_fsdp_finish(fsdp_run):
    """Rank 0 drew the preview at batch 2 through the sharded UNet while the other rank gathered the
    checkpoint's optimizer state: gloo aborted the run (NCCL would wait for ever). Now every rank helps gather
    the weights and rank 0 draws with a plain copy: the run ends with both grids, and no rank left its
    weights swapped (the last checkpoint's EMA and raw weights differ)."""
    from train.checkpoints import model_weights, read_checkpoint

    run_dir = fsdp_run.folder.parent
    assert (run_dir / "previews" / "ba2.png").is_file() and (run_dir / "previews" / "ba4.png").is_file()
    last = read_checkpoint(fsdp_run.folder / "ep0-ba4-rank0.pt")
    ema, raw = model_weights(last, ema=True), model_weights(last, ema=False)
    assert any(not torch.equal(ema[k], raw[k]) for k in raw if k.startswith("unet."))


def one_process_figures(checkpoint: Path, overrides: list[str]) -> dict[str, float]:
    """Validation figures one process measures on a checkpoint's raw and EMA weights, over the whole split."""
    from train.callbacks import read_held_out, validation_figures
    from train.checkpoints import model_weights, read_checkpoint
    from train.config import load_config
    from train.trainer import build_model

    cfg = load_config(CONFIG, [*overrides, "fsdp=false"])
    model, v = build_model(cfg), cfg.validation
    held = read_held_out(v.path, cfg.data.resolution, v.max_samples, 0, 1)
    figures = {}
    for ema, prefix in ((False, "validation"), (True, "validation_ema")):
        weights = model_weights(read_checkpoint(checkpoint), ema=ema)
        model.unet.load_state_dict({k[len("unet."):]: w for k, w in weights.items() if k.startswith("unet.")})
        figures.update(validation_figures(model, held, v.timesteps, v.seed, v.batch_size, prefix))
    return figures


@pytest.mark.slow
def test_uneven_validation_under_full_shard_equals_one_process(full_shard_run, shapes_data, components):
    """More ranks than held-out samples (1 on 2 ranks): rank 0 made UNet calls, rank 1 none. Under FULL_SHARD
    each call gathers the weights from every rank, and the run aborted. Padded to the same count (the padding
    weighted 0), the figures the run saved equal one process's on the checkpoint's weights."""
    from train.checkpoints import read_checkpoint

    for name, batch in (("ep0-ba2-rank0.pt", 2), ("ep0-ba4-rank0.pt", 4)):
        saved = read_checkpoint(full_shard_run.folder / name)["callbacks"]["ValidationLoss"]["last"]
        assert saved["batch"] == batch
        one = one_process_figures(full_shard_run.folder / name, full_shard_run.overrides)
        assert set(one) == set(saved) - {"batch"} and len(one) == 6
        for key, value in one.items():
            assert saved[key] == pytest.approx(value, rel=1e-5), key


@pytest.mark.slow
def test_uneven_validation_under_fsdp_equals_one_process(fsdp_run):
    """3 held-out samples one at a time on 2 ranks (2 calls and 1, padded to 2 and 2) under SHARD_GRAD_OP."""
    from train.checkpoints import read_checkpoint

    saved = read_checkpoint(fsdp_run.folder / "ep0-ba4-rank0.pt")["callbacks"]["ValidationLoss"]["last"]
    one = one_process_figures(fsdp_run.folder / "ep0-ba4-rank0.pt", fsdp_run.overrides)
    assert saved["batch"] == 4 and len(one) == 6
    for key, value in one.items():
        assert saved[key] == pytest.approx(value, rel=1e-5), key
    assert saved["validation_ema/loss"] != saved["validation/loss"]
