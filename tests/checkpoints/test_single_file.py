"""Single-file checkpoints in the original SD layout: described from their keys, loaded offline through
diffusers' single-file loader, the same image as the same weights in a diffusers folder, and hostile or
foreign files refused in one line without running anything."""
from __future__ import annotations

import pathlib
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from models.checkpoints.single_file import (describe_single_file, is_single_file, load_single_file, text_tower_config,
                                            write_config_folder)
from models.errors import CheckpointError

from .fixtures import generate


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and len(message) < 400, message
    return message


@pytest.mark.parametrize("name, expected", [
    ("sd2", {"architecture": "sd2-v", "resolution": 32, "prediction_type": "v_prediction"}),
    ("sd2-ckpt", {"architecture": "sd2-v", "resolution": 32, "prediction_type": "v_prediction"}),
    ("sd1", {"architecture": "sd1", "resolution": 32, "prediction_type": "epsilon"}),
])
def test_describe_reads_the_sidecar_config(single_files, name, expected):
    path, _ = single_files[name]
    about = describe_single_file(path)
    assert {k: about[k] for k in expected} == expected
    assert about["original_config"] == str(path.with_suffix(".yaml"))


def test_without_a_sidecar_2x_is_read_as_base_and_1x_as_sd1(single_files, tmp_path):
    for name, architecture in (("sd2", "sd2-base"), ("sd1", "sd1")):
        alone = tmp_path / f"{name}.safetensors"
        shutil.copy(single_files[name][0], alone)
        about = describe_single_file(alone)
        assert (about["architecture"], about["resolution"], about["prediction_type"]) == (architecture, 512, "epsilon")
        assert pathlib.Path(about["original_config"]).parent.name == "configs"


@pytest.fixture(scope="module")
def folder_image():
    """The image of a diffusers folder with a given sampler, computed once per (folder, sampler)."""
    from diffusers import StableDiffusionPipeline

    images = {}

    def image(folder, scheduler):
        key = (folder, scheduler.to_json_string())
        if key not in images:
            pipe = StableDiffusionPipeline.from_pretrained(folder, safety_checker=None)
            pipe.scheduler = type(scheduler).from_config(scheduler.config)
            images[key] = generate(pipe)
        return images[key]

    return image


@pytest.fixture(scope="module")
def loaded(single_files):
    """``load_single_file`` of each single file, once per module."""
    pipes = {}

    def load(name):
        if name not in pipes:
            pipes[name] = load_single_file(single_files[name][0])
        return pipes[name]

    return load


def test_the_released_2x_v_config_as_sidecar_reads_768_px_v_prediction(single_files, tmp_path):
    from models.checkpoints.single_file import CONFIGS

    path = tmp_path / "sd21.safetensors"
    shutil.copy(single_files["sd2"][0], path)
    shutil.copy(CONFIGS / "sd2-v.yaml", path.with_suffix(".yaml"))  # says 64 latents, as the released one does
    about = describe_single_file(path)
    assert (about["architecture"], about["resolution"], about["prediction_type"]) == ("sd2-v", 768, "v_prediction")


@pytest.mark.parametrize("name", ["sd2", "sd2-ckpt", "sd1"])
def test_single_file_gives_the_image_of_the_same_weights_as_a_diffusers_folder(single_files, loaded, folder_image,
                                                                               name):
    path, folder = single_files[name]
    single = loaded(name)
    assert single.safety_checker is None and single.unet.dtype == torch.float32
    assert single.scheduler.config.prediction_type == describe_single_file(path)["prediction_type"]
    image = generate(single)
    assert image.std() > 0.01  # a real picture of random weights, not a flat one
    np.testing.assert_array_equal(image, folder_image(folder, single.scheduler))


def test_the_tokenizer_is_clip_bpe_with_the_family_padding(loaded):
    for name, pad_id in (("sd2", 0), ("sd1", 49407)):  # SD 2.x pads with "!", SD 1.x with the end token
        tokenizer = loaded(name).tokenizer
        ids = tokenizer("a photo of a cat", padding="max_length", max_length=10).input_ids
        assert ids == [49406, 320, 1125, 539, 320, 2368, 49407] + [pad_id] * 3
        assert len(tokenizer) == 49408


def test_is_single_file_reads_only_original_layouts(single_files, sd2_folder, tmp_path):
    assert is_single_file(single_files["sd2"][0]) and is_single_file(single_files["sd2-ckpt"][0])
    assert not is_single_file(sd2_folder / "unet" / "diffusion_pytorch_model.safetensors")  # diffusers keys
    assert not is_single_file(sd2_folder)
    text = tmp_path / "notes.safetensors"
    text.write_text("not weights")
    assert not is_single_file(text)
    renamed = tmp_path / "model.bin"
    shutil.copy(single_files["sd2"][0], renamed)
    assert not is_single_file(renamed)


class Payload:
    """Unpickling this runs ``Path(marker).touch()``: what a hostile .ckpt would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def test_a_pickle_payload_in_a_ckpt_does_not_run(single_files, tmp_path):
    marker = tmp_path / "payload-ran"
    weights = torch.load(single_files["sd2-ckpt"][0], weights_only=True)["state_dict"]
    hostile = tmp_path / "model.ckpt"
    torch.save({"state_dict": weights, "callbacks": Payload(marker)}, hostile)
    with pytest.raises(CheckpointError) as excinfo:
        load_single_file(hostile)
    assert "weights-only" in _one_line(excinfo) and str(hostile) in str(excinfo.value)
    assert not is_single_file(hostile)
    with pytest.raises(CheckpointError):
        describe_single_file(hostile)
    assert not marker.exists()
    torch.load(hostile, weights_only=False)  # the payload is live: a full unpickle runs it
    assert marker.exists()


def test_a_truncated_file_is_one_line(single_files, tmp_path):
    for name in ("sd2", "sd2-ckpt"):
        path = single_files[name][0]
        cut = tmp_path / path.name
        cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        with pytest.raises(CheckpointError) as excinfo:
            load_single_file(cut)
        assert str(cut) in _one_line(excinfo)


def _write(path, shapes: dict) -> pathlib.Path:
    save_file({k: torch.zeros(s) for k, s in shapes.items()}, str(path))
    return path


@pytest.mark.parametrize("keys, words", [
    ({"conditioner.embedders.0.transformer.text_model.embeddings.token_embedding.weight": (8, 4),
      "model.diffusion_model.input_blocks.0.0.weight": (8, 4, 3, 3)}, "SDXL"),
    ({"model.diffusion_model.input_blocks.0.0.weight": (8, 7, 3, 3), "first_stage_model.quant_conv.weight": (8, 8, 1, 1),
      "cond_stage_model.model.token_embedding.weight": (8, 4)}, "7 input channels"),  # 4 and inpainting's 9 open
    ({"model.diffusion_model.input_blocks.0.0.weight": (8, 4, 3, 3), "first_stage_model.quant_conv.weight": (8, 8, 1, 1),
      "cond_stage_model.t5.shared.weight": (8, 4)}, "no OpenAI CLIP or OpenCLIP text tower"),
    ({"unet.conv_in.weight": (8, 4, 3, 3)}, "not a single-file Stable Diffusion checkpoint"),
])
def test_unknown_architectures_and_other_kinds_are_one_line(tmp_path, keys, words):
    path = _write(tmp_path / "model.safetensors", keys)
    with pytest.raises(CheckpointError) as excinfo:
        load_single_file(path)
    assert words in _one_line(excinfo) and str(path) in str(excinfo.value)


def test_weights_that_do_not_fit_the_config_are_one_line(single_files, tmp_path):
    alone = tmp_path / "reduced.safetensors"  # reduced weights, read with the full-size 2.x base config
    shutil.copy(single_files["sd2"][0], alone)
    with pytest.raises(CheckpointError) as excinfo:
        load_single_file(alone)
    assert "sd2-base" in _one_line(excinfo) and "sd2-base.yaml" in str(excinfo.value)


def test_a_sidecar_that_is_not_an_original_config_is_one_line(single_files, tmp_path):
    path = tmp_path / "model.safetensors"
    shutil.copy(single_files["sd2"][0], path)
    path.with_suffix(".yaml").write_text("model:\n  params:\n    unet_config: {}\n")
    with pytest.raises(CheckpointError) as excinfo:
        describe_single_file(path)
    assert "model.yaml is not an original Stable Diffusion config" in _one_line(excinfo)


def test_the_shipped_2x_base_config_is_the_sd2_base_architecture(tmp_path):
    """The full-size path without weights: the shipped config and an SD 2.x key set give SD2-base's configs."""
    import inspect
    import json

    import yaml
    from diffusers import AutoencoderKL, UNet2DConditionModel

    from models.checkpoints.architectures import SD2_BASE
    from models.checkpoints.single_file import CONFIGS, _about
    from models.checkpoints import inference_scheduler

    width, blocks = 1024, 24  # OpenCLIP ViT-H/14: 24 blocks in the file, SD 2.x uses 23
    shapes = {"cond_stage_model.model.token_embedding.weight": (49408, width),
              "cond_stage_model.model.positional_embedding": (77, width)}
    shapes.update({f"cond_stage_model.model.transformer.resblocks.{i}.mlp.c_fc.weight": (4 * width, width)
                   for i in range(blocks)})
    config = yaml.safe_load((CONFIGS / "sd2-base.yaml").read_text())
    about = _about("sd2", config, CONFIGS / "sd2-base.yaml")
    folder = write_config_folder(tmp_path, shapes, "sd2", config, about, inference_scheduler("epsilon"))
    for part, cls in (("unet", UNet2DConditionModel), ("vae", AutoencoderKL)):
        written = json.loads((folder / part / "config.json").read_text())
        defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()}
        got = {k: written.get(k, defaults[k]) for k in SD2_BASE[part]}
        assert got == {k: list(v) if isinstance(v, tuple) else v for k, v in SD2_BASE[part].items()}
    text = text_tower_config(shapes, "sd2", config)
    assert {k: text[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "max_position_embeddings", "hidden_act")} == \
        {k: SD2_BASE["text_encoder"][k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                  "num_hidden_layers", "num_attention_heads",
                                                  "max_position_embeddings", "hidden_act")}


def test_a_sidecar_of_the_other_family_is_one_line(single_files, tmp_path):
    path = tmp_path / "model.safetensors"
    shutil.copy(single_files["sd2"][0], path)
    shutil.copy(single_files["sd1"][0].with_suffix(".yaml"), path.with_suffix(".yaml"))
    with pytest.raises(CheckpointError) as excinfo:
        load_single_file(path)
    assert "FrozenCLIPEmbedder text tower but model.safetensors holds FrozenOpenCLIPEmbedder" in _one_line(excinfo)


def test_a_text_tower_of_another_vocabulary_is_one_line(single_files, tmp_path):
    from safetensors.torch import load_file

    weights = load_file(str(single_files["sd2"][0]))
    weights["cond_stage_model.model.token_embedding.weight"] = torch.zeros(1000, 64)
    path = tmp_path / "model.safetensors"
    save_file(weights, str(path))
    shutil.copy(single_files["sd2"][0].with_suffix(".yaml"), path.with_suffix(".yaml"))
    with pytest.raises(CheckpointError) as excinfo:
        load_single_file(path)
    assert "1000 token embeddings" in _one_line(excinfo) and str(path) in str(excinfo.value)


@pytest.mark.parametrize("kind", ["hub id", "single file"])
def test_training_takes_its_frozen_parts_from_a_hub_id_or_a_single_file(kind, hub_cache, single_files, shapes_data,
                                                                       tmp_path, monkeypatch):
    """``model.pretrained`` names the SD2 parts the way every other command does: a hub id from the offline
    cache, or a single file in the original layout. The run trains on them and its checkpoint carries them."""
    from diffusers import StableDiffusionPipeline

    from models.checkpoints import load_pipeline
    from train.config import load_config
    from train.trainer import build_model, train

    from ..conftest import REPO

    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache.cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref = hub_cache.repo if kind == "hub id" else str(single_files["sd2"][0])
    same = StableDiffusionPipeline.from_pretrained(single_files["sd2"][1], safety_checker=None)
    over = [f"model.pretrained={ref}", "model.prediction_type=v_prediction", f"data.path={shapes_data / '32'}",
            "data.resolution=32", "global_train_batch_size=8", "device_train_microbatch_size=8", "max_duration=2ba",
            "save_interval=2ba", f"save_folder={tmp_path / 'run'}", "ema.enabled=false", "scheduler.t_warmup=1ba"]
    model = build_model(load_config(REPO / "configs/tiny-phase1.yaml", over))
    for part in ("vae", "text_encoder"):
        ours, theirs = getattr(model, part).state_dict(), getattr(same, part).state_dict()
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours), part
    assert model.tokenizer("a red circle").input_ids == same.tokenizer("a red circle").input_ids

    train(load_config(REPO / "configs/tiny-phase1.yaml", over))
    trained = load_pipeline(str(next((tmp_path / "run").glob("ep*-ba2-rank0.pt"))))
    assert torch.equal(trained.vae.decoder.conv_out.weight, same.vae.decoder.conv_out.weight)
    assert trained.tokenizer.pad_token == "!"  # SD2's tokenizer, carried into the checkpoint


def test_a_missing_single_file_as_pretrained_is_one_line(tmp_path):
    from train.config import load_config
    from models.errors import WorkbenchError
    from train.trainer import build_model

    from ..conftest import REPO

    with pytest.raises(WorkbenchError, match=r"pretrained VAE not found: .*sd2\.safetensors/vae does not exist"):
        build_model(load_config(REPO / "configs/tiny-phase1.yaml",
                                [f"model.pretrained={tmp_path / 'sd2.safetensors'}"]))
