"""SDXL single files in the layout Stability's sgm code saves and A1111, ComfyUI and Forge load, written by the
test's own key map (tests/checkpoints/original_layout.py, independent of diffusers' loader), opened through the
door by diffusers' single-file loader."""
from __future__ import annotations

import shutil

import diffusers
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from models.checkpoints import find_checkpoint, load_pipeline
from models.checkpoints.open import describe
from models.errors import CheckpointError
from models.families import family_named, published_count
from models.generation import Settings, generate_images

from ..checkpoints.original_layout import write_sdxl_single_file
from ..conftest import run_dwb

SETTINGS = Settings(steps=3, guidance=4.0, width=64, height=64, sampler="Euler")


@pytest.fixture(scope="module")
def sdxl_file(family_folders, tmp_path_factory):
    """The tiny SDXL pipeline as one file, and beside it NAME.config/: the folder's configs and tokenizers."""
    folder, out = family_folders["sdxl"], tmp_path_factory.mktemp("sdxl-file")
    path = write_sdxl_single_file(diffusers.StableDiffusionXLPipeline.from_pretrained(folder), out / "tiny.safetensors")
    shutil.copytree(folder, out / "tiny.config", ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    return path


def test_an_sdxl_single_file_draws_what_its_folder_draws(sdxl_file, family_folders):
    checkpoint = find_checkpoint(str(sdxl_file))
    info = describe(checkpoint)
    assert (checkpoint.kind, info.family, info.resolution) == ("single-file", "sdxl", 64)
    from_file = generate_images(load_pipeline(checkpoint), ["a red circle"], [3], SETTINGS)
    from_folder = generate_images(load_pipeline(find_checkpoint(str(family_folders["sdxl"]))), ["a red circle"], [3],
                                  SETTINGS)
    np.testing.assert_array_equal(from_file, from_folder)


def test_without_its_configs_an_sdxl_file_is_read_with_the_published_ones(sdxl_file, tmp_path):
    """No NAME.config/: the configs are SDXL base's own, written offline (the tiny file does not fit them: one
    line); those configs build the published model, and its CLIP tokenizers pad as SDXL's do."""
    from models.checkpoints.family_single_file import write_family_config_folder

    alone = shutil.copy(sdxl_file, tmp_path / "alone.safetensors")
    with pytest.raises(CheckpointError) as refused:
        load_pipeline(find_checkpoint(str(alone)))
    assert str(refused.value).startswith(f"cannot load {alone} as a single-file Stable Diffusion XL checkpoint: ")
    assert "\n" not in str(refused.value)

    folder = write_family_config_folder(tmp_path / "configs", family_named("sdxl"))
    counts = {}
    with torch.device("meta"):
        for name, cls in (("unet", diffusers.UNet2DConditionModel), ("vae", diffusers.AutoencoderKL)):
            counts[name] = sum(p.numel() for p in cls.from_config(cls.load_config(folder / name)).parameters())
        from transformers import CLIPTextModel, CLIPTextModelWithProjection

        for name, cls in (("text_encoder", CLIPTextModel), ("text_encoder_2", CLIPTextModelWithProjection)):
            counts[name] = sum(p.numel() for p in cls(cls.config_class.from_pretrained(folder / name)).parameters())
    variant = family_named("sdxl").variants[0]
    assert abs(published_count(variant, counts) / variant.published_parameters - 1) <= 0.01
    from transformers import CLIPTokenizer

    pads = [CLIPTokenizer.from_pretrained(folder / t).pad_token for t in ("tokenizer", "tokenizer_2")]
    assert pads == ["<|endoftext|>", "!"]


def test_single_files_the_door_cannot_read_alone_are_one_line(sdxl_file, tmp_path):
    as_pickle = tmp_path / "tiny.ckpt"
    torch.save({"state_dict": {"conditioner.embedders.0.transformer.text_model.embeddings.position_embedding.weight":
                               torch.zeros(4, 4), "model.diffusion_model.input_blocks.0.0.weight": torch.zeros(8, 4, 3, 3)},
                "global_step": 0}, as_pickle)
    with pytest.raises(CheckpointError, match=r"Stable Diffusion XL checkpoint is opened from \.safetensors only"):
        load_pipeline(find_checkpoint(str(as_pickle)))
    sd3 = tmp_path / "sd3.5.safetensors"  # an SD3.5 file's MMDiT names, without its configs and T5 tokenizer
    save_file({"model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight": torch.zeros(6, 2)}, str(sd3))
    with pytest.raises(CheckpointError, match=r"a Stable Diffusion 3.5 single file needs its configs and tokenizers "
                                              r"beside it: a diffusers folder of the same model as NAME.config/"):
        load_pipeline(find_checkpoint(str(sd3)))


def test_a_flux_transformer_file_in_black_forest_labs_names_is_recognised_and_needs_its_parts(family_folders,
                                                                                             tmp_path):
    """Flux.1 is published as the transformer alone, in Black Forest Labs' names (written here by the test's own
    key map). Without NAME.config/ or --parts (its other parts) it is one line; with them it draws what its folder
    draws (tests/families/test_flux_single_file.py)."""
    from ..checkpoints.original_layout import flux_to_original

    folder = family_folders["flux-dev"]
    path = tmp_path / "flux1-tiny.safetensors"
    weights = flux_to_original(diffusers.FluxTransformer2DModel.from_pretrained(folder, subfolder="transformer"))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path))
    checkpoint = find_checkpoint(str(path))
    assert (checkpoint.kind, describe(checkpoint).family) == ("single-file", "flux")
    with pytest.raises(CheckpointError, match=r"a Flux.1 single file needs its configs and tokenizers beside it"):
        load_pipeline(checkpoint)


@pytest.mark.parametrize("with_text_encoders", [False, True])
def test_an_sd35_file_with_and_without_its_text_encoders_draws_what_its_folder_draws(with_text_encoders,
                                                                                    family_folders, tmp_path):
    """SD3.5 as Stability publishes it (the MMDiT and VAE, with or without CLIP-L, CLIP-G and T5), written by the
    test's own key map, and NAME.config/ beside it: its configs and tokenizers, with the text encoders' weights
    where the file has none. The file's CLIP-L has no projection (the identity in the published layout)."""
    from ..checkpoints.original_layout import write_sd3_single_file

    folder = family_folders["sd3"]
    reference = diffusers.StableDiffusion3Pipeline.from_pretrained(folder)
    if with_text_encoders:
        with torch.no_grad():
            reference.text_encoder.text_projection.weight.copy_(torch.eye(reference.text_encoder.config.hidden_size))
    path = write_sd3_single_file(reference, tmp_path / "sd3.5-tiny.safetensors", text_encoders=with_text_encoders)
    sidecar = shutil.copytree(folder, tmp_path / "sd3.5-tiny.config")
    for weights in sidecar.glob(("*" if with_text_encoders else "transformer") + "/*.safetensors"):
        weights.unlink()  # what the file holds is read from the file
    checkpoint = find_checkpoint(str(path))
    assert describe(checkpoint).family == "sd3"
    ours = generate_images(load_pipeline(checkpoint), ["a red circle"], [3], SETTINGS)
    expected = generate_images(reference, ["a red circle"], [3], SETTINGS)
    # the same weights, every part in inference mode (a T5 left training drew dropout into every prompt)
    np.testing.assert_array_equal(ours, expected)
