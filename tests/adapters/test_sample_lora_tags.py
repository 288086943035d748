"""`dwb sample` reads AUTOMATIC1111's ``<lora:NAME:STRENGTH>`` tags as the app does (``models.checkpoints.LoraFiles``,
names found in ``--lora-dir``): a tagged prompt draws what ``--lora FILE:STRENGTH`` draws, the PNG keeps the tag in its
prompt and records ``Lora hashes`` under the tag's name; a tag without ``--lora-dir``, or naming no file there, is
refused in one line before the checkpoint is opened. Base: the session's SD 2 folder (tests/checkpoints/fixtures.py'
reduced pipeline, written by diffusers' ``save_pretrained``); the LoRA by diffusers' ``save_lora_weights``."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from models.generation import DEFAULT_SAMPLER, parse_parameters

from .test_applying import _write_diffusers_lora

STRENGTH = 0.6


@pytest.fixture(scope="module")
def made(sd2_folder, tmp_path_factory):
    """(the session's SD 2 base folder, a folder of LoRAs holding style.safetensors, the LoRA file)."""
    from diffusers import UNet2DConditionModel

    loras = tmp_path_factory.mktemp("lora-tags")
    style = _write_diffusers_lora("sd2", UNet2DConditionModel.from_pretrained(sd2_folder / "unet"), loras, "style")
    return sd2_folder, loras, style


def _sample(base, out, prompt: str, *extra) -> np.ndarray:
    """The image `dwb sample` draws (its own PNG: the grid's labels show the prompt, tag and all)."""
    from dwb import main

    assert main(["sample", str(base), str(out), "--prompt", prompt, "--seeds", "1", "--seed", "3", "--steps", "2",
                 "--size", "32", "--guidance", "5", "--sampler", DEFAULT_SAMPLER, "--per-image", *extra]) == 0
    return np.asarray(Image.open(out.with_suffix("") / "00000-3.png").convert("RGB"))


def test_a_tagged_prompt_draws_what_lora_file_draws_and_records_the_tag_and_hash(made, tmp_path):
    base, loras, style = made
    by_file = _sample(base, tmp_path / "file.png", "a red circle", "--lora", f"{style}:{STRENGTH}")
    tagged = _sample(base, tmp_path / "tag.png", f"a red circle <lora:style:{STRENGTH}>", "--lora-dir", str(loras))
    np.testing.assert_array_equal(tagged, by_file)
    plain = _sample(base, tmp_path / "plain.png", "a red circle")
    assert np.abs(plain.astype(int) - tagged).max() > 0, "the LoRA changed no pixel"
    recorded = parse_parameters(Image.open(tmp_path / "tag.png").info["parameters"])
    assert recorded["prompt"] == f"a red circle <lora:style:{STRENGTH}>"  # the tag kept, as A1111 keeps it
    assert recorded["Lora hashes"] == parse_parameters(Image.open(tmp_path / "file.png").info["parameters"])[
        "Lora hashes"]
    assert recorded["Lora hashes"].startswith("style: ")


@pytest.mark.parametrize("prompt,extra,words", [
    ("a red circle <lora:style:1>", [], "give --lora-dir FOLDER"),
    ("a red circle <lora:nothing-like-it:1>", ["--lora-dir", "{loras}"], "unknown LoRA 'nothing-like-it'"),
    ("a red circle <lora:../sd2/unet/diffusion_pytorch_model:1>", ["--lora-dir", "{loras}"], "unknown LoRA"),
    ("a red circle <lora:style:40>", ["--lora-dir", "{loras}"], "outside -10 to 10"),
])
def test_a_tag_that_finds_no_file_is_refused_in_one_line(made, tmp_path, capsys, prompt, extra, words):
    from dwb import main

    base, loras, _ = made
    args = ["sample", str(base), str(tmp_path / "x.png"), "--prompt", prompt, "--steps", "2", "--size", "32",
            *(a.format(loras=loras) for a in extra)]
    assert main(args) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "x.png").exists()
