"""`dwb human-eval create` takes ``BASE + LORA@S`` as a model's label, as `dwb evaluate run` and `compare` take it
(one parser, ``models.checkpoints``): the images are named and hashed as AUTOMATIC1111 names the entry (the base's label
and content hash, the LoRA's stem and short hash, its strength), and a manifest whose lines name another model's hash
is refused in one line. Base: the session's SD 2 folder (written by diffusers' ``save_pretrained``); the LoRA by
diffusers' ``save_lora_weights``."""
from __future__ import annotations

import pytest

from human_eval.study import load_study
from models.adapters import a1111_short_hash
from models.checkpoints import content_hash, find_checkpoint
from models.readers import read_safetensors_head

from ..adapters.test_applying import _write_diffusers_lora
from .conftest import write_samples

PROMPTS = [("a red circle", "Colors"), ("two blue squares", "Counting")]


@pytest.fixture(scope="module")
def base_and_lora(sd2_folder, tmp_path_factory):
    """(the session's SD 2 base folder, a LoRA for its UNet)."""
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(sd2_folder / "unet")
    return sd2_folder, _write_diffusers_lora("sd2", unet, tmp_path_factory.mktemp("entry"), "style")


def _folder(root, name: str):
    """A folder of one model's images named <prompt_index>_<image_index>.png (what A1111 drew, say)."""
    manifest = write_samples(root / name, name, PROMPTS, seed=len(name))
    folder = root / f"{name}-images"
    folder.mkdir()
    for i, png in enumerate(sorted((manifest.parent / "samples").glob("*.png"))):
        png.rename(folder / f"{i}_0.png")
    return folder


def test_a_folder_labelled_as_an_entry_is_named_and_hashed_as_a1111_names_it(base_and_lora, tmp_path, dwb):
    base, lora = base_and_lora
    entry = f"{base} + {lora}@0.8"
    prompts = tmp_path / "prompts.csv"
    prompts.write_text("prompt,category\n" + "".join(f"{p},{c}\n" for p, c in PROMPTS))
    done = dwb("human-eval", "create", str(tmp_path / "study"), "--prompts", str(prompts),
               "--folder", f"{base}={_folder(tmp_path, 'plain')}", "--folder", f"{entry}={_folder(tmp_path, 'lora')}")
    assert done.returncode == 0, done.stderr
    study = load_study(tmp_path / "study")
    found = find_checkpoint(base)
    short = a1111_short_hash(lora, read_safetensors_head(lora).header_bytes)
    label = f"{found.label} + style@0.8"
    assert sorted(study.models) == sorted([label, str(base)])
    info = study.model_info[label]
    assert info["checkpoint_hash"] == f"{content_hash(found)}+{short}@0.8"
    assert info["checkpoint"] == f"{found.ref} + {lora}@0.8"


def test_a_manifest_of_another_model_is_refused_as_the_entry(base_and_lora, tmp_path, dwb):
    base, lora = base_and_lora
    other = write_samples(tmp_path / "other", "other", PROMPTS)  # its lines carry another model's hash
    plain = write_samples(tmp_path / "plain", "plain", PROMPTS)
    done = dwb("human-eval", "create", str(tmp_path / "study"), "--samples", str(plain),
               "--samples", f"{base} + {lora}@0.8={other}")
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "not by" in done.stderr and "style@0.8" in done.stderr
    assert not (tmp_path / "study").exists()
