"""The Generate tab's ControlNet without Gradio's server: a tiny random ControlNet of the app's tiny model (written by
diffusers' ``save_pretrained`` from ``ControlNetModel.from_unet``, its weights perturbed so it steers) under the app's
folders, a control image uploaded and made canny edges, drawn as ``models.generation`` draws it, recorded as
AUTOMATIC1111's ControlNet extension writes it, and restored by PNG Info (the ControlNet found by its name and hash)
into the same image; a ControlNet without its image, an image without its ControlNet and one outside the folders are
one line."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from app.handlers import Handlers
from app.service import Service
from models.generation import Control, Settings, generate_images

from .test_modes import BASE, LIMITS, restored


@pytest.fixture(scope="module")
def controlled(tree, tmp_path_factory):
    """(the handlers over the tree and a folder of ControlNets, the ControlNet's label there, the control image)."""
    import diffusers

    from models.checkpoints import load_pipeline

    folder = tmp_path_factory.mktemp("controlnets")
    pipe = load_pipeline(tree.ba4, ema=True)
    halvings = int(math.log2(pipe.vae_scale_factor))  # the control embedding halves the image as the VAE does
    torch.manual_seed(3)
    controlnet = diffusers.ControlNetModel.from_unet(pipe.unet, conditioning_embedding_out_channels=(
        16, *(32 * 2 ** k for k in range(halvings))))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in controlnet.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    controlnet.save_pretrained(folder / "tiny-canny")
    pixels = np.zeros((24, 20, 3), dtype=np.uint8)
    pixels[4:16, 3:12] = (255, 255, 255)
    Image.fromarray(pixels).save(folder / "shapes.png")
    handlers = Handlers(Service([tree.root, folder], limits=LIMITS, cache_size=1))
    return handlers, f"{folder.name}/tiny-canny", folder / "shapes.png"


def drawn(handlers, **control) -> tuple[np.ndarray, str]:
    items, text, _ = handlers.generate(**BASE, **control)
    return np.asarray(items[0][0].convert("RGB")), text


def test_a_controlnet_is_drawn_recorded_and_restored_by_png_info(controlled, tree, tmp_path):
    from models.checkpoints import load_pipeline, open_controlnet

    handlers, label, image = controlled
    settings = dict(controlnet=label, control_preprocess="canny", control_weight=0.9, control_start=0.0,
                    control_end=0.7)
    made, text = drawn(handlers, **settings, control_image={"path": str(image)})
    pipe = load_pipeline(tree.ba4, ema=True)
    opened = open_controlnet(str(image.parent / "tiny-canny"), pipe)
    assert (f'ControlNet 0: "Module: canny, Model: tiny-canny [{opened.hash}], Weight: 0.9, Resize Mode: Just Resize, '
            'Threshold A: 100, Threshold B: 200, Guidance Start: 0, Guidance End: 0.7, Control Mode: Balanced"') in text
    expected = generate_images(pipe, ["a red circle"], [11], Settings(
        steps=3, guidance=5.0, width=16, height=16, sampler="Euler",
        control=Control(opened.model, opened.name, opened.hash, Image.open(image), "canny", 0.9, 0.0, 0.7)))
    assert np.array_equal(made, expected[0])
    assert not np.array_equal(made, drawn(handlers)[0])  # the ControlNet steers the draw

    values = restored(handlers, made, text, tmp_path)
    assert {k: values[k] for k in settings} == settings
    assert "upload its control image" in values["notes"]
    sent = handlers.send_to_generate(values)[-5:]  # the ControlNet section's controls but its image
    assert [u["value"] for u in sent] == list(settings.values())
    again, _ = drawn(handlers, **{k: values[k] for k in settings}, control_image={"path": str(image)})
    assert np.array_equal(again, made)


def test_a_controlnet_without_its_image_or_outside_the_folders_is_one_line(controlled, tree):
    import gradio as gr

    handlers, label, image = controlled
    for control, message in ((dict(controlnet=label), "a ControlNet steers from a control image: upload one"),
                             (dict(control_image={"path": str(image)}), "a control image steers through a ControlNet"),
                             (dict(controlnet=str(tree.outside), control_image={"path": str(image)}),
                              "outside the allowed checkpoint folders"),
                             (dict(controlnet=label, control_image={"path": str(image)}, control_start=0.8,
                                   control_end=0.2), "control start 0.8 must come before control end 0.2")):
        with pytest.raises(gr.Error, match=message) as e:
            drawn(handlers, **control)
        assert "\n" not in str(e.value)


def test_a_controlnet_folder_under_the_folders_is_not_listed_as_a_checkpoint(controlled, caplog):
    from models.checkpoints import discover

    _, label, image = controlled
    with caplog.at_level("WARNING", logger="checkpoints"):
        found = discover([image.parent])
    assert found == [] and "tiny-canny" not in caplog.text  # a model saved alone: no checkpoint, nothing unreadable


def test_png_info_restores_the_controlnet_from_the_exact_record_too():
    from app.png_info import settings_from
    from models.generation import ImageRecord

    record = ImageRecord("a red circle", "", "Euler", 3, 5.0, 16, 16, 11, "tiny", "abc", "ema", controlnet="tiny-canny",
                         controlnet_hash="0123456789ab", control_module="canny", control_weight=0.9, control_start=0.1,
                         control_end=0.7, control_low=100, control_high=200)
    asked = []
    values, notes = settings_from(record.parameters(), lambda digest: None, record,
                                  controlnet_of=lambda name, digest: asked.append((name, digest)) or "cn/tiny-canny")
    assert asked == [("tiny-canny", "0123456789ab")]
    assert {k: values[k] for k in ("controlnet", "control_preprocess", "control_weight", "control_start",
                                   "control_end")} == {"controlnet": "cn/tiny-canny", "control_preprocess": "canny",
                                                       "control_weight": 0.9, "control_start": 0.1, "control_end": 0.7}
    assert any("upload its control image" in n for n in notes)
