"""What a generation starts from besides noise: an init image (image to image), an init image and a mask
(inpainting), or its own first draw enlarged (hires fix), and the images from elsewhere they read.

The calls themselves are diffusers' own image-to-image and inpainting pipelines, built from the text-to-image
pipeline's modules (``models.generation.images``; each family's entry names them: ``Family.img2img_pipeline`` and
``Family.inpaint_pipeline``). A base model inpaints too: its pipeline blends the image's own latents outside the
mask at every step, as diffusers does; an inpainting model (a UNet that takes the mask and the masked image beside
its latents: 9 input channels for 4 latent ones) draws only with a mask. The names and defaults are AUTOMATIC1111's:
``Denoising strength`` 0.75 (image to image) and 0.7 (hires fix), ``Mask blur`` 4, ``Hires upscale`` 2 by the
``Latent`` upscaler, ``Hires steps`` 0 (as many as the first draw). A ControlNet (``Control``) steers a text-to-image
draw through the family's ControlNet pipeline (``Family.controlnet_pipeline``) with its control image, preprocessed
by canny where asked.

Light to import (no torch): command lines show these values in their help.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import WorkbenchError
from .defaults import MAX_STEPS

DEFAULT_STRENGTH = 0.75  # A1111's img2img "Denoising strength"
DEFAULT_HIRES_STRENGTH = 0.7  # A1111's hires fix "Denoising strength"
DEFAULT_MASK_BLUR = 4  # A1111's "Mask blur", in pixels: the Gaussian radius diffusers' mask processor blurs with
MAX_MASK_BLUR = 64  # A1111's slider's end
MAX_CLIP_SKIP = 12  # A1111's slider's end
DEFAULT_HIRES_SCALE, MAX_HIRES_SCALE = 2.0, 4.0  # A1111's "Upscale by" default and slider's end
# An image read as an init image or a mask: at most 4096 x 4096 pixels (64 MiB as RGBA), what the app's PNG Info
# decodes; the size is read from the file's header, so a larger one (a decompression bomb of a few KiB declaring
# 100,000 x 100,000) is refused before a pixel is decoded.
MAX_INIT_PIXELS = 4096 * 4096
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP")
# A1111's hires upscalers that need no model of their own: the latents enlarged by torch's interpolation (mode,
# antialias), or the decoded pixels by PIL's filter.
LATENT_UPSCALERS = {"Latent": ("bilinear", False), "Latent (antialiased)": ("bilinear", True),
                    "Latent (bicubic)": ("bicubic", False), "Latent (bicubic antialiased)": ("bicubic", True),
                    "Latent (nearest)": ("nearest", False), "Latent (nearest-exact)": ("nearest-exact", False)}
PIXEL_UPSCALERS = {"Lanczos": "LANCZOS", "Nearest": "NEAREST"}
HIRES_UPSCALERS = (*LATENT_UPSCALERS, *PIXEL_UPSCALERS)
DEFAULT_HIRES_UPSCALER = "Latent"
MODES = ("txt2img", "img2img", "inpaint")  # what a record's ``mode`` says; "" is text to image as well
# ControlNet, as AUTOMATIC1111's ControlNet extension sets it: the preprocessor ("Module") run on the uploaded image,
# canny's thresholds (its "Threshold A" and "Threshold B" sliders: 100 and 200 of 1 to 255), the "Weight" (diffusers'
# controlnet_conditioning_scale, the extension's slider from 0 to 2) and the share of the steps it steers ("Guidance
# Start" to "Guidance End")
CONTROL_MODULES = ("none", "canny")
DEFAULT_CANNY = (100, 200)
MAX_CONTROL_WEIGHT = 2.0


def check_strength(value, what: str = "denoising strength") -> float:
    """``value`` as a float in (0, 1]: the share of the schedule redrawn (1: from noise); one line otherwise."""
    try:
        strength = float(value)
    except (TypeError, ValueError):
        raise WorkbenchError(f"{what} must be a number in (0, 1], got {str(value)[:40]!r}") from None
    if isinstance(value, bool) or not 0 < strength <= 1:  # NaN too
        raise WorkbenchError(f"{what} must be in (0, 1] (the share of the steps redrawn), got {strength:g}")
    return strength


def _whole(value, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or not lo <= value <= hi:
        raise WorkbenchError(f"{what} must be a whole number from {lo} to {hi}, got {str(value)[:40]!r}")
    return int(value)


@dataclass(frozen=True)
class InitImage:
    """What image to image starts from: ``image`` (PIL, RGB) noised to ``strength`` of the schedule and redrawn;
    with ``mask`` (PIL, L: white is redrawn, black kept; the image's size) inpainting, the mask blurred by
    ``mask_blur`` pixels first."""

    image: object = field(repr=False)
    strength: float = DEFAULT_STRENGTH
    mask: object = field(repr=False, default=None)
    mask_blur: int = DEFAULT_MASK_BLUR

    def __post_init__(self):
        object.__setattr__(self, "strength", check_strength(self.strength))
        object.__setattr__(self, "mask_blur", _whole(self.mask_blur, "mask blur", 0, MAX_MASK_BLUR))
        check_pixels(self.image.size, "the init image")
        object.__setattr__(self, "image", self.image.convert("RGB"))
        if self.mask is not None:
            if self.mask.size != self.image.size:
                raise WorkbenchError(f"the mask is {self.mask.size[0]}x{self.mask.size[1]} and the init image "
                                     f"{self.image.size[0]}x{self.image.size[1]}: a mask covers its image exactly")
            object.__setattr__(self, "mask", self.mask.convert("L"))

    @property
    def mode(self) -> str:
        return "inpaint" if self.mask is not None else "img2img"

    def fitted(self, width: int, height: int):
        """(image, mask) at ``width`` x ``height`` (AUTOMATIC1111's "Just resize": Lanczos), the mask None where there
        is none; unchanged where they are that size already."""
        from PIL import Image

        if self.image.size == (width, height):
            return self.image, self.mask
        mask = None if self.mask is None else self.mask.resize((width, height), Image.Resampling.LANCZOS)
        return self.image.resize((width, height), Image.Resampling.LANCZOS), mask


@dataclass(frozen=True)
class HiresFix:
    """AUTOMATIC1111's hires fix: the image drawn at the settings' size, enlarged ``scale`` times by ``upscaler`` (its
    latents, or its pixels), then redrawn by image to image at ``strength`` over ``steps`` (0: the first draw's)."""

    scale: float = DEFAULT_HIRES_SCALE
    steps: int = 0
    upscaler: str = DEFAULT_HIRES_UPSCALER
    strength: float = DEFAULT_HIRES_STRENGTH

    def __post_init__(self):
        scale = self.scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 1 < scale <= MAX_HIRES_SCALE:
            raise WorkbenchError(f"hires upscale must be a number above 1 and at most {MAX_HIRES_SCALE:g}, "
                                 f"got {str(scale)[:40]!r}")
        object.__setattr__(self, "scale", float(scale))
        object.__setattr__(self, "steps", _whole(self.steps, "hires steps", 0, MAX_STEPS))
        if self.upscaler not in HIRES_UPSCALERS:
            raise WorkbenchError(f"hires upscaler {str(self.upscaler)[:40]!r} is not one of: "
                                 f"{', '.join(HIRES_UPSCALERS)}")
        object.__setattr__(self, "strength", check_strength(self.strength, "hires denoising strength"))

    @property
    def in_latents(self) -> bool:
        return self.upscaler in LATENT_UPSCALERS

    def target(self, width: int, height: int, multiple: int) -> tuple[int, int]:
        """The second draw's size: each side times ``scale``, down to a multiple of ``multiple`` (as A1111 rounds
        to its 8)."""
        return tuple(max(multiple, math.floor(side * self.scale / multiple) * multiple) for side in (width, height))

    def steps_of(self, first: int) -> int:
        return self.steps or first


@dataclass(frozen=True)
class Control:
    """A ControlNet steering a text-to-image draw: ``model`` (``models.checkpoints.open_controlnet``'s, named ``name``
    and hashed ``hash`` for the record) conditioned on ``image`` (PIL) after the ``module`` preprocessor, at ``weight``
    from ``start`` to ``end`` of the steps. The control image is resized to the drawn size by diffusers' control image
    processor (Lanczos: AUTOMATIC1111's "Just Resize"), so one of another size or aspect is stretched to it."""

    model: object = field(repr=False)
    name: str
    hash: str
    image: object = field(repr=False)
    module: str = "none"
    weight: float = 1.0
    start: float = 0.0
    end: float = 1.0
    thresholds: tuple[int, int] = DEFAULT_CANNY

    def __post_init__(self):
        if self.module not in CONTROL_MODULES:
            raise WorkbenchError(f"control preprocess {str(self.module)[:40]!r} is not one of: "
                                 f"{', '.join(CONTROL_MODULES)}")
        object.__setattr__(self, "weight", _fraction(self.weight, "control strength", MAX_CONTROL_WEIGHT))
        object.__setattr__(self, "start", _fraction(self.start, "control start"))
        object.__setattr__(self, "end", _fraction(self.end, "control end"))
        if not self.start < self.end:
            raise WorkbenchError(f"control start {self.start:g} must come before control end {self.end:g} (the share "
                                 "of the steps the ControlNet steers)")
        low, high = (_whole(t, "canny threshold", 1, 255) for t in self.thresholds)
        if not low <= high:
            raise WorkbenchError(f"canny's low threshold {low} is above its high one {high}")
        object.__setattr__(self, "thresholds", (low, high))
        check_pixels(self.image.size, "the control image")
        object.__setattr__(self, "image", self.image.convert("RGB"))

    def hint(self):
        """The image the ControlNet is given (PIL, RGB): the upload itself, or its canny edges as A1111's canny
        module makes them (OpenCV's ``Canny`` over the RGB pixels at the upload's size, white edges on black)."""
        if self.module == "none":
            return self.image
        import cv2
        import numpy as np
        from PIL import Image

        edges = cv2.Canny(np.asarray(self.image), *self.thresholds)
        return Image.fromarray(np.stack([edges] * 3, axis=-1))


def _fraction(value, what: str, top: float = 1.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= top:
        raise WorkbenchError(f"{what} must be a number from 0 to {top:g}, got {str(value)[:40]!r}")
    return float(value)


def check_pixels(size: tuple[int, int], what: str) -> None:
    width, height = size
    if width * height > MAX_INIT_PIXELS:
        raise WorkbenchError(f"{what} is {width}x{height} pixels; at most {MAX_INIT_PIXELS:,} are read "
                             f"({math.isqrt(MAX_INIT_PIXELS)}x{math.isqrt(MAX_INIT_PIXELS)})")


def read_image(source, what: str):
    """The image a file (a path, or a file object) holds, as PIL, decoded only after its header's size is held to
    ``MAX_INIT_PIXELS``; PNG, JPEG or WebP alone; a one-line WorkbenchError naming ``what`` otherwise."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source, formats=list(IMAGE_FORMATS)) as image:
                check_pixels(image.size, what)
                image.load()
                return image.copy()
    except WorkbenchError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise WorkbenchError(f"{what} declares over {Image.MAX_IMAGE_PIXELS:,} pixels (a decompression bomb); at "
                             f"most {MAX_INIT_PIXELS:,} are read") from None
    except FileNotFoundError:
        raise WorkbenchError(f"{what}: no such file: {Path(str(source)).name}") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise WorkbenchError(f"{what} is not a readable PNG, JPEG or WebP image ({type(e).__name__})") from None


def upscale_latents(latents, size: tuple[int, int], upscaler: str):
    """(B, C, h, w) latents enlarged to ``size`` (height, width) by the latent upscaler's interpolation."""
    import torch.nn.functional as F

    mode, antialias = LATENT_UPSCALERS[upscaler]
    return F.interpolate(latents, size=size, mode=mode, antialias=antialias)


def upscale_pixels(images, size: tuple[int, int], upscaler: str) -> list:
    """(B, H, W, 3) float images in [0, 1] as PIL images enlarged to ``size`` (width, height) by the pixel upscaler."""
    import numpy as np
    from PIL import Image

    resample = getattr(Image.Resampling, PIXEL_UPSCALERS[upscaler])
    return [Image.fromarray((image * 255).round().astype(np.uint8)).resize(size, resample) for image in images]
