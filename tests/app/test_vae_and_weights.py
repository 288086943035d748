"""The Generate tab's VAE field and weighted prompts, without Gradio's server: a VAE file under the folders draws
what diffusers draws with that VAE swapped in, is recorded as AUTOMATIC1111 writes it and restored by PNG Info by its
name and hash; a VAE of another family or outside the folders is one line naming no server path; a weighted prompt
is recorded as typed."""
from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKL, StableDiffusionPipeline
from PIL import Image, PngImagePlugin

from app.generate import Limits
from app.handlers import Handlers
from app.service import Service
from models.generation import Settings, generate_images, parse_parameters
from models.generation.samplers import make_sampler

LIMITS = Limits(max_steps=150, max_size=1024, max_batch=8, max_cells=24)
BASE = dict(checkpoint="tiny-phase1/ep0-ba4-rank0.pt", weights="ema", prompt="a red circle", negative_prompt="",
            sampler="Euler", steps=3, guidance_scale=5.0, width=16, height=16, seed=11, batch_size=1)


@pytest.fixture(scope="module")
def vaes(tmp_path_factory, pipe, family_folders):
    """A second allowed folder holding another VAE of the tiny model's config (other random weights), as one
    safetensors file, and the tiny Flux.1 VAE (16 latent channels)."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("allowed") / "vaes"
    folder.mkdir()
    torch.manual_seed(3)
    save_file(AutoencoderKL.from_config(pipe.vae.config).state_dict(), folder / "other-vae.safetensors")
    shutil.copy(family_folders["flux-dev"] / "vae" / "diffusion_pytorch_model.safetensors",
                folder / "flux-vae.safetensors")
    return folder


@pytest.fixture(scope="module")
def handlers(tree, vaes):
    return Handlers(Service([tree.root, vaes], limits=LIMITS, cache_size=1))


def drawn(handlers, **more) -> tuple[np.ndarray, str]:
    items, text, _ = handlers.generate(**{**BASE, **more})
    return np.asarray(items[0][0].convert("RGB")), text


def test_the_vae_field_draws_with_that_vae_and_png_info_restores_it(handlers, pipe, vaes, tmp_path):
    image, text = drawn(handlers, vae="other-vae.safetensors")
    swapped = StableDiffusionPipeline(**{**pipe.components, "vae": _vae_from_file(pipe, vaes / "other-vae.safetensors"),
                                         "scheduler": make_sampler("Euler", pipe.scheduler.config)},
                                      requires_safety_checker=False)
    swapped.set_progress_bar_config(disable=True)
    expected = swapped("a red circle", num_inference_steps=3, guidance_scale=5.0, width=16, height=16,
                       generator=torch.Generator().manual_seed(11), output_type="pil").images[0]
    assert np.array_equal(image, np.asarray(expected))
    parsed = parse_parameters(text)
    digest = hashlib.sha256((vaes / "other-vae.safetensors").read_bytes()).hexdigest()[:10]
    assert (parsed["VAE"], parsed["VAE hash"]) == ("other-vae.safetensors", digest)
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", text)
    Image.fromarray(image).save(tmp_path / "made.png", pnginfo=info)
    _, values, notes = handlers.png_info(str(tmp_path / "made.png"))
    assert values["vae"] == "vaes/other-vae.safetensors" and "found by its name and hash" in notes
    assert np.array_equal(drawn(handlers, vae=values["vae"])[0], image)  # the restored field draws the same image
    assert not np.array_equal(drawn(handlers)[0], image)


def _vae_from_file(pipe, path):
    from safetensors.torch import load_file

    vae = AutoencoderKL.from_config(pipe.vae.config)
    vae.load_state_dict(load_file(path))
    return vae.eval()


@pytest.mark.parametrize("vae, why", [("flux-vae.safetensors", "a VAE of another family"),
                                      ("../outside/ep0-ba4-rank0.pt", "is outside the allowed")])
def test_a_vae_of_another_family_or_outside_the_folders_is_one_line(handlers, tree, vaes, vae, why):
    with pytest.raises(Exception, match=why) as caught:
        drawn(handlers, vae=vae)
    shown = str(caught.value)
    assert "\n" not in shown and str(tree.root.parent) not in shown and str(vaes) not in shown


def test_a_weighted_prompt_is_drawn_through_compel_and_recorded_as_typed(handlers, pipe):
    typed = "a (red:1.4) circle [above] BREAK a square"
    image, text = drawn(handlers, prompt=typed)
    assert parse_parameters(text)["prompt"] == typed
    settings = Settings(steps=3, guidance=5.0, width=16, height=16, sampler="Euler", prompt_weighting=True)
    assert np.array_equal(image, generate_images(pipe, [typed], [11], settings)[0])
    assert not np.array_equal(image, drawn(handlers, prompt="a red circle above a square")[0])
