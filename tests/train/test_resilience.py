"""Failures: SIGKILL mid-epoch then autoresume (bit-identical), corrupt checkpoints, non-finite losses, full disks."""
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from train.checkpoint import model_weights, read_checkpoint
from train.config import load_config
from train.errors import WorkbenchError
from train.trainer import build_model, build_trainer, check_save_folder, estimate_checkpoint_bytes, train

from ..conftest import REPO, tiny_overrides

PHASE1 = REPO / "configs/tiny-phase1.yaml"
# 192 samples at batch 8: an epoch is 24 batches, so every run below stops and resumes mid-epoch.
RUN = dict(save_interval="4ba", autoresume="true", run_name="resilience", **{"ema.enabled": "true", "ema.ema_start": "2ba"})


def _over(shapes_data, components, folder, **extra):
    return tiny_overrides(shapes_data, components, folder, **{**RUN, **extra})


def _same_weights(a: Path, b: Path) -> bool:
    ca, cb = read_checkpoint(a), read_checkpoint(b)
    for ema in (False, True):
        wa, wb = model_weights(ca, ema=ema), model_weights(cb, ema=ema)
        if wa.keys() != wb.keys() or not all(torch.equal(wa[k], wb[k]) for k in wa):
            return False
    return True


@pytest.fixture(scope="module")
def reference(shapes_data, components, tmp_path_factory):
    """An uninterrupted run of 22 batches, checkpointed every 4."""
    folder = tmp_path_factory.mktemp("reference") / "ckpt"
    train(load_config(PHASE1, _over(shapes_data, components, folder, max_duration="22ba")))
    return folder


@pytest.mark.slow
def test_sigkill_mid_epoch_then_autoresume_is_bit_identical(reference, shapes_data, components, tmp_path):
    folder = tmp_path / "ckpt"
    cmd = [str(Path(sys.executable).parent / "dwb"), "train", str(PHASE1),
           *_over(shapes_data, components, folder, max_duration="22ba")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (folder / "ep0-ba8-rank0.pt").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else "timeout"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)  # no chance to clean up: maybe in the middle of writing a checkpoint
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (folder / "ep0-ba22-rank0.pt").exists()

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # the same command
    assert again.returncode == 0, again.stderr
    resumed_at = int(again.stdout.split("resuming at batch ")[1].split()[0])
    assert 4 <= resumed_at < 22 and resumed_at % 4 == 0  # 4 when the kill cut ba8's file short
    assert _same_weights(folder / "ep0-ba22-rank0.pt", reference / "ep0-ba22-rank0.pt")


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(reference, shapes_data, components, tmp_path,
                                                                  caplog, damage):
    folder = tmp_path / "ckpt"
    train(load_config(PHASE1, _over(shapes_data, components, folder, max_duration="8ba")))
    latest = folder / "ep0-ba8-rank0.pt"
    data = bytearray(latest.read_bytes())
    if damage == "truncate":
        latest.write_bytes(data[: len(data) // 2])
    else:
        middle = len(data) // 2
        data[middle:middle + 64] = bytes(64)  # zeroed bytes inside a tensor record
        latest.write_bytes(data)
    with caplog.at_level("WARNING", logger="train.checkpoint"):
        trainer = build_trainer(load_config(PHASE1, _over(shapes_data, components, folder, max_duration="12ba")))
    assert int(trainer.state.timestamp.batch) == 4
    assert "ep0-ba8-rank0.pt is unreadable" in caplog.text
    assert (folder / "ep0-ba8-rank0.pt.corrupt").is_file()  # kept aside, never deleted
    trainer.fit()
    trainer.close()
    assert _same_weights(folder / "ep0-ba12-rank0.pt", reference / "ep0-ba12-rank0.pt")


def test_nonfinite_losses_are_skipped_then_abort(shapes_data, components, tmp_path):
    over = tiny_overrides(shapes_data, components, tmp_path / "a", max_duration="6ba", save_interval="6ba")
    trainer = build_trainer(load_config(PHASE1, over))
    model, state = trainer.state.model, trainer.state
    loss = model.loss
    model.loss = lambda out, batch: loss(out, batch) * (math.nan if int(state.timestamp.batch) == 2 else 1.0)
    trainer.fit()
    guard = next(a for a in state.algorithms if type(a).__name__ == "NonFiniteGuard")
    assert guard.skipped == 1 and guard.consecutive == 0
    assert all(torch.isfinite(p).all() for p in model.unet.parameters())
    adam = state.optimizers[0].state[next(model.unet.parameters())]
    assert int(adam["step"]) == 5  # six batches, one update skipped
    trainer.close()

    over = tiny_overrides(shapes_data, components, tmp_path / "b", max_duration="20ba", save_interval="20ba",
                          max_consecutive_nonfinite=3)
    trainer = build_trainer(load_config(PHASE1, over))
    weights = {k: v.clone() for k, v in trainer.state.model.unet.state_dict().items()}
    trainer.state.model.loss = lambda out, batch: torch.tensor(math.inf, requires_grad=True)
    with pytest.raises(WorkbenchError, match="not finite for 3 batches in a row"):
        trainer.fit()
    assert int(trainer.state.timestamp.batch) <= 3
    after = trainer.state.model.unet.state_dict()
    assert all(torch.equal(weights[k], after[k]) for k in weights)  # no update from a broken batch
    trainer.close()


def test_checkpoint_size_estimate_and_full_disk(reference, components, tmp_path):
    cfg = load_config(PHASE1, [f"model.pretrained={components}"])
    estimate = estimate_checkpoint_bytes(build_model(cfg), ema=True)
    actual = (reference / "ep0-ba8-rank0.pt").stat().st_size
    assert 0.8 * actual <= estimate <= 1.25 * actual
    import shutil

    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(WorkbenchError, match="GiB free at .* needs about"):
        check_save_folder(str(tmp_path / "ckpt"), need_bytes=2 * free)
    check_save_folder(str(tmp_path / "ckpt"), need_bytes=actual)


def test_ema_tracks_only_the_unet(reference):
    ckpt = read_checkpoint(reference / "ep0-ba4-rank0.pt")
    ema = ckpt["ema_state"]
    assert ema["ema_started"]
    tracked = ema["ema_model"]["named_parameters_dict"]
    unet = [k for k in ckpt["model"] if k.startswith("unet.")]
    assert tracked and all(k.startswith("unet.") for k in tracked)  # never the frozen VAE or text encoder
    assert len(tracked) == len([k for k in unet if not k.endswith("num_batches_tracked")])
