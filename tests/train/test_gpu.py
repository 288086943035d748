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
    assert ema.ema_model is not None  # the EMA copy was built from the full (gathered) weights
    assert all(torch.isfinite(t).all() for t in ema.ema_model.named_parameters_dict.values())
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
