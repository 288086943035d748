"""Failures: resumption from every checkpoint (bit-identical), SIGKILL at several points, corrupt checkpoints,
non-finite losses, full disks."""
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from models.checkpoints import checkpoint_problem, read_checkpoint
from models.checkpoints.composer import SAFE_TYPES as _SAFE
from train.config import load_config
from models.errors import WorkbenchError
from train.trainer import build_model, build_trainer, check_save_folder, estimate_checkpoint_bytes, train

from ..conftest import REPO, kill_once_saved, tiny_overrides

PHASE1 = REPO / "configs/tiny-phase1.yaml"
# 32 samples at batch 8: an epoch is 4 batches, so checkpoints every 2 batches fall in the middle of an
# epoch (ba2, ba6) and on an epoch's last batch (ba4, ba8); every epoch (1ep) they fall on the first batch of
# the next epoch. EMA starts at batch 3: checkpoints before and after it.
RUN = dict(autoresume="true", run_name="resilience", max_duration="10ba", **{"ema.enabled": "true", "ema.ema_start": "3ba"})


@pytest.fixture(scope="module")
def four_batch_epochs(tmp_path_factory) -> Path:
    from train.shapes import write_shapes_dataset

    out = tmp_path_factory.mktemp("shapes32")
    write_shapes_dataset(out, 32, seed=4, sizes=(16,), n_eval=0, progress=False)
    return out


def _over(data, components, folder, save_interval="2ba", **extra):
    return tiny_overrides(data, components, folder, **{**RUN, "save_interval": save_interval, **extra})


def _batch(path: Path) -> int:
    return int(path.name.split("-ba")[1].split("-")[0])


def _checkpoints(folder: Path) -> list[Path]:
    return sorted(folder.glob("ep*-ba*-rank0.pt"), key=_batch)


def training_state(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor a resumed run carries on with: model weights, the EMA copy, AdamW's moments and steps."""
    with torch.serialization.safe_globals(_SAFE):
        state = torch.load(path, map_location="cpu", weights_only=True)["state"]
    out = {f"model.{k}": v for k, v in state["model"].items()}
    for name, algorithm in state["algorithms"]:
        if name == "FusedEMA":
            out.update({f"ema.{k}": v for k, v in algorithm["ema_model"]["named_parameters_dict"].items()})
    for i, moments in state["optimizers"]["AdamW"]["state"].items():
        out.update({f"adamw.{i}.{k}": torch.as_tensor(v) for k, v in moments.items()})
    return out


def differing(a: Path, b: Path) -> list[str]:
    sa, sb = training_state(a), training_state(b)
    assert sa.keys() == sb.keys() and any(k.startswith("ema.") for k in sa) and any(k.startswith("adamw.") for k in sa)
    return [k for k in sa if not torch.equal(sa[k], sb[k])]


@pytest.fixture(scope="module")
def reference(four_batch_epochs, components, tmp_path_factory):
    """An uninterrupted run of 10 batches, checkpointed every 2."""
    folder = tmp_path_factory.mktemp("reference") / "ckpt"
    train(load_config(PHASE1, _over(four_batch_epochs, components, folder)))
    return folder


@pytest.fixture(scope="module")
def reference_by_epoch(four_batch_epochs, components, tmp_path_factory):
    """The same run checkpointed every epoch: at the first batch of epochs 1 and 2, and at its end."""
    folder = tmp_path_factory.mktemp("reference-epochs") / "ckpt"
    train(load_config(PHASE1, _over(four_batch_epochs, components, folder, save_interval="1ep")))
    return folder


@pytest.mark.parametrize("by_epoch", [False, True], ids=["every-2-batches", "every-epoch"])
def test_resuming_from_every_checkpoint_is_bit_identical(request, by_epoch, four_batch_epochs, components, tmp_path):
    """Mid-epoch, an epoch's last batch, the next epoch's first batch, before and after EMA starts."""
    reference = request.getfixturevalue("reference_by_epoch" if by_epoch else "reference")
    interval = "1ep" if by_epoch else "2ba"
    saved = _checkpoints(reference)
    assert [_batch(p) for p in saved] == ([4, 8, 10] if by_epoch else [2, 4, 6, 8, 10])
    for i, resume_from in enumerate(saved[:-1]):
        folder = tmp_path / resume_from.stem / "ckpt"
        folder.mkdir(parents=True)
        for earlier in saved[: i + 1]:
            shutil.copy(earlier, folder / earlier.name)  # what a run killed after this checkpoint left behind
        trainer = build_trainer(load_config(PHASE1, _over(four_batch_epochs, components, folder, save_interval=interval)))
        assert int(trainer.state.timestamp.batch) == _batch(resume_from)
        trainer.fit()
        trainer.close()
        assert differing(_checkpoints(folder)[-1], saved[-1]) == [], f"resumed from {resume_from.name}"


def _stop_inside_a_write(proc: subprocess.Popen, folder: Path, names: list[str]) -> str | None:
    """Freeze the run the moment one of ``names`` appears; SIGKILL it there if that file is still being
    written (the name returned), else let it go on to the next name."""
    for name in names:
        path, deadline = folder / name, time.time() + 300
        while not path.exists():
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else "timeout"
            time.sleep(0.0005)
        os.kill(proc.pid, signal.SIGSTOP)
        if checkpoint_problem(path) is not None:  # a torn zip: the kill lands inside the write
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            return name
        os.kill(proc.pid, signal.SIGCONT)
    return None




@pytest.mark.slow
def test_sigkill_at_several_points_then_autoresume_is_bit_identical(reference, four_batch_epochs, components, tmp_path):
    folder = tmp_path / "ckpt"
    cmd = [str(Path(sys.executable).parent / "dwb"), "train", str(PHASE1), *_over(four_batch_epochs, components, folder)]

    def start():
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # 1. killed while writing a checkpoint: the torn file is set aside and the run resumes from the one before
    torn = _stop_inside_a_write(start(), folder, ["ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt", "ep1-ba6-rank0.pt"])
    assert torn is not None, "no kill landed inside a checkpoint write"
    # 2. killed after the checkpoint at an epoch's last batch (ba8 of 4-batch epochs)
    second = start()
    kill_once_saved(second, folder / "ep1-ba8-rank0.pt")
    resumed_first = second.stdout.read()
    # 3. the same command runs to the end
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    before_torn = _batch(Path(torn)) - 2
    if before_torn:
        assert f"resuming at batch {before_torn}" in resumed_first
    assert (folder / f"{torn}.corrupt").is_file()
    assert "resuming at batch 8" in again.stdout
    assert differing(folder / "ep2-ba10-rank0.pt", reference / "ep2-ba10-rank0.pt") == []


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(reference, four_batch_epochs, components, tmp_path,
                                                                  caplog, damage):
    folder = tmp_path / "ckpt"
    train(load_config(PHASE1, _over(four_batch_epochs, components, folder, max_duration="8ba")))
    latest = folder / "ep1-ba8-rank0.pt"
    data = bytearray(latest.read_bytes())
    if damage == "truncate":
        latest.write_bytes(data[: len(data) // 2])
    else:
        middle = len(data) // 2
        data[middle:middle + 64] = bytes(64)  # zeroed bytes inside a tensor record
        latest.write_bytes(data)
    with caplog.at_level("WARNING", logger="train.checkpoint"):
        trainer = build_trainer(load_config(PHASE1, _over(four_batch_epochs, components, folder)))
    assert int(trainer.state.timestamp.batch) == 6
    assert "ep1-ba8-rank0.pt is unreadable" in caplog.text
    assert (folder / "ep1-ba8-rank0.pt.corrupt").is_file()  # kept aside, never deleted
    trainer.fit()
    trainer.close()
    assert differing(folder / "ep2-ba10-rank0.pt", reference / "ep2-ba10-rank0.pt") == []


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
    actual = (reference / "ep1-ba8-rank0.pt").stat().st_size
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


def test_every_rank_checks_the_shared_save_folder_at_once(tmp_path):
    """Ranks of one node check the same save folder at the same moment; none may read another's probe as its own
    (a 4-rank resume failed with "cannot write to ... (No such file or directory)")."""
    from concurrent.futures import ThreadPoolExecutor

    folder = str(tmp_path / "ckpt")

    def checks(_):
        for _ in range(300):
            check_save_folder(folder)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(checks, range(4)))  # re-raises the first rank's error
    assert not list((tmp_path / "ckpt").iterdir())  # no probe left behind
