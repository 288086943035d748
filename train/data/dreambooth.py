"""`dwb data dreambooth FOLDER OUT`: a small folder of images into an MDS dataset as DreamBooth trains on it.

- Instance images (``small_folders``: captions from ``NAME.txt`` or a template with a trigger word, masks from
  ``masks/NAME.png`` or the alpha channel), each written ``repeats`` times (kohya's ``num_repeats``: one epoch sees
  each image that often; each repeat is its own sample, so random crops differ between them);
- class images for prior preservation, flagged ``prior`` = 1 (``class_images``: drawn by the base through the
  generation path, cached); the training loss weighs them by ``data.prior_loss_weight``;
- a held-out split, ``OUT/eval/<side>``, for ``validation.path``: the last ``hold_out`` images of the folder, or a
  folder of its own.

Each image is stored with its shorter side at each bucket side, uncropped, as ``dwb data convert`` stores it
(training crops), its mask resized with it; an image smaller than a side is refused. ``OUT/dreambooth.json``
records what was written and from what. The dataset is written into a folder beside OUT and renamed into place at
the end, so OUT is whole or absent.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from PIL import Image

from models.common import whole_folder, write_text_whole
from models.errors import WorkbenchError

from .class_images import ClassPrompt, cached_class_images
from .convert import DEFAULT_MAX_MEGAPIXELS, rgb_on_white
from models.datasets import open_writer
from .small_folders import Captions, FolderImage, has_alpha, image_size, load_image, read_small_folder

MAX_REPEATS = 10_000
RECORD = "dreambooth.json"


@dataclass
class DreamboothSummary:
    images: int = 0  # instance images trained on
    repeats: int = 1
    masked: int = 0  # of them, with a mask (a file or the alpha channel)
    held_out: int = 0
    class_images: int = 0
    class_drawn: int = 0  # drawn by this run (0: every one from the cache)
    class_folder: str | None = None
    written: dict[int, int] = field(default_factory=dict)  # side -> training samples

    def line(self) -> str:
        sides = ", ".join(f"{side}px {n}" for side, n in sorted(self.written.items()))
        prior = (f"; {self.class_images} class images ({self.class_drawn} drawn now, the rest from the cache "
                 f"{self.class_folder})" if self.class_images else "; no prior preservation")
        return (f"wrote {sides} training samples: {self.images} images x {self.repeats} repeats "
                f"({self.masked} masked){prior}; {self.held_out} held out")


@dataclass(frozen=True)
class _Written:
    """What each sample is written with."""
    sides: tuple[int, ...]
    max_pixels: float
    alpha_mask: bool
    masks: bool  # the dataset holds a mask column


def _mask_of(item: FolderImage, image: Image.Image, options: _Written, where: str) -> tuple[Image.Image | None, str]:
    """(the image's mask in L, 255 where the loss counts fully, or None; where it came from): its mask file (the
    red channel, as kohya reads one), else the alpha channel where ``alpha_mask`` asks for it."""
    if item.mask is not None:
        mask = load_image(item.mask, options.max_pixels, f"{where}: mask {item.mask.name}", "RGB").getchannel("R")
        if mask.size != image.size:
            raise WorkbenchError(f"{where}: mask {item.mask.name} is {mask.size[0]}x{mask.size[1]} px, its image "
                                 f"{item.name} {image.size[0]}x{image.size[1]}; a mask has its image's size")
        return mask, "file"
    if options.alpha_mask and has_alpha(image):
        return image.convert("RGBA").getchannel("A"), "alpha"
    return None, ""


def _at_side(image: Image.Image, side: int, resample: Image.Resampling) -> Image.Image:
    """Shorter side ``side``, the aspect ratio kept, no crop (``dwb data convert``'s square buckets)."""
    w, h = image.size
    size = (side, max(side, round(h * side / w))) if w <= h else (max(side, round(w * side / h)), side)
    return image if image.size == size else image.resize(size, resample)


def _samples(image: Image.Image, mask: Image.Image | None, caption: str, meta: dict,
             options: _Written) -> dict[int, dict]:
    """The sample of one image at each side (mask areas averaged down: a mask pixel is a weight); the folder's
    images were checked to be at least the largest side (``_check_sizes``), class images are drawn at it."""
    rgb = rgb_on_white(image)
    out = {}
    for side in options.sides:
        sample = {"image": _at_side(rgb, side, Image.Resampling.LANCZOS), "caption": caption,
                  "meta": {**meta, "original_size": list(image.size)}, "prior": int(meta["prior"])}
        if options.masks:
            full = mask if mask is not None else Image.new("L", image.size, 255)
            sample["mask"] = _at_side(full, side, Image.Resampling.BOX)
        out[side] = sample
    return out


def _write_folder_images(writers: dict, items: list[FolderImage], repeats: int, options: _Written,
                         where: str) -> int:
    """Each image of ``items`` ``repeats`` times into every side's writer; the images with a mask."""
    masked = 0
    for item in items:
        what = f"{where}: {item.name}"
        image = load_image(item.path, options.max_pixels, what)
        mask, source = _mask_of(item, image, options, where)
        masked += mask is not None
        meta = {"source": item.name, "prior": False, "mask": source or None}
        for side, sample in _samples(image, mask, item.caption, meta, options).items():
            for _ in range(repeats):
                writers[side].write(sample)
    return masked


def _write_class_images(writers: dict, files: list[Path], prompt: str, options: _Written) -> None:
    for file in files:
        image = load_image(file, options.max_pixels, f"class image {file}")
        meta = {"source": f"class/{file.name}", "prior": True, "mask": None}
        for side, sample in _samples(image, None, prompt, meta, options).items():
            writers[side].write(sample)


def _open_writers(folder: Path, options: _Written, image_format: str) -> dict:
    extra = ("prior", "mask") if options.masks else ("prior",)
    return {side: open_writer(folder / str(side), image_format, extra=extra) for side in options.sides}


def _close(writers: dict) -> None:
    for writer in writers.values():
        writer.finish()


def _check_arguments(sides, repeats: int, hold_out: int, validation, max_megapixels: float) -> None:
    if not sides or any(s <= 0 or s % 8 for s in sides):
        raise WorkbenchError(f"sizes must be positive multiples of 8 (the VAE's factor), got {list(sides)}")
    if not 1 <= repeats <= MAX_REPEATS:
        raise WorkbenchError(f"repeats must be from 1 to {MAX_REPEATS}, got {repeats}")
    if hold_out < 0:
        raise WorkbenchError(f"hold_out must be 0 or more, got {hold_out}")
    if hold_out and validation is not None:
        raise WorkbenchError("hold out images of the folder (--hold-out N) or give a validation folder "
                             "(--validation), not both")
    if not max_megapixels > 0:
        raise WorkbenchError(f"max_megapixels must be positive, got {max_megapixels}")


def _check_sizes(items: list[FolderImage], sides: tuple[int, ...], max_pixels: float, where: str) -> None:
    """Every image and mask judged from its header (``image_size``), and every image at least the largest side,
    before anything is drawn or written."""
    for item in items:
        size = image_size(item.path, max_pixels, f"{where}: {item.name}")
        if min(size) < max(sides):
            raise WorkbenchError(f"{where}: {item.name} is {size[0]}x{size[1]} px, smaller than the {max(sides)} px "
                                 f"bucket; give a larger image or smaller --sizes")
        if item.mask is not None:
            image_size(item.mask, max_pixels, f"{where}: mask {item.mask.name}")


def _split(items: list[FolderImage], hold_out: int, validation, captions: Captions, where: str):
    if validation is not None:
        return items, read_small_folder(validation, captions, "validation folder")
    if hold_out >= len(items):
        raise WorkbenchError(f"{where} holds {len(items)} images: holding out {hold_out} leaves none to train on")
    return (items[:len(items) - hold_out], items[len(items) - hold_out:]) if hold_out else (items, [])


def write_dreambooth(src: str | Path, out: str | Path, *, sizes=(512,), template: str | None = None,
                     class_word: str | None = None, repeats: int = 1, masks: str | Path | None = None,
                     alpha_mask: bool = False, hold_out: int = 0,
                     validation: str | Path | None = None, prior: ClassPrompt | None = None,
                     class_cache: str | Path | None = None, device: str = "auto", image_format: str = "png",
                     max_megapixels: float = DEFAULT_MAX_MEGAPIXELS,
                     say: Callable[[str], None] = print) -> DreamboothSummary:
    """The folder ``src`` as a DreamBooth dataset in ``OUT/<side>`` (and ``OUT/eval/<side>``); ``prior``: the class
    images to draw (or take from ``class_cache``, default ``class-images`` beside OUT); ``masks``: the masks' folder
    (default ``src/masks``)."""
    sides = tuple(sorted({int(s) for s in sizes}))
    _check_arguments(sides, repeats, hold_out, validation, max_megapixels)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise WorkbenchError(f"{out} is not empty; choose an empty folder")
    captions = Captions(template, class_word)
    where = f"image folder {src}"
    train, held = _split(read_small_folder(src, captions, masks=masks), hold_out, validation, captions, where)
    _check_sizes(train + held, sides, max_megapixels * 1e6, where)
    files, drawn = [], 0
    if prior is not None:
        prior = ClassPrompt(**{**asdict(prior), "prompt": captions.fill(prior.prompt), "size": max(sides)})
        cache = Path(class_cache) if class_cache is not None else out.parent / "class-images"
        files, drawn = cached_class_images(prior, cache, device=device, say=say)
    options = _Written(sides, max_megapixels * 1e6, alpha_mask,
                       masks=any(i.mask is not None for i in train) or alpha_mask)
    summary = DreamboothSummary(images=len(train), repeats=repeats, held_out=len(held), class_images=len(files),
                                class_drawn=drawn, class_folder=str(files[0].parent) if files else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    with whole_folder(out) as folder:
        writers = _open_writers(folder, options, image_format)
        summary.masked = _write_folder_images(writers, train, repeats, options, where)
        _write_class_images(writers, files, prior.prompt if prior else "", options)
        _close(writers)
        if held:
            held_writers = _open_writers(folder / "eval", options, image_format)
            _write_folder_images(held_writers, held, 1, options, f"validation images of {src}")
            _close(held_writers)
        summary.written = {side: len(train) * repeats + len(files) for side in sides}
        record = {**asdict(summary), "source": str(src), "captions": asdict(captions),
                  "prior": asdict(prior) if prior else None}
        write_text_whole(folder / RECORD, json.dumps(record, indent=1))
    return summary
