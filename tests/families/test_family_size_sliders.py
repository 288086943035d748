"""The Generate tab's width and height sliders follow the chosen checkpoint's family: they step by what every model
of the family draws its sides in multiples of (SD3's 2x2 patches and Flux.1's 2x2 packing: 16), within the app's
limits (the one size rule, ``models.generation.drawable_sides``); every side they offer is one the generation path
accepts (``Family.size_multiple`` of the loaded pipeline)."""
from __future__ import annotations

import shutil

import pytest

from models.checkpoints import find_checkpoint, load_pipeline
from models.checkpoints.open import CheckpointInfo
from models.families import family_named


@pytest.fixture(scope="module")
def handlers(family_folders, tmp_path_factory):
    from app.handlers import Handlers
    from app.service import Service

    root = tmp_path_factory.mktemp("models")
    for name in ("sdxl", "sd3", "flux-dev"):
        shutil.copytree(family_folders[name], root / name)
    return Handlers(Service([root]))


@pytest.mark.parametrize("name, family", [("sdxl", "sdxl"), ("sd3", "sd3"), ("flux-dev", "flux")])
def test_choosing_a_checkpoint_sets_the_sliders_to_its_familys_sides(name, family, handlers, family_folders):
    _, width, height = handlers.checkpoint_note(name)
    assert width == height
    resolution = handlers.service.info(name)[1].resolution
    limits = handlers.limits
    step = family_named(family).size_step()
    assert (width["step"], width["minimum"], width["maximum"]) == (step, -(-limits.min_size // step) * step,
                                                                   limits.max_size // step * step)
    assert width["value"] == resolution and width["minimum"] % step == 0 == width["maximum"] % step
    pipe = load_pipeline(find_checkpoint(str(family_folders[name])))
    assert step % family_named(family).size_multiple(pipe) == 0  # every side offered is one it draws


def test_a_full_size_model_gets_the_app_limits_on_its_familys_step(handlers):
    for family, expected in (("sdxl", (16, 1024, 8)), ("sd3", (16, 1024, 16)), ("flux", (16, 1024, 16))):
        info = CheckpointInfo("diffusers", 1024, None, family=family)
        slider = handlers.size_slider(info, None)
        assert (slider["minimum"], slider["maximum"], slider["step"]) == expected
        assert slider["value"] == 1024
    slider = handlers.size_slider(CheckpointInfo("diffusers", 1024, None, family="sd3"), 980)
    assert slider["value"] == 976  # a recommended side off the family's steps: the nearest on the slider
