"""Rater-facing image bytes: pixels only, never metadata.

Generators write their settings (model, checkpoint, sampler, seed) into PNG text chunks and EXIF, which
a rater could read with any image viewer. A study therefore stores every image re-encoded from its
pixels, and the server passes those bytes through `strip_png_metadata` again before serving them.
"""
from __future__ import annotations

import io
import struct
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
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


def _pixels_only(image: Image.Image) -> Image.Image:
    """A new image holding the same pixels and nothing else (no info, EXIF, ICC profile)."""
    image.load()
    if image.mode not in ("RGB", "RGBA", "L", "LA"):
        image = image.convert("RGBA" if "A" in image.getbands() or "transparency" in image.info else "RGB")
    return Image.frombytes(image.mode, image.size, image.tobytes())


def encode_png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    _pixels_only(image).save(buf, format="PNG", compress_level=6)
    return strip_png_metadata(buf.getvalue())


def clean_image(path: str | Path) -> bytes:
    """The image at `path` (PNG, JPEG, WebP) as PNG bytes with its pixels only; lossless for the pixels."""
    with Image.open(path) as image:
        return encode_png(image)


def degrade(path: str | Path, seed: int) -> bytes:
    """A clearly worse copy of an image for gold (attention-check) pairs: coarse pixels, blur and noise."""
    with Image.open(path) as image:
        image = _pixels_only(image).convert("RGB")
    w, h = image.size
    small = image.resize((max(1, w // 16), max(1, h // 16)), Image.Resampling.BILINEAR)
    image = small.resize((w, h), Image.Resampling.NEAREST).filter(ImageFilter.GaussianBlur(radius=max(1, w // 64)))
    pixels = np.asarray(image, dtype=np.float32)  # (H, W, 3)
    noise = np.random.default_rng(seed).normal(0.0, 40.0, pixels.shape)
    return encode_png(Image.fromarray(np.clip(pixels + noise, 0, 255).astype(np.uint8)))


class ImageCache:
    """Study images in memory, least recently used out first once `max_bytes` is reached.

    Each file is read and stripped once; later requests are a dictionary lookup.
    """

    def __init__(self, files: dict[str, Path], max_bytes: int = 256 << 20):
        self.files = files  # opaque token -> file inside the study folder
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
        data = strip_png_metadata(path.read_bytes())
        with self._lock:
            if token not in self._cache:
                self._cache[token] = data
                self._size += len(data)
                while self._size > self.max_bytes and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._size -= len(old)
        return data
