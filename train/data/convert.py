"""`dwb data convert SRC OUT`: turn captioned images into the workbench's MDS buckets.

Sources: an image folder with ``.txt``/``.json`` caption sidecars, Parquet files with encoded
image bytes (img2dataset, LAION-style), or a Hugging Face ``datasets`` dataset (saved to disk,
or a hub id). Every image goes to each bucket whose side fits its shorter side, stored with the
shorter side equal to the bucket side; training does the cropping. Bad records are counted and
skipped, never fatal.
"""
from __future__ import annotations

import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import ExifTags, Image, ImageOps
from streaming import MDSWriter
from tqdm import tqdm

from ..errors import WorkbenchError
from .mds import image_columns, open_writer

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp"}
IMAGE_COLUMNS = ("image", "jpg", "png", "img")
CAPTION_COLUMNS = ("caption", "text", "TEXT", "prompt")
AESTHETIC_COLUMNS = ("aesthetic", "aesthetic_score", "AESTHETIC_SCORE")
LANGUAGE_COLUMNS = ("language", "lang", "LANGUAGE")
HF_DISK_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
HUB_ID = re.compile(r"^[\w-][\w.-]*(/[\w.-]+)?$")  # "name" or "owner/name"; not ./x, ~/x, /x
SWAPPED_ORIENTATIONS = (5, 6, 7, 8)  # EXIF orientations that turn the image by 90 degrees
# Images with more pixels to decode are skipped and counted, not decoded: a 13000 x 13000 PNG (169 MP, a few
# MB on disk when flat) decoded in full took 1.9 GB. 64 MP admits the photos of today's cameras (61 MP
# full-frame, 48-50 MP phones); one of 64 MP takes 0.49 GB to convert. A JPEG counts at the size it decodes
# to after draft (1/2 to 1/8 per side), so larger JPEGs pass where the buckets need less.
DEFAULT_MAX_MEGAPIXELS = 64.0


@dataclass
class ConvertSummary:
    seen: int = 0
    written: dict[int, int] = field(default_factory=dict)  # bucket side -> images written
    corrupt: int = 0
    no_caption: int = 0
    empty_caption: int = 0
    too_small: int = 0
    too_large: int = 0  # more pixels to decode than max_megapixels
    filtered: int = 0

    @property
    def converted(self) -> int:  # images written to at least one bucket
        return (self.seen - self.corrupt - self.no_caption - self.empty_caption - self.too_small - self.too_large
                - self.filtered)

    def line(self) -> str:
        buckets = ", ".join(f"{side}px {n}" for side, n in sorted(self.written.items()))
        return (f"converted {self.converted} of {self.seen} images: {buckets}; skipped {self.corrupt} corrupt, "
                f"{self.no_caption} without caption, {self.empty_caption} empty caption, "
                f"{self.too_small} too small, {self.too_large} too large, {self.filtered} filtered")


@dataclass
class _Record:
    source: str | int  # file path or row, kept in meta to trace a sample back
    image: Any  # encoded bytes, a {"bytes", "path"} dict, or a file path
    caption: str | None  # None: the source has no caption for this image
    fields: dict[str, Any]  # the source's other json-serializable fields: filters read them, meta keeps them


@dataclass(frozen=True)
class _Filter:
    what: str  # "aesthetic" or "language", as in the --<what>-column option
    column: str | None
    candidates: tuple[str, ...]
    accept: Callable[[Any], bool]

    def find(self, names: Collection[str]) -> str | None:
        return next((c for c in ((self.column,) if self.column else self.candidates) if c in names), None)

    def keep(self, fields: dict[str, Any]) -> bool:
        name = self.find(fields)
        return name is None or self.accept(fields[name])  # a filter only applies where its column exists


def _at_least(threshold: float) -> Callable[[Any], bool]:
    def accept(value: Any) -> bool:
        try:
            return float(value) >= threshold  # NaN compares False: an unknown score is dropped
        except (TypeError, ValueError):
            return False
    return accept


def _pick(names: Sequence[str], given: str | None, candidates: Sequence[str], what: str, where: str) -> str:
    if given is not None and given in names:
        return given
    if given is None and (found := next((c for c in candidates if c in names), None)):
        return found
    wanted = repr(given) if given is not None else f"{what} column (looked for {', '.join(candidates)})"
    raise WorkbenchError(f"{where} has no {wanted}; its columns are {', '.join(names)}: "
                         f"name the {what} column with --{what}-column")


def _table_columns(names: Sequence[str], where: str, image_column: str | None, caption_column: str | None,
                   filters: Sequence[_Filter]) -> tuple[str, str]:
    """Resolve the image and caption columns; fail before any work when a requested filter has no column."""
    for f in filters:
        _pick(names, f.column, f.candidates, f.what, where)
    return (_pick(names, image_column, IMAGE_COLUMNS, "image", where),
            _pick(names, caption_column, CAPTION_COLUMNS, "caption", where))


def _table_record(row: dict[str, Any], image_column: str, caption_column: str, source: str | int) -> _Record:
    image, caption = row.pop(image_column), row.pop(caption_column)
    fields = {k: v for k, v in row.items() if v is None or isinstance(v, (str, int, float, bool))}
    return _Record(source, image, "" if caption is None else str(caption), fields)


def _read_sidecars(image: Path) -> tuple[str | None, dict[str, Any]]:
    """Caption from ``<stem>.txt`` (preferred) or ``<stem>.json``; the json's other keys become fields."""
    caption, fields = None, {}
    try:
        if (sidecar := image.with_suffix(".json")).is_file():
            data = json.loads(sidecar.read_text(encoding="utf-8"))
            if isinstance(data, dict):
                fields = {k: v for k, v in data.items() if k not in ("caption", "text")}
                caption = data.get("caption", data.get("text"))
        if (sidecar := image.with_suffix(".txt")).is_file():
            caption = sidecar.read_text(encoding="utf-8")
    except (OSError, ValueError):  # an unreadable sidecar means no caption, like a missing one
        return None, {}
    return (None if caption is None else str(caption)), fields


def _folder_source(root: Path, filters: Sequence[_Filter]) -> tuple[Iterable[_Record], int]:
    if filters and next(root.rglob("*.json"), None) is None:
        raise WorkbenchError(f"{root} is an image folder without .json sidecars, so it has no "
                             f"{' or '.join(f.what for f in filters)} values to filter on")
    images = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    records = (_Record(p.relative_to(root).as_posix(), p, *_read_sidecars(p)) for p in images)
    return records, len(images)


def _parquet_source(src: Path, image_column: str | None, caption_column: str | None,
                    filters: Sequence[_Filter]) -> tuple[Iterable[_Record], int]:
    files = [src] if src.is_file() else sorted(src.rglob("*.parquet"))
    plans = []  # every file's schema is checked before converting anything
    for path in files:
        try:
            parquet = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as e:
            raise WorkbenchError(f"{path} is not a readable Parquet file ({e})") from e
        name = path.relative_to(src).as_posix() if src.is_dir() else path.name
        cols = _table_columns(parquet.schema_arrow.names, str(path), image_column, caption_column, filters)
        plans.append((name, parquet, cols))

    def records() -> Iterator[_Record]:
        for name, parquet, (image_col, caption_col) in plans:
            row_index = 0
            for batch in parquet.iter_batches(batch_size=256):  # bounded memory on large shards
                for row in batch.to_pylist():
                    yield _table_record(row, image_col, caption_col, f"{name}:{row_index}")
                    row_index += 1

    return records(), sum(p.metadata.num_rows for _, p, _ in plans)


def _hf_source(src: str, on_disk: bool, split: str, image_column: str | None, caption_column: str | None,
               filters: Sequence[_Filter]) -> tuple[Iterable[_Record], int]:
    """A datasets dataset saved with ``save_to_disk`` (``on_disk``) or else a hub id."""
    import datasets  # slow to import; only this source needs it

    try:
        ds = datasets.load_from_disk(src) if on_disk else datasets.load_dataset(src, split=split)
    except Exception as e:  # a broken folder, or offline / unknown repo / gated / bad split: many types
        problem = ("cannot be loaded by datasets" if on_disk
                   else "does not exist locally and the Hugging Face hub could not provide it")
        raise WorkbenchError(f"{src} {problem} ({(str(e).strip().splitlines() or [type(e).__name__])[0]})") from e
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise WorkbenchError(f"{src} has no split {split!r}; its splits are {', '.join(ds)}")
        ds = ds[split]
    image_col, caption_col = _table_columns(ds.column_names, src, image_column, caption_column, filters)
    if isinstance(ds.features[image_col], datasets.Image):
        # Take the encoded bytes and decode here: once, with JPEG draft, and a corrupt image is
        # skipped instead of raising in the middle of the dataset's iteration.
        ds = ds.cast_column(image_col, datasets.Image(decode=False))
    return (_table_record(row, image_col, caption_col, i) for i, row in enumerate(ds)), len(ds)


def _source(src: str | Path, split: str, image_column: str | None, caption_column: str | None,
            filters: Sequence[_Filter]) -> tuple[Iterable[_Record], int]:
    """The records of SRC and how many there are, after checking the columns they need."""
    path = Path(src).expanduser()
    if path.is_dir() and any((path / marker).is_file() for marker in HF_DISK_MARKERS):
        return _hf_source(str(path), True, split, image_column, caption_column, filters)
    if (path.is_file() and path.suffix == ".parquet") or (path.is_dir() and next(path.rglob("*.parquet"), None)):
        return _parquet_source(path, image_column, caption_column, filters)
    if path.is_dir():
        return _folder_source(path, filters)
    if path.exists():
        raise WorkbenchError(f"{path} is not an image folder, a Parquet file or a saved datasets dataset")
    if not HUB_ID.match(str(src)):
        raise WorkbenchError(f"{src} does not exist")
    return _hf_source(str(src), False, split, image_column, caption_column, filters)


def _open(value: Any) -> Image.Image:
    """Open lazily (header only) from encoded bytes, a {"bytes", "path"} dict or a file path."""
    if isinstance(value, dict):
        value = value.get("bytes") or value.get("path")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Image.open(io.BytesIO(value))
    if isinstance(value, (str, Path)):
        return Image.open(value)
    raise ValueError(f"no image data ({type(value).__name__})")


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info:
        rgba = img.convert("RGBA")  # transparent pixels become white, not whatever colour they hide
        rgb = Image.new("RGB", rgba.size, (255, 255, 255))
        rgb.paste(rgba, mask=rgba.getchannel("A"))
        return rgb
    return img.convert("RGB")


class TooLarge(Exception):
    """An image with more pixels to decode than the limit: skipped and counted, never decoded."""


def _load(value: Any, sides: Sequence[int], max_pixels: float) -> tuple[Image.Image | None, tuple[int, int]]:
    """Decode to upright RGB at no more resolution than the buckets need, and the original (w, h).

    The image is None when it is smaller than every bucket (then nothing is decoded); raises TooLarge, before
    decoding, when it has more than ``max_pixels`` to decode, and anything else on bad data. JPEG may skip
    detail the largest fitting bucket does not need, via DCT scaling (draft), and is counted at that size.
    """
    try:
        img = _open(value)  # the header only
    except Image.DecompressionBombError:  # PIL's own limit (twice Image.MAX_IMAGE_PIXELS), checked on opening
        raise TooLarge from None
    with img:
        size = img.size
        fits = [s for s in sides if s <= min(size)]
        if not fits:
            return None, size
        scale = 2 * max(fits) / min(img.size)  # 2x headroom, as Image.thumbnail, so Lanczos still antialiases
        img.draft(None, (math.ceil(img.width * scale), math.ceil(img.height * scale)))
        if img.width * img.height > max_pixels:  # before getexif, which decodes a PNG to find its eXIf chunk
            raise TooLarge
        if img.getexif().get(ExifTags.Base.Orientation) in SWAPPED_ORIENTATIONS:
            size = size[::-1]
        img.load()
        ImageOps.exif_transpose(img, in_place=True)  # a copy fewer: a 64 MP PNG took 0.73 GB, in place 0.49 GB
        return _to_rgb(img), size  # an image apart from the file closed here


def _fit(img: Image.Image, side: int, original_size: tuple[int, int]) -> Image.Image:
    """Downscale so the shorter side is ``side``, keeping the original aspect ratio; no crop."""
    w, h = original_size  # not img.size: draft and earlier buckets rounded it
    size = (side, max(side, round(h * side / w))) if w <= h else (max(side, round(w * side / h)), side)
    return img if img.size == size else img.resize(size, Image.Resampling.LANCZOS)


def _open_writers(out: Path, sides: Sequence[int], image_format: str) -> dict[int, MDSWriter]:
    writers = {}
    for side in sides:
        try:
            writers[side] = open_writer(out / str(side), image_format)
        except FileExistsError as e:  # leftovers of an interrupted run (no index.json yet)
            raise WorkbenchError(f"{out / str(side)} is not empty; choose an empty output folder") from e
    return writers


def convert_to_mds(src: str | Path, out: str | Path, *, buckets: Sequence[int] = (256, 512), image_format: str = "jpeg",
            image_column: str | None = None, caption_column: str | None = None,
            min_aesthetic: float | None = None, aesthetic_column: str | None = None,
            languages: Sequence[str] | None = None, language_column: str | None = None,
            split: str = "train", limit: int | None = None, max_megapixels: float = DEFAULT_MAX_MEGAPIXELS,
            progress: bool = True) -> ConvertSummary:
    """Convert SRC into one MDS folder per bucket, ``OUT/<side>``; ``limit`` caps the images converted, and
    images with more than ``max_megapixels`` to decode are skipped and counted (``DEFAULT_MAX_MEGAPIXELS``)."""
    sides = sorted({int(b) for b in buckets})
    if not sides or sides[0] <= 0:
        raise WorkbenchError(f"buckets must be positive sides in pixels, got {list(buckets)}")
    if limit is not None and limit < 1:
        raise WorkbenchError(f"limit must be at least 1, got {limit}")
    if not max_megapixels > 0:
        raise WorkbenchError(f"max_megapixels must be positive, got {max_megapixels}")
    image_columns(image_format)  # validates the format before any work
    filters = []
    if min_aesthetic is not None:
        filters.append(_Filter("aesthetic", aesthetic_column, AESTHETIC_COLUMNS, _at_least(min_aesthetic)))
    if languages is not None:
        wanted = {lang.lower() for lang in languages}
        filters.append(_Filter("language", language_column, LANGUAGE_COLUMNS,
                               lambda v: v is not None and str(v).lower() in wanted))
    records, total = _source(src, split, image_column, caption_column, filters)

    writers = _open_writers(Path(out), sides, image_format)
    summary = ConvertSummary(written={side: 0 for side in sides})
    for record in tqdm(records, total=total, disable=not progress, unit="img", desc="convert"):
        summary.seen += 1
        if record.caption is None:
            summary.no_caption += 1
            continue
        caption = record.caption.strip()
        if not caption:
            summary.empty_caption += 1
            continue
        if not all(f.keep(record.fields) for f in filters):  # before decoding: filtered rows cost nothing
            summary.filtered += 1
            continue
        try:
            img, original_size = _load(record.image, sides, max_megapixels * 1e6)
        except TooLarge:
            summary.too_large += 1
            continue
        except Exception:  # PIL raises OSError, SyntaxError, ValueError, ... on bad data; one file must not stop a run
            summary.corrupt += 1
            continue
        if img is None:
            summary.too_small += 1
            continue
        meta = {**record.fields, "source": record.source, "original_size": list(original_size)}
        # Largest bucket first, so each resize starts from the previous, smaller image.
        for side in reversed([s for s in sides if s <= min(original_size)]):
            img = _fit(img, side, original_size)
            writers[side].write({"image": img, "caption": caption, "meta": meta})
            summary.written[side] += 1
        if limit is not None and summary.converted >= limit:
            break
    # Finished only on success: an interrupted run leaves no index.json that would pass for a complete dataset.
    for writer in writers.values():
        writer.finish()
    if summary.converted == 0:
        raise WorkbenchError(f"no usable images in {src} ({summary.line()})")
    return summary
