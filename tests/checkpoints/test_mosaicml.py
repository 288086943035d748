"""mosaicml/diffusion's Composer checkpoints as its runs wrote them: fp16 VAE and text encoder, the
``position_ids`` buffer transformers before 4.31 saved, Composer's EMA, no prediction type or latent scale
unless the run kept its config; written by a real Composer Trainer."""
import logging

import numpy as np
import pytest
import torch

from models.checkpoints import describe, find_checkpoint, load_pipeline
from models.errors import CheckpointError, WorkbenchError
from models.generation.images import Settings, generate_images

from .test_door import _mosaicml_parts

PROMPT = "two red circles left of a blue square"
SETTINGS = Settings(steps=3, guidance=3.0, width=32, height=32, sampler="DDIM")
LATENT_STD = 5.489980785067252  # mosaicml/diffusion's default: 1 / 0.18215


def write_mosaicml_checkpoint(path, *, config: dict | None = None, stray: bool = False):
    """Two training batches of a StableDiffusion-like ComposerModel under Composer's EMA, saved by the Trainer.
    Like mosaicml/diffusion's: the VAE and text encoder frozen in float16 (``encode_latents_in_fp16``), the
    text model's ``position_ids`` a saved buffer (transformers < 4.31); ``config`` is kept by a callback."""
    from composer import Callback, Trainer
    from composer.algorithms import EMA
    from composer.models import ComposerModel

    class StableDiffusion(ComposerModel):
        def __init__(self, unet, vae, text_encoder):
            super().__init__()
            self.unet, self.vae, self.text_encoder = unet, vae, text_encoder

        def forward(self, batch):
            return self.unet.conv_in(batch[0] if isinstance(batch, (list, tuple)) else batch)

        def loss(self, outputs, batch):
            return outputs.square().mean()

    class RunConfig(Callback):
        def state_dict(self):
            return {"config": config}

    unet, vae, text_encoder = _mosaicml_parts()
    for frozen in (vae, text_encoder):
        frozen.requires_grad_(False)
        frozen.half()
    embeddings = text_encoder.text_model.embeddings
    embeddings.register_buffer("position_ids", torch.arange(77).expand((1, -1)), persistent=True)
    if stray:
        unet.register_parameter("stray", torch.nn.Parameter(torch.zeros(3)))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 4, 8, 8)), batch_size=2)
    trainer = Trainer(model=StableDiffusion(unet, vae, text_encoder), train_dataloader=data, max_duration="2ba",
                      optimizers=torch.optim.SGD(unet.parameters(), lr=0.5), device="cpu", progress_bar=False,
                      log_to_console=False, algorithms=[EMA(half_life=None, smoothing=0.5, ema_start="0ba", update_interval="1ba")],
                      callbacks=[RunConfig()] if config else [], save_folder=None)
    trainer.fit()
    trainer.save_checkpoint(str(path))
    trainer.close()
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("mosaicml-old")
    return {"plain": write_mosaicml_checkpoint(root / "plain" / "ep0-ba2-rank0.pt"),
            "recorded": write_mosaicml_checkpoint(root / "recorded" / "ep0-ba2-rank0.pt", config={
                "model": {"name": "stable_diffusion_2", "prediction_type": "v_prediction", "latent_std": LATENT_STD}})}


def saved(path) -> dict:
    """The checkpoint as torch reads it whole (with its pickled objects): what the workbench must match."""
    return torch.load(path, map_location="cpu", weights_only=False)["state"]


def reference_pipeline(weights: dict, prediction_type: str):
    """Plain diffusers parts with the checkpoint's weights (float32), the SD2 tokenizer."""
    import tempfile
    from pathlib import Path

    from diffusers import StableDiffusionPipeline
    from transformers import CLIPTokenizer

    from models.checkpoints import inference_scheduler
    from models.checkpoints.spec_from_weights import sd2_tokenizer_files

    unet, vae, text_encoder = _mosaicml_parts()
    for name, module in (("unet", unet), ("vae", vae), ("text_encoder", text_encoder)):
        module.load_state_dict({k[len(name) + 1:]: v.float() for k, v in weights.items()
                                if k.startswith(name + ".") and not k.endswith("position_ids")})
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in sd2_tokenizer_files().items():
            (Path(tmp) / name).write_text(text)
        tokenizer = CLIPTokenizer.from_pretrained(tmp)
    return StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                   scheduler=inference_scheduler(prediction_type), safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)


@pytest.mark.slow  # four pipelines built and sampled: 70 s at load 10+ on 2 cores
def test_an_old_checkpoint_opens_with_position_ids_dropped_and_fp16_parts_taken(checkpoints, caplog):
    path = checkpoints["plain"]
    state = saved(path)
    assert state["model"]["vae.encoder.conv_in.weight"].dtype == torch.float16
    assert "text_encoder.text_model.embeddings.position_ids" in state["model"]
    [(name, ema)] = state["algorithms"]
    assert name == "EMA" and ema["ema_started"]
    found = find_checkpoint(path)
    assert found.kind == "mosaicml" and describe(found).has_ema
    with caplog.at_level(logging.WARNING, logger="checkpoints"):
        raw = load_pipeline(found)
    notes = [r.getMessage() for r in caplog.records]
    assert any("dropped text_encoder.text_model.embeddings.position_ids" in n for n in notes)
    assert any("does not record its prediction type: read as epsilon (pass --prediction-type" in n for n in notes)
    assert np.array_equal(generate_images(raw, [PROMPT], [2], SETTINGS),
                          generate_images(reference_pipeline(state["model"], "epsilon"), [PROMPT], [2], SETTINGS))
    ema_weights = {**state["model"], **ema["ema_model"]["named_parameters_dict"]}  # EMA swaps in for saving
    assert not ema["ema_weights_active"]
    ours = generate_images(load_pipeline(found, ema=True), [PROMPT], [2], SETTINGS)
    assert np.array_equal(ours, generate_images(reference_pipeline(ema_weights, "epsilon"), [PROMPT], [2], SETTINGS))
    assert ours.std() > 1


def test_flags_say_what_the_file_cannot_and_a_recorded_config_is_read(checkpoints):
    plain = load_pipeline(checkpoints["plain"], settings={"prediction_type": "v_prediction", "latent_scale": 0.13})
    assert plain.scheduler.config.prediction_type == "v_prediction" and plain.vae.config.scaling_factor == 0.13
    recorded = load_pipeline(checkpoints["recorded"])
    assert recorded.scheduler.config.prediction_type == "v_prediction"
    assert recorded.vae.config.scaling_factor == pytest.approx(1 / LATENT_STD)
    with pytest.raises(CheckpointError, match="records prediction_type v_prediction; --prediction-type epsilon "
                                              "contradicts it"):
        load_pipeline(checkpoints["recorded"], settings={"prediction_type": "epsilon"})


@pytest.mark.slow  # 35 s at load 10+ on 2 cores
def test_an_old_checkpoint_exports_to_a_single_file_with_its_settings(checkpoints, tmp_path, dwb):
    import yaml
    from safetensors.torch import load_file

    out = tmp_path / "old.safetensors"
    run = dwb("export", str(checkpoints["plain"]), str(out), "--ema", "--prediction-type", "v_prediction")
    assert run.returncode == 0, run.stderr
    params = yaml.safe_load(out.with_suffix(".yaml").read_text())["model"]["params"]
    assert params["parameterization"] == "v" and params["scale_factor"] == 0.18215
    weights = load_file(out)
    assert all(t.dtype == torch.float32 for t in weights.values())  # fp16 parts, written as float32
    assert not any("position_ids" in k for k in weights)
    state = saved(checkpoints["plain"])
    averaged = state["algorithms"][0][1]["ema_model"]["named_parameters_dict"]  # the trained UNet's
    assert torch.equal(weights["model.diffusion_model.input_blocks.0.0.weight"], averaged["unet.conv_in.weight"])
    assert not torch.equal(averaged["unet.conv_in.weight"], state["model"]["unet.conv_in.weight"])
    assert torch.equal(weights["first_stage_model.encoder.conv_in.weight"],
                       state["model"]["vae.encoder.conv_in.weight"].float())
    ours = load_pipeline(out)
    assert ours.scheduler.config.prediction_type == "v_prediction"
    settings = {"prediction_type": "v_prediction"}
    assert np.array_equal(generate_images(ours, [PROMPT], [3], SETTINGS), generate_images(
        load_pipeline(checkpoints["plain"], ema=True, settings=settings), [PROMPT], [3], SETTINGS))


def test_a_weight_that_does_not_fit_is_named(tmp_path):
    path = write_mosaicml_checkpoint(tmp_path / "ep0-ba2-rank0.pt", stray=True)
    with pytest.raises(CheckpointError, match="the unet weights do not match the model spec "
                                              "\\(Unexpected key\\(s\\) in state_dict: \"stray\""):
        load_pipeline(path)


def test_settings_flags_are_for_composer_checkpoints_only(sd2_folder):
    with pytest.raises(WorkbenchError, match="--prediction-type and --latent-scale are for Composer checkpoints"):
        load_pipeline(sd2_folder, settings={"prediction_type": "epsilon"})


def test_dwb_sample_draws_it_at_the_32_px_it_was_trained_at_as_plain_diffusers(checkpoints, tmp_path, dwb):
    """A regression a new user met: "Stable Diffusion 2.x trained at 128 px draws sides from 64 to 256; --size is
    32x32, outside them", for files that drew plain diffusers' pixels the turn before: the family's published range
    applied to a model that only shares its layout. The size rule refuses only a side off the family's step."""
    from PIL import Image

    out = tmp_path / "out.png"
    r = dwb("sample", str(checkpoints["plain"]), str(out), "--prompt", PROMPT, "--size", "32", "--steps", "1",
            "--guidance", "3", "--sampler", "DDIM", "--seed", "2", "--seeds", "1", "--weights", "raw", "--per-image")
    assert r.returncode == 0, r.stderr
    with Image.open(out.with_suffix("") / "00000-2.png") as png:
        ours = np.asarray(png.convert("RGB"))
    settings = Settings(steps=1, guidance=3.0, width=32, height=32, sampler="DDIM")
    plain = generate_images(reference_pipeline(saved(checkpoints["plain"])["model"], "epsilon"), [PROMPT], [2], settings)
    assert ours.shape == (32, 32, 3) and np.array_equal(ours, plain[0])
