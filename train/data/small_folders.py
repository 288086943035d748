"""A small folder of images from elsewhere, as DreamBooth trains on it (``dwb data dreambooth``): images with
``NAME.txt`` captions beside them (kohya's and diffusers' layout) or one caption template for all, and masks for
the loss in ``masks/`` under the same file stem (kohya's ``conditioning_data_dir`` and SimpleTuner's mask
datasets pair a mask with its image by file name) or in each image's alpha channel.

Unlike ``dwb data convert``, which skips and counts what it cannot read in millions of samples, a folder of a few
dozen photos chosen by hand is refused whole, in one line naming the file: a link (anywhere below the folder, the
``masks/`` folder itself too: ``models.readers.outside_root``), a file that is not an image, an image with more
pixels to decode than the limit (checked from its header, before decoding), a caption over ``MAX_CAPTION_BYTES`` or
not UTF-8. Nothing outside the folder is opened.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageOps

from models.errors import WorkbenchError, first_line
from models.readers import outside_root

from .records import IMAGE_SUFFIXES, MAX_SIDECAR_BYTES
from .storage import read_bounded

MASKS = "masks"  # the folder of masks inside the image folder (unless one is named): masks/NAME.png for NAME.jpg
# The most images one folder may hold: every image's name and caption are held at once, and each is written
# `repeats` times. DreamBooth's paper used 3 to 5 images, kohya's and SimpleTuner's guides tens; a set of
# thousands is a dataset for `dwb data convert` (and a stream's `repeat`).
MAX_IMAGES = 1000
MAX_ENTRIES = 10 * MAX_IMAGES  # files of a folder listed: images, captions, and what else lies there
# A caption is a prompt: CLIP reads 77 tokens, T5 512 (a few KB). 1 MiB is convert's bound on a sidecar.
MAX_CAPTION_BYTES = MAX_SIDECAR_BYTES


@dataclass(frozen=True)
class Captions:
    """Each image's caption: its ``NAME.txt``, or the ``template`` where it has none. In the template ``{class}``
    stands for ``class_word``; a template holding ``{caption}`` is every image's caption, with its ``NAME.txt`` in
    that place (then each image needs one). E.g. "a photo of sks {class}", or "sks {class}, {caption}"."""

    template: str | None = None
    class_word: str | None = None

    def __post_init__(self):
        if self.template is not None and not self.template.strip():
            raise WorkbenchError("the caption template is empty")
        if self.template and "{class}" in self.template and not self.class_word:
            raise WorkbenchError(f"the caption template {self.template!r} holds {{class}}: give the class word "
                                 f"(--class-word, e.g. dog)")

    def of(self, sidecar: str | None, name: str, where: str) -> str:
        text = None if sidecar is None else " ".join(sidecar.split())
        if self.template is None or (text and "{caption}" not in self.template):
            if not text:
                raise WorkbenchError(f"{where}: {name} has no caption (an empty or missing "
                                     f"{Path(name).stem}.txt beside it); write one, or give a caption template")
            return text
        if "{caption}" in self.template and not text:
            raise WorkbenchError(f"{where}: {name} has no {Path(name).stem}.txt for the template's {{caption}}")
        return self.fill(self.template).replace("{caption}", text or "")

    def fill(self, text: str) -> str:
        """``text`` with ``{class}`` replaced by the class word."""
        return text.replace("{class}", self.class_word or "")


@dataclass(frozen=True)
class FolderImage:
    name: str  # the image's file name in its folder
    path: Path
    caption: str
    mask: Path | None  # masks/<stem>.<suffix>, where there is one


def refused(where: str, name: str, reason: str) -> WorkbenchError:
    return WorkbenchError(f"{where}: {name} {reason}; refused")


def _listing(root: Path, where: str) -> list[str]:
    """The names in ``root``, read up to ``MAX_ENTRIES`` (a folder of millions is not listed whole)."""
    if not root.is_dir():
        raise WorkbenchError(f"{where} is not a folder")
    names = []
    with os.scandir(root) as entries:
        for entry in entries:
            names.append(entry.name)
            if len(names) > MAX_ENTRIES:
                raise WorkbenchError(f"{where} holds more than {MAX_ENTRIES:,} files; a DreamBooth folder holds up to "
                                     f"{MAX_IMAGES} images (convert a larger set with `dwb data convert`)")
    return names


def _masks(root: Path, stems: dict[str, str], where: str, given: Path | None = None) -> dict[str, Path]:
    """stem -> its mask: in ``given`` (a folder of its own, kohya's layout) or else in ``root``'s ``masks/``; a mask
    without an image of its stem is one line (a name mistyped would otherwise leave its image unmasked without a
    word)."""
    base, prefix = (given, f"{given}/") if given is not None else (root, f"{MASKS}/")
    if given is None and (root / MASKS).is_symlink():
        raise refused(where, f"{MASKS}/", "is a symbolic link")
    folder = base if given is not None else root / MASKS
    if not folder.is_dir():
        if given is not None:
            raise WorkbenchError(f"mask folder {given} is not a folder")
        return {}
    masks: dict[str, Path] = {}
    for name in sorted(os.listdir(folder)):
        if Path(name).suffix.lower() not in IMAGE_SUFFIXES:
            continue
        if reason := outside_root(base, name if given is not None else f"{MASKS}/{name}"):
            raise refused(where, prefix + name, reason)
        stem = Path(name).stem
        if stem not in stems:
            raise WorkbenchError(f"{where}: {prefix}{name} masks no image (none is named {stem}.*)")
        if stem in masks:
            raise WorkbenchError(f"{where}: {prefix} holds two masks of {stems[stem]}: {masks[stem].name} and {name}")
        masks[stem] = folder / name
    return masks


def _caption_text(root: Path, name: str, where: str) -> str | None:
    """The text of ``name`` (a sidecar), None where there is none; refused when it is a link, over
    ``MAX_CAPTION_BYTES`` or not UTF-8."""
    if reason := outside_root(root, name):
        if reason == "does not exist":
            return None
        raise refused(where, name, reason)
    data = read_bounded(str(root / name), MAX_CAPTION_BYTES)
    if data is None:
        raise refused(where, name, f"holds more than {MAX_CAPTION_BYTES // 2**20} MiB (a caption is a prompt)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise refused(where, name, "is not UTF-8 text") from None


def read_small_folder(root: str | Path, captions: Captions, where: str = "image folder",
                      masks: str | Path | None = None) -> list[FolderImage]:
    """The images of ``root`` (its top level, in name order) with their captions and masks (``masks``: their
    folder, else ``root/masks``), every file judged before it is read; one line on the first that is refused."""
    root = Path(root)
    where = f"{where} {root}"
    listing = _listing(root, where)
    images = sorted(n for n in listing if Path(n).suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise WorkbenchError(f"{where} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    if len(images) > MAX_IMAGES:
        raise WorkbenchError(f"{where} holds {len(images)} images; a DreamBooth folder holds up to {MAX_IMAGES} "
                             f"(convert a larger set with `dwb data convert`)")
    stems: dict[str, str] = {}
    for name in images:
        if reason := outside_root(root, name):
            raise refused(where, name, reason)
        if (stem := Path(name).stem) in stems:
            raise WorkbenchError(f"{where}: {stems[stem]} and {name} share the name {stem} (and so a caption "
                                 f"and a mask); rename one")
        stems[stem] = name
    found = _masks(root, stems, where, None if masks is None else Path(masks))
    return [FolderImage(name, root / name, captions.of(_caption_text(root, f"{Path(name).stem}.txt", where), name,
                                                       where), found.get(Path(name).stem))
            for name in images]


def _opened(path: Path, max_pixels: float, what: str) -> Image.Image:
    """The image opened, its header read and nothing decoded; refused in one line when it has more than
    ``max_pixels`` to decode (a 505 KB PNG of 13000 x 13000 took 2.6 GB decoded) or is not an image."""
    try:
        img = Image.open(path)
    except Image.DecompressionBombError:  # PIL's own bound (twice Image.MAX_IMAGE_PIXELS), checked on opening
        raise WorkbenchError(f"{what} has more than {max_pixels / 1e6:g} MP to decode; refused") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise WorkbenchError(f"{what} is not an image ({first_line(e)}); refused") from None
    if img.width * img.height > max_pixels:
        img.close()
        raise WorkbenchError(f"{what} is {img.width}x{img.height}, more than {max_pixels / 1e6:g} MP to decode; "
                             f"refused (scale it down, or raise --max-megapixels)")
    return img


def image_size(path: Path, max_pixels: float, what: str) -> tuple[int, int]:
    """(width, height) from the header, refused as ``load_image`` refuses: every image of a folder is judged so
    before a class image is drawn (minutes on a GPU spent before a bomb was found)."""
    with _opened(path, max_pixels, what) as img:
        return img.size


def load_image(path: Path, max_pixels: float, what: str, mode: str | None = None) -> Image.Image:
    """An image upright (its EXIF orientation applied), in ``mode`` where given, else in its own; refused in one
    line before decoding (``_opened``), and when it does not decode."""
    with _opened(path, max_pixels, what) as img:
        try:
            img.load()
            upright = ImageOps.exif_transpose(img)  # a copy, apart from the file
            return upright if mode is None else upright.convert(mode)
        except (OSError, SyntaxError, ValueError) as e:
            raise WorkbenchError(f"{what} cannot be decoded ({first_line(e)}); refused") from None


def has_alpha(img: Image.Image) -> bool:
    return img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info
