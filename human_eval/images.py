"""Rater-facing image bytes: pixels only, never metadata, and one encoding whatever the source.

Generators write their settings (model, checkpoint, sampler, seed) into PNG text chunks and EXIF, which
a rater could read with any image viewer. A study therefore stores every image re-encoded from its
pixels, and the server passes those bytes through `strip_png_metadata` again before serving them.

The encoding itself must not tell models apart either: one model's images saved as RGBA (PNG colour
type 6) and another's as RGB (type 2) are told apart by a byte of the header. Every image becomes 8-bit
RGB (`rgb8`) and is written by one encoder with fixed settings, so two sources with the same pixels give
the same bytes. Nor may the size: a 16 px model's images beside a 32 px model's named the model in the
PNG header, so every image of a study is brought to the study's one size (`fit`). Gold decoys are made
as large, as PNG files, as the real image they stand against.
"""
from __future__ import annotations

import io
import os
import struct
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

from .limits import DEFAULT_MAX_MEGAPIXELS, MAX_SIDE

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BACKDROP = (221, 221, 221)  # the rating page's image background (#ddd): what transparent pixels showed on
COMPRESS_LEVEL = 6
PIXEL_CHUNKS = frozenset({b"IHDR", b"PLTE", b"tRNS", b"IDAT", b"IEND"})  # what a decoder needs to show the pixels


def strip_png_metadata(data: bytes) -> bytes:
    """The PNG with every ancillary chunk removed (tEXt, zTXt, iTXt, eXIf, iCCP, tIME, pHYs, ...).

    Raises ValueError for bytes that are not a well-formed PNG.
    """
    if not data.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG file")
    out, pos = [PNG_SIGNATURE], len(PNG_SIGNATURE)
    while pos < len(data):
        if pos + 8 > len(data):
            raise ValueError("truncated PNG chunk header")
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        end = pos + 12 + length
        if end > len(data):
            raise ValueError(f"truncated PNG chunk {kind!r}")
        if kind in PIXEL_CHUNKS:
            out.append(data[pos:end])
        pos = end
        if kind == b"IEND":
            break
    else:
        raise ValueError("PNG without IEND")
    return b"".join(out)


def png_chunk_types(data: bytes) -> list[bytes]:
    """The chunk types of a PNG in order (for checks and tests)."""
    kinds, pos = [], len(PNG_SIGNATURE)
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        kinds.append(kind)
        pos += 12 + length
    return kinds


def rgb8(image: Image.Image) -> Image.Image:
    """A new 8-bit RGB image of the same pixels and nothing else (no info, EXIF, ICC profile).

    16-bit values are scaled to 8 bits (v / 257, rounded); transparency is composited over `BACKDROP`,
    as the page showed it; palette, grey, CMYK and YCbCr images are converted to RGB.
    """
    image.load()
    if image.mode.startswith("I") or image.mode == "F":  # I;16 from 16-bit PNGs, I and F from other tools
        scale = 257.0 if image.mode != "F" else 1.0
        grey = np.clip(np.round(np.asarray(image, dtype=np.float64) / scale), 0, 255).astype(np.uint8)
        image = Image.fromarray(grey)
    if "A" in image.getbands() or "transparency" in image.info:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (*BACKDROP, 255)), rgba)
    rgb = image.convert("RGB")
    return Image.frombytes("RGB", rgb.size, rgb.tobytes())


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    if not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    return struct.unpack(">II", data[16:24])


def pixels_problem(size: tuple[int, int], max_megapixels: float) -> str | None:
    """Why an image of ``size`` is not decoded (more pixels than ``max_megapixels``), or None."""
    width, height = size
    megapixels = width * height / 1e6
    if megapixels <= max_megapixels:
        return None
    shown = f"{megapixels:.3g}" if megapixels < 1000 else f"{megapixels:,.0f}"
    return f"{width}x{height} is {shown} megapixels, over the limit of {max_megapixels:g} (--max-megapixels)"


def open_image(path: str | Path, max_megapixels: float = DEFAULT_MAX_MEGAPIXELS) -> Image.Image:
    """The image at ``path``, its header read and nothing decoded yet; ValueError for one whose pixels are over
    ``max_megapixels`` (a flat 12000 x 12000 PNG is 434 KB on disk and 432 MB once decoded)."""
    try:
        image = Image.open(path)
    except Image.DecompressionBombError as e:  # PIL's own refusal, past 179 megapixels
        raise ValueError(f"{e} (--max-megapixels)") from None
    if problem := pixels_problem(image.size, max_megapixels):
        image.close()
        raise ValueError(problem)
    return image


def image_size(path: str | Path, max_megapixels: float = DEFAULT_MAX_MEGAPIXELS) -> tuple[int, int]:
    """(width, height) of an image file, from its header; ValueError past ``max_megapixels``."""
    with open_image(path, max_megapixels) as image:
        return image.size


def largest_size(sizes) -> tuple[int, int]:
    """The size with the most pixels (then the widest)."""
    return max(sizes, key=lambda wh: (wh[0] * wh[1], wh))


def study_size(sizes, max_side: int = MAX_SIDE) -> tuple[int, int]:
    """What a study's images are brought to by default: the largest of ``sizes``, shrunk by one factor to fit
    ``max_side`` x ``max_side`` where it is larger (every image was brought up to the largest one's size, and a
    single 12000 x 12000 image made each a 432 MB array)."""
    width, height = largest_size(sizes)
    scale = min(1.0, max_side / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))


def fit(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """An RGB image at exactly `size`: scaled by one factor to fit inside it (Lanczos, which also
    antialiases when shrinking), centred on `BACKDROP` where its aspect ratio is not the study's."""
    if image.size == size:
        return image
    w, h = image.size
    scale = min(size[0] / w, size[1] / h)
    inner = (max(1, round(w * scale)), max(1, round(h * scale)))
    resized = image.resize(inner, Image.Resampling.LANCZOS)
    if inner == size:
        return resized
    canvas = Image.new("RGB", size, BACKDROP)
    canvas.paste(resized, ((size[0] - inner[0]) // 2, (size[1] - inner[1]) // 2))
    return canvas


def encode_png(image: Image.Image, size: tuple[int, int] | None = None) -> bytes:
    """8-bit RGB PNG bytes of the image's pixels (brought to `size` if given), always with the same encoder settings."""
    image = rgb8(image)
    buf = io.BytesIO()
    (fit(image, size) if size else image).save(buf, format="PNG", compress_level=COMPRESS_LEVEL, optimize=False)
    return strip_png_metadata(buf.getvalue())


def clean_image(path: str | Path, size: tuple[int, int] | None = None,
                max_megapixels: float = DEFAULT_MAX_MEGAPIXELS) -> bytes:
    """The image at `path` (PNG, JPEG, WebP, any mode) as 8-bit RGB PNG bytes with its pixels only, at `size`;
    ValueError, before decoding, for one over `max_megapixels`."""
    with open_image(path, max_megapixels) as image:
        return encode_png(image, size)


def degrade(path: str | Path, seed: int, target_bytes: int, size: tuple[int, int] | None = None,
            max_megapixels: float = DEFAULT_MAX_MEGAPIXELS) -> bytes:
    """A clearly worse copy of an image for gold (attention-check) pairs, about `target_bytes` as a PNG.

    The image is made coarse (1/16 of its size) and blurred, then given Gaussian noise whose strength is
    searched so that the PNG has about the target size. Noise is what makes a PNG large, and decoys with
    a fixed amount of it were 1.8-2.8x larger than ordinary images, which gave them away to anyone
    comparing file sizes.
    """
    with open_image(path, max_megapixels) as image:
        image = rgb8(image)
    if size:
        image = fit(image, size)
    w, h = image.size
    small = image.resize((max(1, w // 16), max(1, h // 16)), Image.Resampling.BILINEAR)
    image = small.resize((w, h), Image.Resampling.NEAREST).filter(ImageFilter.GaussianBlur(radius=max(1, w // 64)))
    base = np.asarray(image, dtype=np.float32)  # (H, W, 3)
    noise = np.random.default_rng(seed).normal(0.0, 1.0, base.shape).astype(np.float32)  # (H, W, 3)

    def encoded(t: float) -> bytes:  # noise sigma from 0.05 to 64 levels on a log scale: sizes grow smoothly
        pixels = np.round(base + 0.05 * 1280.0 ** t * noise)
        return encode_png(Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)))

    lo, hi, best = 0.0, 1.0, b""
    for _ in range(14):  # the PNG grows with the noise (up to sigma 64, before clipping flattens it): bisect
        mid = (lo + hi) / 2
        data = encoded(mid)
        if not best or abs(len(data) - target_bytes) < abs(len(best) - target_bytes):
            best = data
        lo, hi = (mid, hi) if len(data) < target_bytes else (lo, mid)
    return best


def covariates(data: bytes) -> dict[str, float]:
    """What a rater may prefer besides the model: mean brightness and saturation (0-1), file size, pixels."""
    with Image.open(io.BytesIO(data)) as image:
        hsv = np.asarray(image.convert("HSV"), dtype=np.float64) / 255  # (H, W, 3)
        luma = np.asarray(image.convert("L"), dtype=np.float64) / 255  # (H, W)
        w, h = image.size
    return {"brightness": float(luma.mean()), "saturation": float(hsv[..., 1].mean()),
            "file_bytes": float(len(data)), "pixels": float(w * h)}


def _header_size(path: Path) -> tuple[int, int] | None:
    """A study image's size from its PNG header (nothing is decoded); None for a file that is not a PNG."""
    try:
        with open(path, "rb") as f:
            return png_size(f.read(24))
    except (OSError, ValueError):
        return None


class ImageCache:
    """Study images in memory, least recently used out first once `max_bytes` is reached.

    Each file is read, stripped and checked for the study's size once (a file of another size, from a study
    made before sizes were fixed or changed since, is re-encoded to it); later requests are a dictionary lookup.
    """

    def __init__(self, files: dict[str, Path], size: tuple[int, int] | None = None, max_bytes: int = 256 << 20):
        self.files = files  # opaque token -> file inside the study folder
        self.size = size or study_size([s for s in map(_header_size, files.values()) if s] or [(MAX_SIDE, MAX_SIDE)])
        self.max_bytes = max_bytes
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, token: str) -> bytes | None:
        """The PNG bytes for a token, or None for a token the study does not know."""
        with self._lock:
            data = self._cache.get(token)
            if data is not None:
                self._cache.move_to_end(token)
                return data
        path = self.files.get(token)
        if path is None:
            return None
        try:  # the study's checked path, never a link put there since
            with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
                data = self.served(f.read())
        except (OSError, ValueError):  # gone, not a PNG, or too many pixels to decode: not served
            return None
        with self._lock:
            if token not in self._cache:
                self._cache[token] = data
                self._size += len(data)
                while self._size > self.max_bytes and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._size -= len(old)
        return data

    def served(self, data: bytes) -> bytes:
        """A file's bytes as raters get them: pixels only, at the study's size."""
        data = strip_png_metadata(data)
        if png_size(data) == self.size:
            return data
        if problem := pixels_problem(png_size(data), DEFAULT_MAX_MEGAPIXELS):
            raise ValueError(problem)
        with Image.open(io.BytesIO(data)) as image:
            return encode_png(image, self.size)
