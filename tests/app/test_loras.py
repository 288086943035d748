"""LoRAs in the app: ``<lora:NAME:STRENGTH>`` tags and the picker draw what `dwb sample --lora` draws; PNG Info
restores a LoRA and its strength by its hash; names that are no listed file are refused in one line naming no
server path; an X/Y/Z LoRA axis's cells are single generations.

The app fixtures' tiny export (a diffusers folder) copied under the app's one folder, and LoRAs for its UNet written
by diffusers' own ``save_lora_weights`` (tests/adapters)."""
from __future__ import annotations

import copy
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, PngImagePlugin

from app.generate import GenerationParams
from app.handlers import Handlers
from app.service import Runtime, Service
from models.errors import WorkbenchError
from models.generation import DEFAULT_SAMPLER, parse_parameters

from ..adapters.test_applying import _write_diffusers_lora

STRENGTH = 0.7
SETTINGS = dict(steps=2, guidance=5.0, width=16, height=16, seed=3, sampler=DEFAULT_SAMPLER)


@dataclass
class Folders:
    root: Path  # the app's one folder: base/ (a diffusers folder) and loras/
    outside: Path  # beside it: a LoRA the app must not read
    style: Path
    sampled: Path  # `dwb sample --lora style:0.7`'s image, with its parameters


@pytest.fixture(scope="module")
def folders(tree, tmp_path_factory) -> Folders:
    from diffusers import UNet2DConditionModel

    from dwb import main
    from models.families import family_of_folder

    top = tmp_path_factory.mktemp("loras")
    root, outside = top / "root", top / "outside"
    (root / "loras" / "older").mkdir(parents=True)
    outside.mkdir()
    shutil.copytree(tree.export, root / "base")
    unet, family = UNet2DConditionModel.from_pretrained(root / "base" / "unet"), family_of_folder(root / "base", "base")
    style = _write_diffusers_lora(family.name, copy.deepcopy(unet), root / "loras", "style")
    _write_diffusers_lora(family.name, copy.deepcopy(unet), root / "loras" / "older", "style-ep1", seed=2)
    secret = _write_diffusers_lora(family.name, copy.deepcopy(unet), outside, "secret", seed=3)
    os.symlink(secret, root / "loras" / "linked.safetensors")
    main(["sample", str(root / "base"), str(top / "sampled.png"), "--prompt", "a red circle", "--seeds", "1",
          "--seed", str(SETTINGS["seed"]), "--steps", "2", "--size", "16", "--guidance", "5", "--sampler",
          DEFAULT_SAMPLER, "--lora", f"{style}:{STRENGTH}", "--per-image"])
    return Folders(root, outside, style, top / "sampled" / f"00000-{SETTINGS['seed']}.png")


@pytest.fixture(scope="module")
def service(folders) -> Service:
    return Service([folders.root], runtime=Runtime("cpu", torch.float32), cache_size=4)


def drawn(service: Service, prompt: str, **changes) -> tuple[np.ndarray, object]:
    result = service.generate("base", "auto", GenerationParams(prompt, **{**SETTINGS, **changes}))
    return np.asarray(result.images[0].convert("RGB")), result.records[0]


def pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def test_a_lora_tag_and_the_picker_draw_what_dwb_sample_lora_draws(folders, service):
    sampled = Image.open(folders.sampled)
    tagged, record = drawn(service, f"a red circle <lora:style:{STRENGTH}>")
    np.testing.assert_array_equal(tagged, pixels(folders.sampled))
    assert not np.array_equal(drawn(service, "a red circle")[0], tagged)  # the LoRA changes the image
    # the prompt keeps its tag, as A1111 records it; Lora hashes as `dwb sample` (and A1111) write them
    params = parse_parameters(record.parameters())
    assert params["prompt"] == f"a red circle <lora:style:{STRENGTH}>"
    assert params["Lora hashes"] == parse_parameters(sampled.info["parameters"])["Lora hashes"]
    picked = Handlers(service).add_lora("a red circle", "loras/style.safetensors", STRENGTH)
    assert picked == f"a red circle <lora:style:{STRENGTH}>"
    np.testing.assert_array_equal(drawn(service, picked)[0], tagged)
    # picking it again at another strength changes its tag rather than naming it twice
    assert Handlers(service).add_lora(picked, "loras/style.safetensors", 0.25) == "a red circle <lora:style:0.25>"


def _png(tmp_path: Path, parameters: str, name: str = "a1111.png") -> str:
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", parameters)
    path = tmp_path / name
    Image.new("RGB", (16, 16)).save(path, pnginfo=info)
    return str(path)


def test_png_info_restores_the_lora_and_its_strength_and_draws_the_same_image(folders, service, tmp_path):
    handlers = Handlers(service)
    # `dwb sample --lora` writes no tag: the LoRA found by its hash comes back as a tag at the recorded strength
    _, values, notes = handlers.png_info(str(folders.sampled))
    assert values["prompt"] == f"a red circle <lora:style:{STRENGTH}>", notes
    assert values["loras"] == [("style", STRENGTH)] and "found by its hash" in notes
    restored = {k: values[k] for k in ("steps", "width", "height", "seed", "sampler")}
    np.testing.assert_array_equal(drawn(service, values["prompt"], guidance=values["guidance"], **restored)[0],
                                  pixels(folders.sampled))
    # A1111's text: its tag names the file as its folder did, and keeps its strength; the file is found by its hash
    digest = parse_parameters(Image.open(folders.sampled).info["parameters"])["Lora hashes"].split(": ")[1]
    text = (f"a castle <lora:my style v2:0.4>\nSteps: 2, Sampler: Euler a, CFG scale: 5, Seed: 1, Size: 16x16, "
            f"Lora hashes: \"my style v2: {digest}\", Version: v1.10.1")
    _, values, _ = handlers.png_info(_png(tmp_path, text))
    assert values["prompt"] == "a castle <lora:style:0.4>" and values["loras"] == [("style", 0.4)]
    # a hash no file under the folders has: said in a note, the tag left as it was
    _, values, notes = handlers.png_info(_png(tmp_path, text.replace(digest, "0123456789ab"), "other.png"))
    assert values["prompt"] == "a castle <lora:my style v2:0.4>" and "0123456789ab" in notes


@pytest.mark.parametrize("name", ["../../etc/passwd", "../outside/secret", "secret", "linked",
                                  str(Path("/etc/passwd")), "nothing-like-it"])
def test_a_name_outside_the_folders_or_unknown_is_refused_in_one_line_naming_no_server_path(
        folders, service, name):
    with pytest.raises(WorkbenchError) as refused:
        service.generate("base", "auto", GenerationParams(f"a red circle <lora:{name}:1>", **SETTINGS))
    message = str(refused.value)
    assert "\n" not in message and message.startswith("unknown LoRA"), message
    assert str(folders.root.parent) not in message and "secret" not in message.replace(name, ""), message
    labels = [f.label for f in service.loras.listing()]
    assert labels == ["loras/older/style-ep1.safetensors", "loras/style.safetensors"]  # nothing outside is listed


def test_a_tag_that_does_not_read_is_refused_in_one_line(service):
    for tag, words in (("<lora:style:0.5:1>", "one strength"), ("<lora:style:x>", "not a number"),
                       ("<lora:style:40>", "outside"), ("<lora:style:1> <lora:style:0.5>", "twice")):
        with pytest.raises(WorkbenchError, match=words) as refused:
            service.generate("base", "auto", GenerationParams(f"a red circle {tag}", **SETTINGS))
        assert "\n" not in str(refused.value)


def test_an_xyz_lora_axis_draws_cells_equal_to_single_generations(folders, service):
    base = GenerationParams("a red circle <lora:style:1>", **SETTINGS)
    plot = service.xyz_plot("base", "auto", base, [("lora", f"0.35, {STRENGTH}"), ("none", ""), ("none", "")], 2)
    assert plot.captions == ["LoRA 0.35", f"LoRA {STRENGTH:g}"]
    assert [r.prompt for r in plot.cells.records] == ["a red circle <lora:style:0.35>",
                                                      f"a red circle <lora:style:{STRENGTH}>"]
    cells = [np.asarray(image.convert("RGB")) for image in plot.cells.images]
    np.testing.assert_array_equal(cells[1], pixels(folders.sampled))
    np.testing.assert_array_equal(cells[0], drawn(service, "a red circle <lora:style:0.35>")[0])
    assert not np.array_equal(cells[0], cells[1])
    # a run's adapter checkpoints on an axis: each cell names its file, at the prompt's strength
    made = service._plan("base", "auto", replace(base, prompt=f"a red circle <lora:style:{STRENGTH}>"),
                         [("lora", "style\nstyle-ep1"), ("none", ""), ("none", "")])
    assert [c.params.prompt for c in made.cells] == [f"a red circle <lora:style:{STRENGTH}>",
                                                     f"a red circle <lora:style-ep1:{STRENGTH}>"]


def test_a_strength_changed_reads_no_checkpoint_again_and_leaves_the_base_as_it_was(folders):
    """The base is cached once; each strength draws on a copy of its denoiser and text tower with the LoRA applied
    (its VAE shared: a checkpoint read again would build a new one), drawing what a fresh service draws."""
    service = Service([folders.root], runtime=Runtime("cpu", torch.float32), cache_size=4)
    plain = drawn(service, "a red circle")[0]
    np.testing.assert_array_equal(drawn(service, f"a red circle <lora:style:{STRENGTH}>")[0], pixels(folders.sampled))
    lower = drawn(service, "a red circle <lora:style:0.35>")[0]
    np.testing.assert_array_equal(drawn(service, "a red circle")[0], plain)  # neither LoRA reached the base
    fresh = Service([folders.root], runtime=Runtime("cpu", torch.float32), cache_size=4)
    np.testing.assert_array_equal(drawn(fresh, "a red circle <lora:style:0.35>")[0], lower)
    assert not np.array_equal(lower, plain)
    ckpt = service.open("base")
    base = service.pipeline(ckpt, "auto")
    for strength in (STRENGTH, 0.35):
        adapted = service.pipeline(ckpt, "auto", service.loras.chosen(f"x <lora:style:{strength}>")[1])
        assert adapted.vae is base.vae and adapted.unet is not base.unet
    assert len(service.cache) == 3  # the base and one pipeline per strength
