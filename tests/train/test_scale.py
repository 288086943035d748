"""The run at scale, on CPU ranks over gloo: FSDP as the SD2 configs train (`fsdp: true`), several nodes on
127.0.0.1, and a changed world size on resume, each compared with one process on the same global batch.

With ``randomness: per_sample`` a sample's noise, timestep and caption dropout depend on the seed, the epoch
and its index alone, so 1 process, 2 ranks, 4 ranks and 2 nodes x 2 compute the same losses; what differs is
the order of float sums (gradients reduced over ranks, FSDP's reduce-scatter): weights agree to 2e-6, not
bit for bit. Every launch has a watchdog (``tests.ranks``): a hang fails in a bounded time with every rank's
stack.

The runs, 16 samples a batch on the 16 px bucket (12 batches an epoch), checkpoints every 2 batches, EMA from
batch 1, validation (3 held-out samples one at a time) and a preview grid through the EMA weights every 2:
- one process to batch 6: the reference;
- 2 ranks, FSDP SHARD_GRAD_OP (the configs'), to batch 4;
- 1 node x 4 ranks, FULL_SHARD (rank 3 has no held-out sample), with sharded checkpoints
  (``fsdp_state_dict_type: sharded``), SIGKILLed while it saves batch 4, then resumed on 2 ranks past a torn
  newer checkpoint folder to batch 6 (4 -> 2, DCP resharding);
- the 2-rank run's batch 4 (a full checkpoint) resumed on 2 nodes x 2 ranks with HYBRID_SHARD, each node with
  its own /dev/shm, to batch 6 (2 -> 4).
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from ..conftest import REPO, tiny_overrides
from ..ranks import BIN, dwb_train_on_ranks, finish, kill_ranks, launch, run_nodes

CONFIG = REPO / "configs" / "tiny-phase1.yaml"
WEIGHTS_ATOL = 2e-6  # float sums in another order, over 6 steps of a tiny UNet (1 vs 2 ranks: 1.2e-7 measured)


@dataclass
class Run:
    folder: Path  # its checkpoints
    overrides: list[str]
    stdout: str = ""


def run_overrides(shapes_data, components, folder, **extra) -> list[str]:
    keys = {"global_train_batch_size": 16, "device_train_microbatch_size": 4, "max_duration": "6ba",
            "save_interval": "2ba", "run_name": "scale", "randomness": "per_sample", "autoresume": "true",
            "ema.enabled": "true", "ema.ema_start": "1ba", "eval_interval": "2ba",
            "validation.path": shapes_data / "eval" / "32", "validation.max_samples": 3, "validation.batch_size": 1,
            "validation.timesteps": "[100,900]", "preview_interval": "2ba", "previews.steps": 2,
            "previews.ema": "true", "previews.prompts": "['a red circle']", "previews.seeds": "[0]"}
    keys.update(extra)
    return tiny_overrides(shapes_data, components, folder, **keys)


def on_ranks(overrides: list[str], nproc: int) -> str:
    run = dwb_train_on_ranks(CONFIG, overrides, nproc=nproc)
    assert run.returncode == 0 and not run.hung, run.explain()
    return run.stdout


@pytest.fixture(scope="module")
def one_process(shapes_data, components, tmp_path_factory) -> Run:
    from train.config import load_config
    from train.trainer import train

    folder = tmp_path_factory.mktemp("scale") / "one" / "checkpoints"
    overrides = run_overrides(shapes_data, components, folder)
    train(load_config(CONFIG, overrides))
    return Run(folder, overrides)


@pytest.fixture(scope="module")
def two_ranks(shapes_data, components, tmp_path_factory) -> Run:
    folder = tmp_path_factory.mktemp("scale") / "two" / "checkpoints"
    overrides = run_overrides(shapes_data, components, folder, fsdp="true", max_duration="4ba")
    return Run(folder, overrides, on_ranks(overrides, 2))


@pytest.fixture(scope="module")
def four_ranks_killed(shapes_data, components, tmp_path_factory) -> Run:
    """1 node x 4 ranks, FULL_SHARD, each checkpoint a folder of DCP parts written by every rank, SIGKILLed
    (launcher and ranks) once it has begun to save batch 4, so batch 2's folder is whole."""
    folder = tmp_path_factory.mktemp("scale") / "four" / "checkpoints"
    overrides = run_overrides(shapes_data, components, folder, fsdp="true", fsdp_sharding_strategy="FULL_SHARD",
                              fsdp_state_dict_type="sharded", max_duration="12ba")
    proc = launch([str(BIN / "dwb"), "train", str(CONFIG), *map(str, overrides)], nproc=4)
    deadline = time.monotonic() + 240
    while not (folder / "ep0-ba4").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)
    kill_ranks(proc)  # batch 4's folder may be cut short: the resume must choose batch 2 or a whole batch 4
    assert (folder / "ep0-ba2" / ".metadata").exists(), finish(proc).explain()
    return Run(folder, overrides, proc.stdout.read() if proc.stdout and not proc.stdout.closed else "")


def weights_of(path: Path, ema: bool, denoiser: str = "unet") -> dict[str, torch.Tensor]:
    from models.checkpoints import model_weights, read_checkpoint

    return {k: v for k, v in model_weights(read_checkpoint(path), ema=ema).items() if k.startswith(denoiser + ".")}


def assert_same_weights(a: Path, b: Path, denoiser: str = "unet") -> None:
    for ema in (False, True):
        wa, wb = weights_of(a, ema, denoiser), weights_of(b, ema, denoiser)
        assert wa, f"no {denoiser} weights in {a}"
        assert wa.keys() == wb.keys()
        worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
        assert worst <= WEIGHTS_ATOL, f"{'EMA' if ema else 'raw'} weights differ by {worst:.3g}"


def assert_same_figures(a: Path, b: Path) -> None:
    """The validation figures each run's callback saved (raw and EMA, per band) and its cost."""
    from models.checkpoints import read_checkpoint

    ca, cb = read_checkpoint(a), read_checkpoint(b)
    va, vb = ca["callbacks"]["ValidationLoss"]["last"], cb["callbacks"]["ValidationLoss"]["last"]
    assert set(va) == set(vb) and len(va) == 7 and va["batch"] == vb["batch"]
    for key in va:
        assert va[key] == pytest.approx(vb[key], rel=1e-5), key
    if va["batch"] > 2:  # EMA starts after batch 1 with a copy of the weights, and first differs at batch 3
        assert va["validation_ema/loss"] != va["validation/loss"]
    ta, tb = ca["timestamp"]["Timestamp"], cb["timestamp"]["Timestamp"]
    assert (ta["batch"], ta["sample"], ta["epoch"]) == (tb["batch"], tb["sample"], tb["epoch"])


def assert_same_preview(a: Path, b: Path, name: str) -> None:
    """The grid drawn at a batch: the same image, to float rounding (within 2 of 255 per channel)."""
    import numpy as np
    from PIL import Image

    pa, pb = (np.asarray(Image.open(f.parent.parent / "previews" / name).convert("RGB"), dtype=int) for f in (a, b))
    assert pa.shape == pb.shape and np.abs(pa - pb).max() <= 2


@pytest.mark.slow
def test_fsdp_on_two_ranks_equals_one_process(one_process, two_ranks):
    """Weights, EMA weights, validation figures (rank 0 has 2 held-out batches, rank 1 one, padded to 2), the
    previews (drawn through the EMA weights gathered on every rank), cost and position at batches 2 and 4."""
    from models.checkpoints import read_checkpoint

    for name in ("ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt"):
        assert_same_weights(two_ranks.folder / name, one_process.folder / name)
        assert_same_figures(two_ranks.folder / name, one_process.folder / name)
        assert_same_preview(two_ranks.folder / name, one_process.folder / name, name.split("-")[1] + ".png")
    cost = read_checkpoint(two_ranks.folder / "ep0-ba4-rank0.pt")["callbacks"]["RunCost"]
    assert cost["gpu_hours_total"] > 0  # two processes' hours, counted once each
    assert "1/2)" in two_ranks.stdout and "FSDP SHARD_GRAD_OP" in two_ranks.stdout


@pytest.mark.slow
def test_four_ranks_killed_then_resumed_on_two_end_where_one_process_does(one_process, four_ranks_killed,
                                                                          tmp_path):
    """4 -> 2 with sharded checkpoints: the killed FULL_SHARD run's batch 2 is a folder of one part per rank (no
    gather on rank 0; rank 3 had no held-out sample, padded) that reads, consolidated, as one process's batch 2.
    A newer folder whose part was cut short is set aside, and 2 ranks resume from batch 2 (DCP reshards each
    weight from 4 chunks to 2) to end at batch 6 with the weights, EMA, figures, preview and global position of
    the uninterrupted process (Streaming's canonical nodes keep the global order; per-sample draws the noise)."""
    ba2 = four_ranks_killed.folder / "ep0-ba2"
    assert sorted(p.name for p in ba2.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    assert_same_weights(ba2, one_process.folder / "ep0-ba2-rank0.pt")
    assert_same_figures(ba2, one_process.folder / "ep0-ba2-rank0.pt")
    folder = tmp_path / "resumed" / "checkpoints"
    shutil.copytree(four_ranks_killed.folder, folder, symlinks=True)
    shutil.rmtree(folder / "ep0-ba4", ignore_errors=True)  # as the kill left it: whole, cut short or not begun
    torn = Path(shutil.copytree(ba2, folder / "ep0-ba4")) / "__1_0.distcp"
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
    out = on_ranks(run_overrides_like(four_ranks_killed, folder, fsdp_sharding_strategy="SHARD_GRAD_OP",
                                      max_duration="6ba"), 2)
    assert "resuming at batch 2" in out and "(1/2)" in out
    assert (folder / "ep0-ba4.corrupt").is_dir()
    assert_same_weights(folder / "ep0-ba6", one_process.folder / "ep0-ba6-rank0.pt")
    assert_same_figures(folder / "ep0-ba6", one_process.folder / "ep0-ba6-rank0.pt")
    assert_same_preview(folder / "ep0-ba6", one_process.folder / "ep0-ba6-rank0.pt", "ba6.png")


@pytest.mark.slow
def test_two_ranks_resumed_on_two_nodes_of_two_with_hybrid_shard(one_process, two_ranks, tmp_path):
    """2 -> 4 across nodes: the 2-rank run's batch 4 resumed by 2 launchers of 2 processes on 127.0.0.1, each
    node with its own /dev/shm as separate machines have. HYBRID_SHARD shards within a node (each rank holds
    1/2 of the UNet) and replicates across nodes; the run ends at batch 6 where one process does."""
    folder = tmp_path / "nodes" / "checkpoints"
    shutil.copytree(two_ranks.folder, folder, symlinks=True)
    overrides = run_overrides_like(two_ranks, folder, fsdp_sharding_strategy="HYBRID_SHARD", max_duration="6ba")
    nodes = run_nodes([str(BIN / "dwb"), "train", str(CONFIG), *map(str, overrides)], nodes=2, nproc=2)
    for node in nodes:
        assert node.returncode == 0 and not node.hung, node.explain()
    assert "resuming at batch 4" in nodes[0].stdout
    assert "FSDP HYBRID_SHARD: node 0's rank 0 holds" in nodes[0].stdout and "(1/2)" in nodes[0].stdout
    assert "FSDP HYBRID_SHARD: node 1's rank 2 holds" in nodes[1].stdout and "(1/2)" in nodes[1].stdout
    assert_same_weights(folder / "ep0-ba6-rank0.pt", one_process.folder / "ep0-ba6-rank0.pt")
    assert_same_figures(folder / "ep0-ba6-rank0.pt", one_process.folder / "ep0-ba6-rank0.pt")
    assert_same_preview(folder / "ep0-ba6-rank0.pt", one_process.folder / "ep0-ba6-rank0.pt", "ba6.png")


def run_overrides_like(run: Run, folder: Path, **changes) -> list[str]:
    """``run``'s overrides with its save_folder moved to ``folder`` and ``changes`` applied."""
    changed = {"save_folder": folder, **changes}
    kept = [o for o in run.overrides if o.split("=", 1)[0] not in changed]
    return kept + [f"{k}={v}" for k, v in changed.items()]


@pytest.mark.slow
def test_two_nodes_sharing_dev_shm_are_told_what_is_wrong(shapes_data, components, tmp_path):
    """Two "nodes" on one machine without their own /dev/shm: Streaming's per-node state collided and a rank
    waited 300 s to fail with "cannot open the training data". Now every rank stops at once with the cause."""
    overrides = tiny_overrides(shapes_data, components, tmp_path / "c", max_duration="2ba", save_interval="2ba",
                               global_train_batch_size=16, device_train_microbatch_size=8)
    started = time.monotonic()
    nodes = run_nodes([str(BIN / "dwb"), "train", str(CONFIG), *overrides], nodes=2, nproc=1, hang_after=90,
                      private_shm=False)
    assert time.monotonic() - started < 90
    for n, node in enumerate(nodes):
        assert node.returncode != 0 and not node.hung, node.explain()
        assert f"error: node {n} shares /dev/shm with node {1 - n}: Streaming keeps each node's state there" in \
            node.stderr, node.stderr[-2000:]


@pytest.mark.slow
def test_a_nan_on_one_rank_under_fsdp_skips_the_update_on_every_rank(shapes_data, components, tmp_path):
    """Rank 1 alone sees a NaN loss at batch 3 of 4: both ranks' guards skip that update (Adam took 3 steps of
    4 on every shard) and the run goes on; no rank steps alone."""
    import json

    from ..ranks import run_ranks

    overrides = tiny_overrides(shapes_data, components, tmp_path / "c", max_duration="4ba", save_interval="4ba",
                               global_train_batch_size=16, device_train_microbatch_size=8, fsdp="true")
    run = run_ranks([str(REPO / "tests" / "train" / "fsdp_guard.py"), str(tmp_path / "guard"), str(CONFIG),
                     *overrides], nproc=2)
    assert run.returncode == 0 and not run.hung, run.explain()
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"guard.rank{rank}").read_text())
        assert seen == {"skipped": 1, "consecutive": 0, "adam_steps": [3]}, (rank, seen)


@pytest.mark.slow
def test_the_transformer_under_fsdp_on_two_ranks_equals_one_process(shapes_data, components, tmp_path):
    """The tiny MMDiT with rectified flow, one FSDP unit per joint block (FULL_SHARD), on 2 ranks: the weights (raw
    and EMA) and the validation figures of one process, as the UNet's."""
    from train.config import load_config
    from train.trainer import train

    mmdit = REPO / "configs" / "tiny-mmdit-phase1.yaml"
    one, two = tmp_path / "one" / "checkpoints", tmp_path / "two" / "checkpoints"
    train(load_config(mmdit, run_overrides(shapes_data, components, one, max_duration="2ba", preview_interval="null")))
    out = dwb_train_on_ranks(mmdit, run_overrides(shapes_data, components, two, max_duration="2ba", fsdp="true",
                                                  fsdp_sharding_strategy="FULL_SHARD", preview_interval="null"), nproc=2)
    assert out.returncode == 0 and not out.hung, out.explain()
    assert "SD3Transformer2DModel's" in out.stdout and "1/2)" in out.stdout
    assert_same_weights(two / "ep0-ba2-rank0.pt", one / "ep0-ba2-rank0.pt", denoiser="transformer")
    assert_same_figures(two / "ep0-ba2-rank0.pt", one / "ep0-ba2-rank0.pt")
