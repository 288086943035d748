"""A VAE a user holds in place of the checkpoint's own: a diffusers AutoencoderKL folder and a single .safetensors file
draw what diffusers' pipeline draws with that VAE swapped in; a VAE of another family (latent channels, scaling), a
pickle and a file that does not fit are refused in one line; `dwb sample --vae` records it as AUTOMATIC1111 does."""
from __future__ import annotations

import hashlib
import shutil

import diffusers
import numpy as np
import pytest
import torch
from PIL import Image

from models.checkpoints import load_pipeline, open_vae
from models.errors import WorkbenchError
from models.generation import Settings, generate_images, parse_parameters
from models.generation.samplers import make_sampler

from .checkpoints.fixtures import reduced_pipeline

PROMPT, SEEDS, SIDE = "a red circle above a blue square", [5], 32
SETTINGS = Settings(steps=2, guidance=4.0, width=SIDE, height=SIDE, sampler="Euler")


@pytest.fixture(scope="module")
def vaes(tmp_path_factory, family_folders) -> dict:
    """Another SD 2 VAE (other random weights) as diffusers writes a folder, its weights as one file, and the tiny
    Flux.1 and SDXL VAEs (16 channels; SDXL's scaling) as one file each; the same SD 2 VAE in the original layout
    (``first_stage_model.encoder.down.0...``, as `dwb export` writes it)."""
    from safetensors.torch import save_file

    from models.export.original_layout import vae_entries

    out = tmp_path_factory.mktemp("vaes")
    vae = reduced_pipeline("sd2", seed=7).vae
    vae.save_pretrained(out / "my-vae")
    save_file({e.name: e.make().contiguous() for e in vae_entries(vae.state_dict(), dict(vae.config))},
              out / "original.safetensors")
    shutil.copy(out / "my-vae" / "diffusion_pytorch_model.safetensors", out / "my-vae.safetensors")
    for name in ("flux-dev", "sdxl"):
        shutil.copy(family_folders[name] / "vae" / "diffusion_pytorch_model.safetensors", out / f"{name}.safetensors")
    (out / "pickled.ckpt").write_bytes(b"not opened")
    return {p.name: p for p in out.iterdir()}


@pytest.fixture(scope="module")
def pipe(sd2_folder):
    return load_pipeline(str(sd2_folder))


def test_a_vae_folder_and_file_draw_what_diffusers_draws_with_the_vae_swapped(pipe, sd2_folder, vaes):
    drawn = generate_images(pipe, [PROMPT], SEEDS, Settings(**{**SETTINGS.__dict__, "vae": open_vae(
        str(vaes["my-vae"]), pipe)}))
    reference = diffusers.StableDiffusionPipeline.from_pretrained(
        sd2_folder, vae=diffusers.AutoencoderKL.from_pretrained(vaes["my-vae"]), safety_checker=None,
        requires_safety_checker=False)
    reference.scheduler = make_sampler("Euler", reference.scheduler.config)
    reference.set_progress_bar_config(disable=True)
    expected = reference(PROMPT, num_inference_steps=2, guidance_scale=4.0, width=SIDE, height=SIDE, output_type="np",
                         generator=[torch.Generator("cpu").manual_seed(s) for s in SEEDS]).images
    assert np.array_equal(drawn, (expected * 255).round().astype(np.uint8))
    from_file = generate_images(pipe, [PROMPT], SEEDS, Settings(**{**SETTINGS.__dict__, "vae": open_vae(
        str(vaes["my-vae.safetensors"]), pipe)}))
    assert np.array_equal(from_file, drawn)
    original = generate_images(pipe, [PROMPT], SEEDS, Settings(**{**SETTINGS.__dict__, "vae": open_vae(
        str(vaes["original.safetensors"]), pipe)}))
    assert np.array_equal(original, drawn)
    assert not np.array_equal(generate_images(pipe, [PROMPT], SEEDS, SETTINGS), drawn)  # the pipeline is unchanged


@pytest.mark.parametrize("name, why", [
    ("flux-dev.safetensors", "has latent_channels 16; this Stable Diffusion 2.x model's latents have 4: a VAE of "
                             "another family"),
    ("pickled.ckpt", "is a pickle"),
    ("nowhere.safetensors", "VAE not found"),
])
def test_a_vae_of_another_family_or_a_file_not_taken_is_one_line(pipe, vaes, tmp_path, name, why):
    path = vaes.get(name, tmp_path / name)
    with pytest.raises(WorkbenchError, match=why) as caught:
        open_vae(str(path), pipe)
    assert "\n" not in str(caught.value)


def test_a_folder_vae_of_another_scaling_is_another_familys(pipe, family_folders):
    with pytest.raises(WorkbenchError, match="scaling_factor 0.13025; .* latents have 0.18215: a VAE of another"):
        open_vae(str(family_folders["sdxl"]), pipe)  # a pipeline folder: its vae/


def test_dwb_sample_records_the_vae_as_a1111_writes_it(dwb, sd2_folder, vaes, tmp_path):
    out = tmp_path / "grid.png"
    result = dwb("sample", str(sd2_folder), str(out), "--prompt", PROMPT, "--seeds", "1", "--steps", "1", "--size",
                 str(SIDE), "--vae", str(vaes["my-vae.safetensors"]))
    assert result.returncode == 0, result.stderr
    parsed = parse_parameters(Image.open(out).info["parameters"])
    digest = hashlib.sha256(vaes["my-vae.safetensors"].read_bytes()).hexdigest()[:10]
    assert (parsed["VAE"], parsed["VAE hash"]) == ("my-vae.safetensors", digest)
    refused = dwb("sample", str(sd2_folder), str(tmp_path / "no.png"), "--prompt", PROMPT, "--seeds", "1",
                  "--steps", "1", "--size", str(SIDE), "--vae", str(vaes["flux-dev.safetensors"]))
    assert refused.returncode != 0 and "a VAE of another family" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
