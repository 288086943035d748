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
  (``fsdp_state_dict_type: sharded``), SIGKILLed while its ranks write batch 4's parts, then resumed on 2 ranks
  from the folder as the kill left it to batch 6 (4 -> 2, DCP resharding; the session's run, ``conftest.py``,
  whose 2-rank checkpoints ``test_sharded_checkpoints.py`` reads);
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
from ..ranks import BIN, dwb_train_on_ranks, run_nodes
from .memory_plan import assert_each_rank_holds_its_plan, memory_reports

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
def four_ranks_killed(killed_and_resumed) -> Run:
    """1 node x 4 ranks, FULL_SHARD, each checkpoint a folder of DCP parts written by every rank, SIGKILLed
    (launcher and ranks) while its ranks write batch 4's parts, so batch 2's folder is whole and batch 4's torn (the
    session's run, ``conftest.killed_and_resumed``)."""
    killed = killed_and_resumed["killed"]
    return Run(Path(killed["folder"]), killed["overrides"])


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
def test_each_of_two_fsdp_ranks_holds_half_of_the_ema(one_process, two_ranks):
    """The EMA is sharded where the weights are: the values of the EMA tensors each of the 2 FSDP ranks held, once
    EMA had started, are half of those one process held (the UNet's weights split in two; the buffers, a
    thousandth of them, whole on each rank), where each rank held a whole copy before."""
    [whole] = memory_reports(one_process.folder.parent, 1)
    for report in memory_reports(two_ranks.folder.parent, 2):
        share = report["held_values"]["ema"] / whole["held_values"]["ema"]
        assert abs(share - 0.5) < 0.01, f"rank {report['rank']} held {share:.3f} of the EMA"


@pytest.mark.slow
def test_each_rank_holds_what_its_memory_plan_says(one_process, four_ranks_killed):
    """One process, and 1 node x 4 ranks with FULL_SHARD: the weights, gradients, AdamW state, EMA, frozen parts
    (from the pretrained files' headers) and rank 0's preview copy each rank held, counted, are what the plan the
    run was admitted with said (within 5%)."""
    assert_each_rank_holds_its_plan(one_process.folder.parent, 1)
    reports = assert_each_rank_holds_its_plan(four_ranks_killed.folder.parent, 4)
    assert reports[0]["held"]["preview"] > 0 and not any(r["held"]["preview"] for r in reports[1:])


@pytest.mark.slow
def test_four_ranks_killed_then_resumed_on_two_end_where_one_process_does(one_process, four_ranks_killed,
                                                                          killed_and_resumed):
    """4 -> 2 with sharded checkpoints: the killed FULL_SHARD run's batch 2 is a folder of one part per rank (no
    gather on rank 0; rank 3 had no held-out sample, padded) that reads, consolidated, as one process's batch 2.
    The kill left batch 4's folder torn (parts begun, no index); resumed from the folder as the kill left it, 2 ranks
    pass it by and start from batch 2 (DCP reshards each weight from 4 chunks to 2), save batch 4 again over the torn
    one, and end at batch 6 with the weights, EMA, figures, preview and global position of the uninterrupted process
    (Streaming's canonical nodes keep the global order; per-sample draws the noise)."""
    ba2 = four_ranks_killed.folder / "ep0-ba2"
    assert sorted(p.name for p in ba2.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    assert_same_weights(ba2, one_process.folder / "ep0-ba2-rank0.pt")
    assert_same_figures(ba2, one_process.folder / "ep0-ba2-rank0.pt")
    torn = dict(killed_and_resumed["torn"])
    assert ".metadata" not in torn and any(name.endswith(".distcp") for name in torn), torn
    assert torn == {p.name: p.stat().st_size for p in (four_ranks_killed.folder / "ep0-ba4").iterdir()}
    resumed = killed_and_resumed["resumed"]
    folder, out = Path(resumed["folder"]), resumed["stdout"]
    assert "resuming at batch 2" in out and "(1/2)" in out
    for name in ("ep0-ba4", "ep0-ba6"):
        assert_same_weights(folder / name, one_process.folder / f"{name}-rank0.pt")
        assert_same_figures(folder / name, one_process.folder / f"{name}-rank0.pt")
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
    # HYBRID_SHARD shards over a node's 2 ranks, not the 4 of the run: each rank held half the UNet's state
    assert_each_rank_holds_its_plan(folder.parent, 4)


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


GROUP_TIMEOUT_S = 20  # the guard run's dist_timeout; rank 0 looks for a checkpoint to resume from 8 s longer


@pytest.fixture(scope="module")
def guard_run(shapes_data, components, tmp_path_factory) -> dict[int, dict]:
    """2 ranks, FSDP, 4 batches (``tests/train/fsdp_guard.py``): rank 1 alone sees a NaN loss at batch 3, and rank 0
    alone looks for a checkpoint to resume from for 28 s in a group whose collectives time out after 20 s; what
    each rank wrote, by rank."""
    import json

    from ..ranks import run_ranks

    folder = tmp_path_factory.mktemp("guard")
    overrides = tiny_overrides(shapes_data, components, folder / "c", max_duration="4ba", save_interval="4ba",
                               global_train_batch_size=16, device_train_microbatch_size=8, fsdp="true",
                               autoresume="true", dist_timeout=GROUP_TIMEOUT_S)
    run = run_ranks([str(REPO / "tests" / "train" / "fsdp_guard.py"), str(folder / "guard"), str(CONFIG),
                     *overrides], nproc=2, hang_after=240)
    assert run.returncode == 0 and not run.hung, run.explain()
    return {rank: json.loads((folder / f"guard.rank{rank}").read_text()) for rank in (0, 1)}


@pytest.mark.slow
def test_a_nan_on_one_rank_under_fsdp_skips_the_update_on_every_rank(guard_run):
    """Rank 1 alone sees a NaN loss at batch 3 of 4: both ranks' guards skip that update (Adam took 3 steps of
    4 on every shard) and the run goes on; no rank steps alone."""
    for rank, seen in guard_run.items():
        counted = {k: seen[k] for k in ("skipped", "consecutive", "adam_steps")}
        assert counted == {"skipped": 1, "consecutive": 0, "adam_steps": [3]}, (rank, seen)


@pytest.mark.slow
def test_ranks_wait_past_the_group_timeout_for_rank_0s_resume_check(guard_run):
    """Rank 0 alone took 28 s to choose the checkpoint to resume from, in a group whose collectives time out after
    20 s (``dist_timeout``): rank 1 waited for it longer than that timeout without aborting (the wait is
    ``patient``), and both ranks trained on to the end."""
    for rank, seen in guard_run.items():
        assert seen["group_timeout"] == GROUP_TIMEOUT_S, (rank, seen)
        [choosing] = seen["resume_choice_seconds"]
        assert choosing > GROUP_TIMEOUT_S, (rank, seen)


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
