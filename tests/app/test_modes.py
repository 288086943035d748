"""The Generate tab's modes without Gradio's server: inpainting from an image and the strokes painted over it (what
ImageMask sends), image to image, and a hires fix, each drawn as ``models.generation`` draws it, recorded as
AUTOMATIC1111 writes it, restored by PNG Info into the same image; a missing image or a mask of another size is one
line."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from app.generate import Limits
from app.handlers import Handlers
from app.service import Service
from models.errors import WorkbenchError
from models.generation import InitImage, Settings, generate_images

LIMITS = Limits(max_steps=150, max_size=1024, max_batch=8, max_cells=24)
BA4 = "tiny-phase1/ep0-ba4-rank0.pt"
BASE = dict(checkpoint=BA4, weights="ema", prompt="a red circle", negative_prompt="", sampler="Euler", steps=3,
            guidance_scale=5.0, width=16, height=16, seed=11, batch_size=1)


@pytest.fixture(scope="module")
def handlers(tree):
    return Handlers(Service([tree.root], limits=LIMITS, cache_size=1))


@pytest.fixture(scope="module")
def painted(tmp_path_factory):
    """(an image, a layer of strokes over its middle as ImageMask sends them, the mask they make)."""
    folder = tmp_path_factory.mktemp("painted")
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(folder / "background.png")
    layer = Image.new("RGBA", (16, 16), (0, 0, 0, 0))
    layer.paste((255, 255, 255, 255), (4, 4, 12, 12))
    layer.save(folder / "layer.png")
    mask = Image.new("L", (16, 16), 0)
    mask.paste(255, (4, 4, 12, 12))
    return folder / "background.png", folder / "layer.png", mask


def editor(background, *layers) -> dict:
    """What an ImageMask sends an event that does not preprocess: file data of the background and each layer."""
    return {"background": {"path": str(background)}, "layers": [{"path": str(p)} for p in layers], "composite": None}


def drawn(handlers, **mode) -> tuple[np.ndarray, str]:
    items, text, _ = handlers.generate(**BASE, **mode)
    return np.asarray(items[0][0].convert("RGB")), text


def restored(handlers, image: np.ndarray, text: str, tmp_path) -> dict:
    """PNG Info's values for the image saved with its parameters text, as a browser's PNG carries it."""
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", text)
    Image.fromarray(image).save(tmp_path / "made.png", pnginfo=info)
    _, values, notes = handlers.png_info(str(tmp_path / "made.png"))
    return values | {"notes": notes}


def test_inpainting_what_is_painted_is_drawn_recorded_and_restored(handlers, painted, tree, tmp_path):
    from models.checkpoints import load_pipeline

    background, layer, mask = painted
    image, text = drawn(handlers, mode="inpaint", editor=editor(background, layer), strength=0.7, mask_blur=1)
    assert "Denoising strength: 0.7, Mask blur: 1" in text
    expected = generate_images(load_pipeline(tree.ba4, ema=True), ["a red circle"], [11], Settings(
        steps=3, guidance=5.0, width=16, height=16, sampler="Euler",
        init=InitImage(Image.open(background), 0.7, mask, 1)))
    assert np.array_equal(image, expected[0])
    values = restored(handlers, image, text, tmp_path)
    assert (values["mode"], values["strength"], values["mask_blur"]) == ("inpaint", 0.7, 1)
    assert "upload that image in Generate's Inpaint tab" in values["notes"]
    sent = handlers.send_to_generate(values)  # ..., Generate's tabs, mode, strength, mask blur, hires x 3, clip skip,
    # VAE, the mode's tab
    shown = (sent[13]["value"], sent[14]["value"], sent[15]["value"], sent[21].selected)
    assert shown == ("inpaint", 0.7, 1, "inpaint")
    again, _ = drawn(handlers, **{**{k: values[k] for k in ("mode", "strength", "mask_blur")},
                                  "editor": editor(background, layer)})
    assert np.array_equal(again, image)


def test_a_hires_fix_and_image_to_image_are_drawn_recorded_and_restored(handlers, painted, tmp_path):
    hires = dict(mode="txt2img", hires_scale=2, hires_steps=2, hires_upscaler="Latent (nearest)", strength=0.5,
                 clip_skip=2)
    image, text = drawn(handlers, **hires)
    assert image.shape == (32, 32, 3)
    assert "Size: 16x16" in text and "Clip skip: 2, Denoising strength: 0.5, Hires upscale: 2, Hires steps: 2, " \
                                     "Hires upscaler: Latent (nearest)" in text
    values = restored(handlers, image, text, tmp_path)
    assert {k: values[k] for k in hires} == {**hires, "hires_scale": 2.0}
    again, _ = drawn(handlers, **{k: values[k] for k in hires})
    assert np.array_equal(again, image)
    cost = handlers.generate_cost(*BASE.values(), "", "", 0.8, **hires, init_image=None, editor=None, mask_blur=4,
                                  vae="")
    assert not np.array_equal(drawn(handlers, **{**hires, "clip_skip": 1})[0], image)  # clip skip draws another
    assert cost == 16 * 16 * 3 + 32 * 32 * 2  # the hires fix's second draw counted against the limits

    from_image, text = drawn(handlers, mode="img2img", init_image={"path": str(painted[0])}, strength=0.4)
    assert "Denoising strength: 0.4" in text and "Mask blur" not in text and "Hires" not in text
    values = restored(handlers, from_image, text, tmp_path)
    assert (values["mode"], values["strength"], values["hires_scale"]) == ("img2img", 0.4, 1.0)
    plain, _ = drawn(handlers)
    assert restored(handlers, plain, _, tmp_path)["mode"] == "txt2img"


def test_a_mode_without_its_image_or_with_a_mask_of_another_size_is_one_line(handlers, painted, tmp_path):
    import gradio as gr

    background, _, _ = painted
    small = Image.new("RGBA", (8, 8), (255, 255, 255, 255))
    small.save(tmp_path / "small.png")
    Image.new("RGBA", (16, 16), (0, 0, 0, 0)).save(tmp_path / "blank.png")
    for mode, message in ((dict(mode="img2img"), "image to image starts from an image: upload one"),
                          (dict(mode="inpaint", editor=editor(background, tmp_path / "small.png")),
                           "the mask is 8x8 and the init image 16x16: a mask covers its image exactly"),
                          (dict(mode="inpaint", editor=editor(background, tmp_path / "blank.png")),
                           "nothing is painted on the image"),
                          (dict(mode="img2img", init_image={"path": str(background)}, strength=1.5),
                           r"strength must be in \(0, 1\]"),
                          (dict(mode="txt2img", hires_scale=8), "hires upscale must be a number above 1"),
                          (dict(mode="img2img", init_image={"path": str(background)}, strength=0.3),
                           "denoising strength 0.3 of 3 steps redraws none of them")):
        with pytest.raises(gr.Error, match=message) as e:
            drawn(handlers, **mode)
        assert "\n" not in str(e.value)


def test_a_strength_axis_plots_the_generate_tabs_mode_and_each_cell_is_that_single_image(handlers, painted):
    import gradio as gr

    from app.xyz import parse_axis

    axis = parse_axis("X axis", "strength", "0.3, 1", LIMITS)
    assert axis.values == (0.3, 1.0) and axis.labels == ("strength 0.3", "strength 1")
    with pytest.raises(WorkbenchError, match=r"^X axis \(strength\): denoising strength must be in \(0, 1\]"):
        parse_axis("X axis", "strength", "0", LIMITS)
    settings = {k: v for k, v in BASE.items() if k not in ("batch_size",)}
    mode = dict(mode="img2img", init_image={"path": str(painted[0])})
    _, cells, _, texts = handlers.xyz_plot(**settings, x_type="strength", x_values="0.4, 1", y_type="none",
                                           y_values="", z_type="none", z_values="", batch_size=2, **mode)
    assert ["Denoising strength: 0.4" in texts[0], "Denoising strength: 1" in texts[1]] == [True, True]
    for (cell, _), strength in zip(cells, (0.4, 1.0)):
        single, _ = drawn(handlers, **mode, strength=strength)
        assert np.abs(np.asarray(cell.convert("RGB")).astype(int) - single).max() <= 1  # batched kernels' rounding
    with pytest.raises(gr.Error, match="a strength axis redraws an init image or a hires fix"):
        handlers.xyz_plot(**settings, x_type="strength", x_values="0.3", y_type="none", y_values="", z_type="none",
                          z_values="", batch_size=1)
