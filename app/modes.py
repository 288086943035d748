"""The Generate tab's modes, from what the browser sends: text to image (with a hires fix), image to image from an
uploaded image, and inpainting from an image and the mask painted over it (Gradio's ImageMask: its background is the
image, its layers the strokes). No Gradio here; the images are read within ``models.generation``'s bounds.

Each mode's settings go into ``GenerationParams`` as ``models.generation``'s ``InitImage`` and ``HiresFix``, so the
request is drawn, costed and recorded as `dwb sample --init-image/--mask/--hires-scale` draws, costs and records it;
a ControlNet and its control image go in as ``models.generation``'s ``Control``, as `dwb sample --controlnet` gives it.
"""
from __future__ import annotations

from dataclasses import replace

from models.errors import WorkbenchError
from models.generation import (DEFAULT_HIRES_UPSCALER, DEFAULT_MASK_BLUR, DEFAULT_STRENGTH, MODES, Control, HiresFix,
                               InitImage, read_image)

MODE_TABS = (("Text to image", "txt2img"), ("Image to image", "img2img"), ("Inpaint", "inpaint"))


def upload_path(payload) -> str | None:
    """The server path of one uploaded file as an event with ``preprocess=False`` receives it (Gradio's FileData, a
    dict whose path Gradio held to its upload folder before the event ran), or None where there is none."""
    if isinstance(payload, dict):
        payload = payload.get("path")
    return payload if isinstance(payload, str) and payload else None


def editor_paths(editor) -> tuple[str | None, list[str]]:
    """(the background's path, the layers' paths) of an ImageMask's value."""
    if not isinstance(editor, dict):
        return None, []
    layers = editor.get("layers") if isinstance(editor.get("layers"), list) else []
    return upload_path(editor.get("background")), [p for p in map(upload_path, layers) if p]


def painted_mask(layers: list[str], size: tuple[int, int]):
    """The strokes of every layer as one mask: white where any layer is painted (alpha above 0), black elsewhere; a
    one-line WorkbenchError where a layer is not the image's size or nothing is painted."""
    from PIL import Image, ImageChops

    mask = Image.new("L", size, 0)
    for k, path in enumerate(layers):
        layer = read_image(path, f"mask layer {k + 1}").convert("RGBA")
        if layer.size != size:
            raise WorkbenchError(f"the mask is {layer.size[0]}x{layer.size[1]} and the init image {size[0]}x{size[1]}: "
                                 "a mask covers its image exactly")
        mask = ImageChops.lighter(mask, layer.getchannel("A").point(lambda a: 255 if a else 0))
    if mask.getbbox() is None:
        raise WorkbenchError("nothing is painted on the image: paint what inpainting redraws")
    return mask


def mode_name(mode) -> str:
    mode = mode or "txt2img"
    if mode not in MODES:
        raise WorkbenchError(f"mode must be one of {', '.join(MODES)}, got {str(mode)[:40]!r}")
    return mode


def hires_of(mode, scale, steps, upscaler, strength) -> HiresFix | None:
    """The hires fix a text-to-image request asks for (an upscale above 1), else None."""
    if mode_name(mode) != "txt2img" or scale is None or float(scale) <= 1:
        return None
    return HiresFix(float(scale), int(steps or 0), upscaler or DEFAULT_HIRES_UPSCALER,
                    DEFAULT_STRENGTH if strength is None else strength)


def init_of(mode, image, editor, strength, mask_blur) -> InitImage | None:
    """The init image (and painted mask) an image-to-image or inpainting request draws from; None for text to image;
    a one-line WorkbenchError where the mode's image is missing."""
    mode = mode_name(mode)
    strength = DEFAULT_STRENGTH if strength is None else strength
    if mode == "img2img":
        path = upload_path(image)
        if path is None:
            raise WorkbenchError("image to image starts from an image: upload one")
        return InitImage(read_image(path, "the init image"), strength)
    if mode == "inpaint":
        background, layers = editor_paths(editor)
        if background is None:
            raise WorkbenchError("inpainting starts from an image: upload one and paint what to redraw")
        picture = read_image(background, "the init image")
        mask = painted_mask(layers, picture.size)
        return InitImage(picture, strength, mask, DEFAULT_MASK_BLUR if mask_blur is None else mask_blur)
    return None


def control_request(controlnet, image, preprocess, weight, start, end) -> Control | None:
    """The ControlNet a request steers with, its control image read within bounds and every setting checked, the
    ControlNet named by its reference (``Control.name``) and not yet opened (``Control.model`` None: the service opens
    it under its folders against the checkpoint's UNet); None where no ControlNet is named; one line where the
    ControlNet or its image is missing."""
    from .generate import checkpoint_name

    ref = checkpoint_name(controlnet or "").strip()
    path = upload_path(image)
    if not ref:
        if path is not None:
            raise WorkbenchError("a control image steers through a ControlNet: name one, or remove the image")
        return None
    if path is None:
        raise WorkbenchError("a ControlNet steers from a control image: upload one")
    return Control(None, ref, "", read_image(path, "the control image"), preprocess or "none",
                   1.0 if weight is None else weight, 0.0 if start is None else start, 1.0 if end is None else end)


def uploads_of(image, editor) -> list[str]:
    """Every uploaded file a request's mode inputs name, for the uploads keeper to delete once read."""
    background, layers = editor_paths(editor)
    composite = upload_path(editor.get("composite")) if isinstance(editor, dict) else None
    return [p for p in (upload_path(image), background, composite, *layers) if p]


def with_strength(params, strength: float):
    """``params`` (``app.generate.GenerationParams``) redrawing its init image or its hires fix at ``strength``: an
    X/Y/Z plot's strength axis; a one-line WorkbenchError for a request drawn from its prompt alone."""
    if params.init is not None:
        return replace(params, init=replace(params.init, strength=strength))
    if params.hires is not None:
        return replace(params, hires=replace(params.hires, strength=strength))
    raise WorkbenchError("a strength axis redraws an init image or a hires fix: choose Image to image or Inpaint, or "
                         "a hires upscale above 1, in the Generate tab")
