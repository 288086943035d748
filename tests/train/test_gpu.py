"""Scale features that need a CUDA GPU; skipped with the reason on CPU machines."""
import pytest
import torch

from train.config import load_config
from train.trainer import build_trainer

from ..conftest import REPO, tiny_overrides

PHASE1 = REPO / "configs/tiny-phase1.yaml"
pytestmark = pytest.mark.gpu


def _fit(shapes_data, components, tmp_path, *extra):
    over = tiny_overrides(shapes_data, components, tmp_path / "ckpt", max_duration="3ba", save_interval="3ba") + list(extra)
    trainer = build_trainer(load_config(PHASE1, over + ["device=cuda"]))
    trainer.fit()
    return trainer


def test_bf16_low_precision_norms_and_sdpa(shapes_data, components, tmp_path):
    trainer = _fit(shapes_data, components, tmp_path, "precision=amp_bf16", "low_precision_norms=true",
                   "model.attention=sdpa")
    names = {type(m).__name__ for m in trainer.state.model.modules()}
    assert "LPGroupNorm" in names and "LPLayerNorm" in names  # UNet GroupNorms, text encoder LayerNorms
    assert all(torch.isfinite(p).all() for p in trainer.state.model.unet.parameters())
    trainer.close()


def test_fsdp_shard_grad_op_trains_and_checkpoints(shapes_data, components, tmp_path):
    trainer = _fit(shapes_data, components, tmp_path, "fsdp=true", "precision=amp_bf16", "ema.enabled=true")
    ema = next(a for a in trainer.state.algorithms if type(a).__name__ == "FusedEMA")
    assert ema.ema_started and ema.ema_model.shards  # the EMA of this rank's shards (on one GPU: all of them)
    assert all(torch.isfinite(t).all() for t in ema.ema_model.tensors())
    trainer.close()
    assert (tmp_path / "ckpt" / "ep0-ba3-rank0.pt").is_file()


def test_auto_microbatching_and_fp16(shapes_data, components, tmp_path):
    trainer = _fit(shapes_data, components, tmp_path, "device_train_microbatch_size=auto", "precision=amp_fp16")
    assert int(trainer.state.timestamp.batch) == 3
    trainer.close()


def test_attention_auto_prefers_xformers_when_installed(components):
    from train.trainer import set_attention
    from models.checkpoints.components import build_unet

    unet = build_unet("tiny").cuda()
    try:
        import xformers  # noqa: F401

        expected = "xformers"
    except ImportError:
        expected = "sdpa"
    assert set_attention(unet, "auto", "gpu") == expected


def test_the_guard_and_per_sample_draws_read_nothing_back(shapes_data, components, tmp_path):
    """CUDA's sync debug mode raises at any read back to the host: the guard's every event of three batches and a
    forward's per-sample draws run under it (the counters' first read is due at batch 100, the log interval). The
    loader pins its batches, whose images are uint8."""
    from train.recipes import Draws

    over = tiny_overrides(shapes_data, components, tmp_path / "ckpt", max_duration="3ba", save_interval="3ba")
    trainer = build_trainer(load_config(PHASE1, over + ["device=cuda", "precision=amp_bf16", "randomness=per_sample",
                                                        "log_interval=100ba"]))
    guard = next(a for a in trainer.state.algorithms if type(a).__name__ == "NonFiniteGuard")
    apply = guard.apply

    def strict(event, state, logger):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return apply(event, state, logger)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    guard.apply = strict
    trainer.fit()
    assert guard.skipped == 0 and int(trainer.state.timestamp.batch) == 3
    assert trainer.state.train_dataloader.pin_memory
    trainer.close()
    ids = torch.arange(16, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        draws = Draws.of_batch({"sample_id": ids, "epoch": torch.zeros_like(ids)}, seed=17)
        drawn = [draws.normal((16, 4, 8, 8), "cuda", torch.float32), draws.uniform(16, "cuda"),
                 draws.timesteps(1000, 16, "cuda")]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cpu = Draws(17, torch.zeros(16, dtype=torch.long), torch.arange(16))
    on_cpu = [cpu.normal((16, 4, 8, 8), "cpu", torch.float32), cpu.uniform(16, "cpu"), cpu.timesteps(1000, 16, "cpu")]
    # the same words on either device: uniforms and timesteps bit for bit, normals to float32's log and cos
    assert torch.equal(drawn[1].cpu(), on_cpu[1]) and torch.equal(drawn[2].cpu(), on_cpu[2])
    assert torch.allclose(drawn[0].cpu(), on_cpu[0], rtol=0, atol=1e-5)


def test_validation_and_previews_run_under_the_runs_autocast(shapes_data, components, tmp_path):
    """Under amp_bf16 every UNet call of validation and of the preview grid (eval mode) has autocast on, as
    training's calls do."""
    over = tiny_overrides(shapes_data, components, tmp_path / "ckpt", max_duration="2ba", save_interval="2ba")
    trainer = build_trainer(load_config(PHASE1, over + [
        "device=cuda", "precision=amp_bf16", "eval_interval=2ba", f"validation.path={shapes_data / 'eval' / '16'}",
        "validation.max_samples=2", "validation.timesteps=[100,900]", "preview_interval=2ba", "previews.steps=2",
        "previews.prompts=['a red circle']", "previews.seeds=[0]"]))
    calls = []
    trainer.state.model.unet.register_forward_pre_hook(
        lambda m, args: calls.append((m.training, torch.is_autocast_enabled("cuda"))))
    trainer.fit()
    trainer.close()
    evaluated = [autocast for training, autocast in calls if not training]
    assert len(evaluated) > 2 and all(evaluated) and any(training for training, _ in calls)
