"""`composer -n 2` on CPU (gloo): training with autoresume, distributed precompute, rank-independent data order."""
import json
import runpy
import sys
from pathlib import Path

import pytest

from ..conftest import REPO, tiny_overrides
from ..ranks import RankRun, run_ranks

BIN = Path(sys.executable).parent


def _composer(*args) -> RankRun:
    """``composer -n 2 ARGS`` to its end, in a bounded time with each rank's stack on a hang (``tests.ranks``)."""
    return run_ranks([str(a) for a in args], 2, hang_after=300)


def _two_rank_overrides(shapes_data, components, folder) -> list[str]:
    """Two ranks of 24 on 192 samples: 4-batch epochs, 6 batches; validation on 16 held-out samples at batch 6."""
    return tiny_overrides(shapes_data, components, folder, save_interval="2ba", autoresume="true", run_name="ddp",
                          global_train_batch_size=48, device_train_microbatch_size=24, max_duration="6ba",
                          eval_interval="6ba", **{"ema.enabled": "true", "ema.ema_start": "1ba",
                                                  "validation.path": shapes_data / "eval" / "32",
                                                  "validation.max_samples": 16, "validation.timesteps": "[100,500,900]"})


def _train_on_two_ranks(over: list[str]) -> RankRun:
    return _composer(str(BIN / "dwb"), "train", str(REPO / "configs/tiny-phase1.yaml"), *over)


@pytest.fixture(scope="module")
def two_rank_run(shapes_data, components, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ddp") / "whole"
    whole = _train_on_two_ranks(_two_rank_overrides(shapes_data, components, folder))
    assert whole.returncode == 0, whole.explain()
    return folder


@pytest.mark.slow
def test_two_process_training_resumes_bit_identically_from_an_epochs_last_batch(two_rank_run, shapes_data, components,
                                                                                tmp_path):
    """Resuming from ba4 (an epoch's last batch) ends where an uninterrupted run does, in model, EMA and optimizer
    state."""
    from .test_resilience import differing

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    for name in ("ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt"):
        (resumed / name).write_bytes((two_rank_run / name).read_bytes())
    again = _train_on_two_ranks(_two_rank_overrides(shapes_data, components, resumed))
    assert again.returncode == 0, again.explain()
    assert "resuming at batch 4" in again.stdout
    from models.checkpoints import read_checkpoint

    ts = read_checkpoint(resumed / "ep1-ba6-rank0.pt")["timestamp"]["Timestamp"]
    assert ts["batch"] == 6 and ts["sample"] == 288  # global batch 48 = 2 ranks x 24
    assert differing(resumed / "ep1-ba6-rank0.pt", two_rank_run / "ep1-ba6-rank0.pt") == []


@pytest.mark.slow
def test_validation_loss_on_two_ranks_equals_one_process(two_rank_run, shapes_data, components):
    """Each rank measured every other held-out sample and the sums were gathered: the figures the 2-rank run's
    callback saved equal this one process's, measured on the whole split, to float tolerance."""
    from train.callbacks import read_held_out, validation_figures
    from models.checkpoints import model_weights, read_checkpoint
    from train.config import load_config
    from train.trainer import build_model

    checkpoint = read_checkpoint(two_rank_run / "ep1-ba6-rank0.pt")  # the last: saved with its EMA weights in
    saved = checkpoint["callbacks"]["ValidationLoss"]["last"]
    cfg = load_config(REPO / "configs/tiny-phase1.yaml", _two_rank_overrides(shapes_data, components, two_rank_run))
    model = build_model(cfg)
    v = cfg.validation
    held = read_held_out(v.path, cfg.data.resolution, v.max_samples, 0, 1)
    assert saved["batch"] == 6 and len(held.indices) == 16
    for ema, prefix in ((False, "validation"), (True, "validation_ema")):  # DDP's names in the EMA state, mapped
        weights = model_weights(checkpoint, ema=ema)
        model.unet.load_state_dict({k[len("unet."):]: w for k, w in weights.items() if k.startswith("unet.")})
        one = validation_figures(model, held, v.timesteps, v.seed, v.batch_size, prefix)
        assert len(one) == 4
        for key, value in one.items():
            assert saved[key] == pytest.approx(value, rel=1e-5), key
    assert saved["validation_ema/loss"] != saved["validation/loss"]


@pytest.mark.slow
def test_each_ddp_rank_holds_what_its_memory_plan_says(two_rank_run):
    """DDP on 2 ranks: each rank held the whole UNet, its gradients twice (DDP's buckets copy them), AdamW state, the
    EMA and the frozen parts, as the plan the run was admitted with said (within 5%)."""
    from .memory_plan import assert_each_rank_holds_its_plan

    for report in assert_each_rank_holds_its_plan(two_rank_run.parent, 2):
        assert report["held"]["gradients"] >= 1.9 * report["held"]["weights"]


@pytest.mark.slow
def test_two_process_precompute_equals_one_process(shapes_data, components, tmp_path):
    from streaming import LocalDataset

    from train.data.precompute import precompute_latents

    args = ["data", "precompute", str(shapes_data), "--pretrained", str(components), "--resolution", "16",
            "--chunk-size", "40"]
    two = _composer(str(BIN / "dwb"), *args[:2], args[2], str(tmp_path / "two"), *args[3:])
    assert two.returncode == 0, two.explain()
    precompute_latents(str(shapes_data), str(tmp_path / "one"), vae_ref=str(components), text_encoder_ref=str(components),
               resolutions=[16], chunk_size=40, progress=False)
    a = LocalDataset(local=str(tmp_path / "one" / "16"))
    b = LocalDataset(local=str(tmp_path / "two" / "16"))
    assert len(a) == len(b) == 192
    for i in range(192):
        assert all(a[i][k].tobytes() == b[i][k].tobytes() for k in ("latent_mean", "latent_std", "text"))


@pytest.mark.slow
def test_global_sample_order_is_the_same_for_one_and_two_ranks(shapes_data, tmp_path, monkeypatch):
    """Elastic determinism: global batch k holds the same samples whatever the number of ranks."""
    script = str(REPO / "tests" / "train" / "sample_order.py")
    keys = ["resolution=16", f"streams=[{{path: {shapes_data / '16'}, proportion: 0.5}}, "
                             f"{{path: {shapes_data / '32'}, proportion: 0.5}}]"]
    monkeypatch.setattr(sys, "argv", [script, str(tmp_path / "one"), "6", "16", *keys])
    runpy.run_path(script, run_name="__main__")  # one rank: this process (no launcher, world size 1)
    two = _composer(script, str(tmp_path / "two"), "6", "16", *keys)
    assert two.returncode == 0, two.explain()
    single = json.loads((tmp_path / "one.rank0").read_text())
    ranks = [json.loads((tmp_path / f"two.rank{r}").read_text()) for r in (0, 1)]
    assert len(single) == 6
    for k in range(6):
        assert sorted(single[k]) == sorted(ranks[0][k] + ranks[1][k])
    assert len({i for batch in single for i in batch}) == 96  # no sample twice within the epoch
    assert any(i >= 192 for batch in single for i in batch)  # both streams contribute
