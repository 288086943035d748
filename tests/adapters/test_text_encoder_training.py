"""A LoRA trained on the text tower beside the denoiser's (``adapter.text_encoders: true``), on the tiny SD 2 base
written by diffusers' ``save_pretrained``: the checkpoint holds both adapters, their AdamW state and EMA; `dwb export`
writes the tower's LoRA beside the UNet's in the diffusers layout (``text_encoder.``) and the kohya layout
(``lora_te_``), and plain diffusers' ``load_lora_weights`` of each file on the untouched base draws the trained
model's image, which the tower's LoRA changes; a run SIGKILLed after a checkpoint resumes to the same bits."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from safetensors import safe_open

from models.errors import WorkbenchError

from .adapted import draw
from .conftest import adapter_keys, killed_and_resumed

ATOL = 1e-5  # the same weights through each file: float rounding


@pytest.fixture(scope="module")
def text_run(shapes_data, sd2_folder, tmp_path_factory):
    """(the run's overrides, its last checkpoint): 4 batches of 4, checkpointed after 2 and 4, the UNet's and the
    text tower's LoRA."""
    from train.config import load_config
    from train.trainer import train

    folder = tmp_path_factory.mktemp("lora-te") / "checkpoints"
    keys = adapter_keys(shapes_data, sd2_folder, folder, **{"adapter.text_encoders": "true",
                                                            "model.caption_dropout": 0})
    train(load_config(None, keys))
    return keys, folder / "ep0-ba4-rank0.pt"


def test_the_checkpoint_holds_the_towers_lora_its_optimizer_state_and_ema(text_run):
    from ..train.test_resilience import training_state

    state = training_state(text_run[1])
    tower = [k for k in state if k.startswith("model.text_encoder.")]
    assert tower and all(".lora_" in k for k in tower)
    assert {"ema." + k[len("model."):] for k in tower} <= set(state)
    assert max(state[k].abs().max().item() for k in tower if "lora_B" in k) > 0  # it trained (B starts at zero)
    assert len([k for k in state if k.startswith("adamw.") and k.endswith(".exp_avg")]) == \
        len([k for k in state if k.startswith("model.")])


def test_plain_diffusers_draws_the_trained_image_with_the_towers_lora_from_each_exported_file(text_run, sd2_folder,
                                                                                             dwb, tmp_path):
    import diffusers

    from models.checkpoints import model_weights, read_checkpoint
    from train.config import load_config
    from train.trainer import build_model

    keys, checkpoint = text_run
    model = build_model(load_config(None, keys))
    model.load_state_dict(model_weights(read_checkpoint(checkpoint), ema=True), strict=False)
    base = diffusers.StableDiffusionPipeline.from_pretrained(sd2_folder)
    base.set_progress_bar_config(disable=True)
    trained = type(base)(**{**base.components, "unet": model.unet.eval(), "text_encoder": model.text_encoder})
    want = draw(trained, "sd2")
    model.text_encoder.disable_adapters()
    assert np.abs(draw(trained, "sd2") - want).max() > 0.02, "the tower's LoRA changed no pixel"
    model.text_encoder.enable_adapters()
    for layout, prefix in (("diffusers", "text_encoder."), ("kohya", "lora_te_")):
        out = tmp_path / f"{layout}.safetensors"
        done = dwb("export", str(checkpoint), str(out), "--layout", layout)
        assert done.returncode == 0, done.stderr
        with safe_open(out, "pt") as f:
            assert any(k.startswith(prefix) for k in f.keys())
        loaded = type(base)(**{**base.components, "unet": copy.deepcopy(base.unet),
                               "text_encoder": copy.deepcopy(base.text_encoder)})
        loaded.load_lora_weights(out)
        np.testing.assert_allclose(draw(loaded, "sd2"), want, atol=ATOL, err_msg=layout)


@pytest.mark.slow  # a `dwb train` process killed at its first checkpoint: 18 s
def test_a_run_with_the_towers_lora_sigkilled_after_a_checkpoint_resumes_bit_identically(text_run, tmp_path):
    """The run of ``text_run`` killed after its checkpoint at 2 batches and resumed to 4: the same weights of both
    adapters, their EMA and AdamW state, bit for bit."""
    from ..train.test_resilience import differing, training_state

    keys, reference = text_run
    resumed = killed_and_resumed(keys, tmp_path / "checkpoints")
    assert any(k.startswith("model.text_encoder.") for k in training_state(reference))  # the tower's LoRA compared
    assert differing(resumed, reference) == []


@pytest.mark.parametrize("extra, why", [({"adapter.type": "dora"}, "is LoRA"),
                                        ({"fsdp": "true"}, "trains in one process")])
def test_a_towers_adapter_it_cannot_train_is_refused_in_one_line(extra, why, sd2_folder, tmp_path):
    from train.config import load_config

    keys = [f"{k}={v}" for k, v in {"model.init_from": sd2_folder, "adapter.type": "lora", "data.path": "unused",
                                    "adapter.text_encoders": "true", **extra}.items()]
    with pytest.raises(WorkbenchError, match=rf"^config key 'adapter.text_encoders': the text towers' adapter {why}"
                                             r"[^\n]*$"):
        load_config(None, keys)
