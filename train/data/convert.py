"""`dwb data convert SRC... OUT`: turn captioned images into the workbench's MDS buckets, on every core,
resumable, and in parts on many machines.

Sources (``layouts``): WebDataset tars and every layout img2dataset writes (``webdataset``, ``parquet``,
``files``), Parquet files with image bytes, image folders with ``.txt``/``.json`` sidecars, and Hugging Face
``datasets`` datasets (saved to disk, or a hub id); local or ``s3://``, with brace patterns. Every image goes
to each bucket whose side fits its shorter side, stored with the shorter side equal to the bucket side;
training does the cropping. Bad records are counted and skipped, never fatal.

Work is split into units (a shard, a Parquet file, a folder's images, rows of a dataset), converted by a
pool of worker processes. Unit ``k`` writes its own MDS folder per bucket, ``OUT/<side>/<k>/``, then its
summary to ``OUT/.convert/done/<k>.json``; a unit without that file is converted again from scratch, so a
run killed at any point and repeated with the same command finishes the job with the same samples. Once
every unit is done, Streaming's ``merge_index`` joins the units' indexes into ``OUT/<side>/index.json`` in
unit order, so the dataset's sample order is the sources' order whatever the number of workers or parts.
With aspect-ratio buckets unit ``k`` writes ``OUT/<side>/<WxH>/<k>/`` per bucket it fills; the merge joins them
into ``OUT/<side>/<WxH>/index.json`` per bucket (a dataset, and a Streaming stream, of its own: training draws
each batch from one bucket) and those into ``OUT/<side>/index.json``, the whole budget as one dataset.
``--part i/N`` converts every N-th unit from the i-th; ``join_parts`` merges once all parts are done.

What a run finds in OUT was written by another process (a killed run, a part on another machine) and is
checked before use: ``plan.json`` and the done files are read as JSON from outside and must have their shape;
each unit's MDS index must name only shards inside its folder (``mds.checked_index``) before ``merge_index``
joins it; and the plan records each unit's source ``state``, so a run resumed after a source changed is
refused, naming the unit, instead of mixing old and new samples.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import multiprocessing
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from PIL import ExifTags, Image, ImageOps
from tqdm import tqdm

from models.common import load_outside, loads_outside, write_text_whole
from models.errors import WorkbenchError
from models.generation import (DEFAULT_MAX_ASPECT, assign, bucket_name, bucket_set, check_bucket_count, cover,
                               cover_scale)

from .image_folders import folder_records
from .layouts import Columns, plan_units
from models.datasets import checked_index, image_columns, open_writer
from .records import Filter, ReadCounts, Record
from .tables import DEFAULT_MAX_ROW_GROUP_BYTES, hf_records, parquet_records
from .tar_shards import tar_records

AESTHETIC_COLUMNS = ("aesthetic", "aesthetic_score", "AESTHETIC_SCORE")
LANGUAGE_COLUMNS = ("language", "lang", "LANGUAGE")
PUNSAFE_COLUMNS = ("punsafe", "PUNSAFE")  # LAION's probability that an image is unsafe
WATERMARK_COLUMNS = ("pwatermark", "PWATERMARK")  # LAION's probability that an image has a watermark
SWAPPED_ORIENTATIONS = (5, 6, 7, 8)  # EXIF orientations that turn the image by 90 degrees
# Images with more pixels to decode are skipped and counted, not decoded: a 13000 x 13000 PNG (169 MP, a few
# MB on disk when flat) decoded in full took 1.9 GB. 64 MP admits the photos of today's cameras (61 MP
# full-frame, 48-50 MP phones); one of 64 MP takes 0.49 GB to convert. A JPEG counts at the size it decodes
# to after draft (1/2 to 1/8 per side), so larger JPEGs pass where the buckets need less.
DEFAULT_MAX_MEGAPIXELS = 64.0
STATE = ".convert"  # OUT/.convert: plan.json, done/<unit>.json, summary.json
PLAN_VERSION = 2  # 2: each unit's source state
BUCKET_PLAN_VERSION = 3  # an aspect-ratio conversion's: 3 writes a folder per bucket (OUT/<side>/<WxH>/<unit>)
PLAN_BYTES = 2**30  # plan.json lists every unit, about 250 bytes each: a million shards' plan is 250 MB
WORKER_IMPORTS = [__name__, "streaming.base.format.mds.writer"]  # imported once by the workers' fork server
BUCKET_KEY = re.compile(r"^[0-9]{1,6}/[0-9]{1,6}x[0-9]{1,6}$")  # ConvertSummary.buckets: "512/640x384"


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
    no_image: int = 0  # samples without an image: img2dataset's failed downloads, a tar sample's image refused
    refused: int = 0  # files not read: links, devices, names or paths leading out, oversize files (not samples)
    truncated: int = 0  # tar shards cut short or unreadable (not samples)
    bad_json: int = 0  # .json sidecars too large, too deep or broken (their samples keep the .txt caption)
    tars_stopped: int = 0  # tar shards stopped at a header over its limit or a gzip bomb (not samples)
    row_groups: int = 0  # Parquet row groups over max_row_group_bytes, never read (not samples)
    units_kept: int = field(default=0, compare=False)  # units an earlier, interrupted run had finished
    # With aspect-ratio buckets: images per bucket ("512/640x384"), and the pixels of the resized images and of
    # what their crops cut off, to report the share cropped.
    buckets: dict[str, int] = field(default_factory=dict)
    resized_pixels: int = 0
    cropped_pixels: int = 0

    @property
    def converted(self) -> int:  # images written to at least one bucket
        return (self.seen - self.corrupt - self.no_caption - self.empty_caption - self.too_small - self.too_large
                - self.filtered - self.no_image)

    def line(self) -> str:
        buckets = ", ".join(f"{side}px {n}" for side, n in sorted(self.written.items()))
        extra = "".join(f", {n} {what}" for n, what in ((self.no_image, "without image"),) if n)
        shards = "; ".join(f"{n} {what}" for n, what in (
            (self.truncated, "tar shards cut short or unreadable"), (self.refused, "files refused"),
            (self.bad_json, ".json sidecars refused (too large, too deep or not JSON)"),
            (self.tars_stopped, "tar shards stopped (a header over 1 MiB, or gzip expanding over 100x)"),
            (self.row_groups, "Parquet row groups over the size limit (--max-row-group-mib)")) if n)
        return (f"converted {self.converted} of {self.seen} images: {buckets}; skipped {self.corrupt} corrupt, "
                f"{self.no_caption} without caption, {self.empty_caption} empty caption, "
                f"{self.too_small} too small, {self.too_large} too large, {self.filtered} filtered{extra}"
                + (f"; {shards}" if shards else "") + self.bucket_report())

    def bucket_report(self) -> str:
        """Images per aspect-ratio bucket, by budget, and the share of the resized images' area cropped off."""
        if not self.buckets:
            return ""
        by_side: dict[int, list[tuple[float, str]]] = {}
        for key, n in self.buckets.items():
            side, name = key.split("/")
            w, h = map(int, name.split("x"))
            by_side.setdefault(int(side), []).append((w / h, f"{name} {n}"))
        sides = "; ".join(f"{side}px " + ", ".join(t for _, t in sorted(v)) for side, v in sorted(by_side.items()))
        share = 100 * self.cropped_pixels / max(1, self.resized_pixels)
        return f"; aspect buckets: {sides}; cropped {share:.1f}% of the resized images' area"

    def count_bucket(self, side: int, bucket: tuple[int, int], resized: tuple[int, int]) -> None:
        key = f"{side}/{bucket_name(bucket)}"
        self.buckets[key] = self.buckets.get(key, 0) + 1
        self.resized_pixels += resized[0] * resized[1]
        self.cropped_pixels += resized[0] * resized[1] - bucket[0] * bucket[1]

    def add(self, other: "ConvertSummary") -> None:
        for f in fields(self):
            if f.name in ("written", "buckets"):
                mine = getattr(self, f.name)
                for key, n in getattr(other, f.name).items():
                    mine[key] = mine.get(key, 0) + n
            elif f.name != "units_kept":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "written": {str(k): v for k, v in self.written.items()}})

    @classmethod
    def from_json(cls, text: str | bytes, what: str) -> "ConvertSummary":
        """A summary ``to_json`` wrote; a file of any other shape is a one-line error starting with ``what``."""
        data = loads_outside(text, what)
        counts = {f.name for f in fields(cls)} - {"written", "units_kept", "buckets"}
        if not (isinstance(data, dict) and isinstance(data.get("written"), dict)
                and isinstance(data.get("buckets", {}), dict)
                and set(data) <= counts | {"written", "units_kept", "buckets"}):
            raise WorkbenchError(f"{what}: not a unit's summary (a dict of counts with 'written')")
        buckets = data.get("buckets", {})
        values = [v for k, v in data.items() if k in counts] + list(data["written"].values()) + list(buckets.values())
        if not (all(type(v) is int and v >= 0 for v in values) and all(k.isdigit() for k in data["written"])
                and all(BUCKET_KEY.match(k) for k in buckets)):
            raise WorkbenchError(f"{what}: not a unit's summary (counts must be whole numbers, buckets sides)")
        return cls(**{k: v for k, v in data.items() if k in counts},
                   written={int(k): v for k, v in data["written"].items()}, buckets=dict(buckets))


@dataclass(frozen=True)
class _Options:
    """What every unit is converted with; part of the plan, so a rerun with other options is refused."""
    sides: tuple[int, ...]
    image_format: str
    filters: tuple[Filter, ...]
    max_pixels: float
    limit: int | None
    max_row_group_bytes: int = DEFAULT_MAX_ROW_GROUP_BYTES
    aspect: tuple[tuple[int, tuple[tuple[int, int], ...]], ...] | None = None  # (side, its buckets) per side

    def plan(self) -> dict:
        """As the plan records them; a square conversion's as before aspect-ratio buckets existed."""
        return {k: v for k, v in asdict(self).items() if not (k == "aspect" and v is None)}


def _open(value: Any) -> Image.Image:
    """Open lazily (header only) from encoded bytes or a local file a reader admitted (a ``Path``); a path in
    the data itself (a string) is never opened."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Image.open(io.BytesIO(value))
    if isinstance(value, Path):
        return Image.open(value)
    raise ValueError(f"no image data ({type(value).__name__})")


def rgb_on_white(img: Image.Image) -> Image.Image:
    """An image in RGB, its transparent pixels white (DreamBooth folders read it too)."""
    if img.mode in ("RGBA", "LA", "PA") or "transparency" in img.info:
        rgba = img.convert("RGBA")  # transparent pixels become white, not whatever colour they hide
        rgb = Image.new("RGB", rgba.size, (255, 255, 255))
        rgb.paste(rgba, mask=rgba.getchannel("A"))
        return rgb
    return img.convert("RGB")


class TooLarge(Exception):
    """An image with more pixels to decode than the limit: skipped and counted, never decoded."""


def _square_scale(sides: Sequence[int], size: tuple[int, int]) -> float | None:
    """The scale the largest square bucket whose side fits the shorter side needs; None when none fits."""
    fits = [s for s in sides if s <= min(size)]
    return max(fits) / min(size) if fits else None


def _aspect_scale(aspect: Sequence[tuple[int, Sequence[tuple[int, int]]]], size: tuple[int, int]) -> float | None:
    """The largest scale an aspect-ratio bucket the image covers needs; None when it covers none. The bucket
    sets are symmetric, so the scale is the same before and after an EXIF turn by 90 degrees."""
    scales = [cover_scale(size, b) for _, buckets in aspect if (b := assign(size, buckets))]
    return max(scales) if scales else None


def _scale_needed(options: "_Options") -> Callable[[tuple[int, int]], float | None]:
    return partial(_aspect_scale, options.aspect) if options.aspect else partial(_square_scale, options.sides)


def _load(value: Any, scale_needed: Callable[[tuple[int, int]], float | None],
          max_pixels: float) -> tuple[Image.Image | None, tuple[int, int]]:
    """Decode to upright RGB at no more resolution than the buckets need, and the original (w, h).

    The image is None when it fits no bucket (``scale_needed`` gives None; then nothing is decoded); raises
    TooLarge, before decoding, when it has more than ``max_pixels`` to decode, and anything else on bad data.
    JPEG may skip detail the largest fitting bucket does not need, via DCT scaling (draft), and is counted at
    that size.
    """
    try:
        img = _open(value)  # the header only
    except Image.DecompressionBombError:  # PIL's own limit (twice Image.MAX_IMAGE_PIXELS), checked on opening
        raise TooLarge from None
    with img:
        size = img.size
        needed = scale_needed(size)
        if needed is None:
            return None, size
        scale = 2 * needed  # 2x headroom, as Image.thumbnail, so Lanczos still antialiases
        img.draft(None, (math.ceil(img.width * scale), math.ceil(img.height * scale)))
        if img.width * img.height > max_pixels:  # before getexif, which decodes a PNG to find its eXIf chunk
            raise TooLarge
        if img.getexif().get(ExifTags.Base.Orientation) in SWAPPED_ORIENTATIONS:
            size = size[::-1]
        img.load()
        ImageOps.exif_transpose(img, in_place=True)  # a copy fewer: a 64 MP PNG took 0.73 GB, in place 0.49 GB
        return rgb_on_white(img), size  # an image apart from the file closed here


def _fit(img: Image.Image, side: int, original_size: tuple[int, int]) -> Image.Image:
    """Downscale so the shorter side is ``side``, keeping the original aspect ratio; no crop."""
    w, h = original_size  # not img.size: draft and earlier buckets rounded it
    size = (side, max(side, round(h * side / w))) if w <= h else (max(side, round(w * side / h)), side)
    return img if img.size == size else img.resize(size, Image.Resampling.LANCZOS)


def _records(unit: dict, counts: ReadCounts, options: _Options) -> Iterator[Record]:
    kind = unit["kind"]
    if kind == "tar":
        return tar_records(unit["url"], unit["name"], counts)
    if kind == "parquet":
        return parquet_records(unit["url"], unit["name"], unit["image_column"], unit["caption_column"], counts,
                               options.max_row_group_bytes)
    if kind == "images":
        return folder_records(unit, counts)
    if kind == "refused":  # a link or device where a source file would be (layouts)
        counts.refused += 1
        return iter(())
    return hf_records(unit, counts)


def _skip_reason(record: Record, options: _Options) -> str | None:
    """Why a record is skipped before decoding (a ``ConvertSummary`` field), or None."""
    if record.image is None:
        return "no_image"
    if record.caption is None:
        return "no_caption"
    if not record.caption.strip():
        return "empty_caption"
    if not all(f.keep(record.fields) for f in options.filters):  # before decoding: filtered rows cost nothing
        return "filtered"
    return None


def _convert_record(record: Record, writers: dict, options: _Options, summary: ConvertSummary) -> None:
    summary.seen += 1
    if reason := _skip_reason(record, options):
        setattr(summary, reason, getattr(summary, reason) + 1)
        return
    try:
        img, original_size = _load(record.image, _scale_needed(options), options.max_pixels)
    except TooLarge:
        summary.too_large += 1
        return
    except Exception:  # PIL raises OSError, SyntaxError, ValueError, ... on bad data; one file must not stop a run
        summary.corrupt += 1
        return
    if img is None:
        summary.too_small += 1
        return
    caption = record.caption.strip()
    meta = {**record.fields, "source": record.source, "original_size": list(original_size)}
    if options.aspect:
        _write_aspect(img, original_size, {"caption": caption, "meta": meta}, writers, options, summary)
        return
    # Largest bucket first, so each resize starts from the previous, smaller image.
    for side in reversed([s for s in options.sides if s <= min(original_size)]):
        img = _fit(img, side, original_size)
        writers[side].write({"image": img, "caption": caption, "meta": meta})
        summary.written[side] += 1


def _write_aspect(img: Image.Image, original_size: tuple[int, int], sample: dict, writers: "BucketWriters",
                  options: _Options, summary: ConvertSummary) -> None:
    """Into each budget's nearest aspect-ratio bucket the image covers: resized from the decoded image (not
    from a larger budget's crop) to cover the bucket, then centre-cropped to it."""
    for side, buckets in reversed(options.aspect):
        bucket = assign(original_size, buckets)
        if bucket is None:
            continue
        resized, (left, top) = cover(original_size, bucket)
        scaled = img if img.size == resized else img.resize(resized, Image.Resampling.LANCZOS)
        writers.of(side, bucket).write({**sample, "image": scaled.crop((left, top, left + bucket[0], top + bucket[1])),
                             "original_width": original_size[0], "original_height": original_size[1],
                             "crop_top": top, "crop_left": left, "bucket_width": bucket[0], "bucket_height": bucket[1]})
        summary.written[side] += 1
        summary.count_bucket(side, bucket, resized)


def _done_file(out: Path, name: str) -> Path:
    return out / STATE / "done" / f"{name}.json"


class BucketWriters:
    """A unit's writers of aspect-ratio buckets, ``OUT/<side>/<WxH>/<name>/``, each opened with its first image:
    a unit of 100 images fills a few of a budget's 5 to 13 buckets, and the done file's ``buckets`` says which."""

    def __init__(self, out: Path, name: str, options: _Options):
        self.out, self.name, self.image_format = out, name, options.image_format
        self.writers: dict[tuple[int, tuple[int, int]], Any] = {}
        for side, buckets in options.aspect:
            for bucket in buckets:  # what a killed run left of this unit
                shutil.rmtree(self.out / str(side) / bucket_name(bucket) / name, ignore_errors=True)

    def of(self, side: int, bucket: tuple[int, int]):
        if (side, bucket) not in self.writers:
            self.writers[side, bucket] = open_writer(self.out / str(side) / bucket_name(bucket) / self.name,
                                                     self.image_format, aspect=True)
        return self.writers[side, bucket]

    def values(self):
        return self.writers.values()


def _open_writers(out: Path, name: str, options: _Options):
    if options.aspect:
        return BucketWriters(out, name, options)
    writers = {}
    for side in options.sides:
        shutil.rmtree(out / str(side) / name, ignore_errors=True)  # what a killed run left of this unit
        writers[side] = open_writer(out / str(side) / name, options.image_format)
    return writers


def _convert_unit(task: tuple[str, str, dict, _Options, int | None]) -> tuple[str, ConvertSummary]:
    """Convert one unit into ``OUT/<side>/<name>/`` (with aspect-ratio buckets ``OUT/<side>/<WxH>/<name>/``) from
    scratch, then record it as done. ``budget``: the most images to convert (``limit``)."""
    out, name, unit, options, budget = task
    out = Path(out)
    summary, counts = ConvertSummary(written={side: 0 for side in options.sides}), ReadCounts()
    writers = _open_writers(out, name, options)
    for record in _records(unit, counts, options):
        _convert_record(record, writers, options, summary)
        if budget is not None and summary.converted >= budget:
            break
    for writer in writers.values():  # each writes its index.json last
        writer.finish()
    for count, value in asdict(counts).items():
        setattr(summary, count, value)
    write_text_whole(_done_file(out, name), summary.to_json())
    return name, summary


def _start_worker(pid: int, environment: dict[str, str]) -> None:
    """A worker takes the converting process's environment as it is now (its S3 endpoint and credentials), not
    the fork server's from when that started, and ends with that process."""
    os.environ.clear()
    os.environ.update(environment)
    _die_with(pid)


def _die_with(pid: int) -> None:
    """A worker's watch on the converting process ``pid``: it ends the worker when that process ends. SIGKILL
    leaves the pool no time to stop its workers, and a worker waiting for its next unit would wait forever (it
    holds its own end of the task queue), keeping the fork server alive with it; a repeated command must never
    meet a worker of the earlier run still writing a unit it converts again."""
    import select
    import threading

    def watch() -> None:
        try:
            with contextlib.closing(os.pidfd_open(pid)) as fd:  # readable once the process has ended
                select.select([fd], [], [])
        except (AttributeError, OSError):  # no pidfd (Linux < 5.3): look every second
            while os.path.exists(f"/proc/{pid}"):
                time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-converter", daemon=True).start()


def _worker_pool(size: int):
    """A pool of ``size`` workers forked from this process's fork server (started on first use, with
    ``WORKER_IMPORTS`` imported), each started by ``_start_worker``."""
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(WORKER_IMPORTS)  # no effect once this process's fork server has started
    return ProcessPoolExecutor(size, mp_context=context, initializer=_start_worker,
                               initargs=(os.getpid(), dict(os.environ)))


def _run(tasks: list, workers: int) -> Iterator[tuple[str, ConvertSummary]]:
    """Each task's summary as it finishes: in this process for one worker or one task, else in a pool of worker
    processes forked from a fork server (``WORKER_IMPORTS`` imported once there). Not forked from this process:
    a process that has started threads (pyarrow's, OpenMP's, a test runner's) can leave a forked child dead or
    deadlocked, and a pool then waits for the lost unit forever (seen: a conversion hung for 14 minutes under
    the test runner). Not spawned: each spawned worker imported Streaming itself, which imports torch and
    transformers, 6-10 s of CPU and 0.5 GB per worker (measured: 2 workers spent 3.3x the CPU of one on 400
    images). A worker that dies is one line here; the same command goes on from the units already written."""
    if workers == 1 or len(tasks) <= 1:
        yield from map(_convert_unit, tasks)
        return
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    with _worker_pool(min(workers, len(tasks))) as pool:
        futures = [pool.submit(_convert_unit, task) for task in tasks]
        try:
            for done in as_completed(futures):
                yield done.result()
        except BrokenProcessPool:
            raise WorkbenchError("a conversion worker died (killed, or out of memory); run the same command again "
                                 "to go on from the units already written") from None
        finally:
            for future in futures:
                future.cancel()


def _unit_names(count: int) -> list[str]:
    width = max(5, len(str(count - 1)))
    return [f"{k:0{width}d}" for k in range(count)]


def _read_plan(out: Path) -> dict | None:
    path = out / STATE / "plan.json"
    if not path.is_file():
        return None
    plan = load_outside(path, str(path), max_bytes=PLAN_BYTES)
    options = plan.get("options") if isinstance(plan, dict) else None
    sides = options.get("sides") if isinstance(options, dict) else None
    units = plan.get("units") if isinstance(plan, dict) else None
    if not (isinstance(units, list) and all(isinstance(u, dict) for u in units) and isinstance(sides, list)
            and sides and all(type(side) is int and side > 0 for side in sides)):
        raise WorkbenchError(f"{path}: not a conversion's plan (a dict of 'units' and 'options' with 'sides')")
    return plan


def _without_states(plan: dict) -> dict:
    return {**plan, "units": [{k: v for k, v in u.items() if k != "state"} for u in plan["units"]]}


def _check_same_plan(out: Path, found: dict, plan: dict) -> None:
    """Refuse to go on with a conversion in OUT that is not this one: another version's, other sources or
    options, or these sources changed since it began (resumed, it would mix old samples with new)."""
    known = (PLAN_VERSION, BUCKET_PLAN_VERSION)  # a square and an aspect-ratio conversion of this version
    if found.get("version") != plan["version"] and (found.get("version") not in known
                                                    or found.get("options") == plan["options"]):
        raise WorkbenchError(f"{out} holds a conversion begun by another version of dwb (plan version "
                             f"{found.get('version')!r}); finish it with that version, or choose an empty folder")
    if _without_states(found) != _without_states(plan):
        raise WorkbenchError(f"{out} holds a conversion of other sources or options; repeat that conversion's "
                             f"command to finish it, or choose an empty folder")
    names = _unit_names(len(plan["units"]))
    for name, was, unit in zip(names, found["units"], plan["units"]):
        if was.get("state") != unit["state"]:
            source = unit.get("url") or unit.get("src") or f"{unit['root']}/{unit['dir']}"
            raise WorkbenchError(f"{out}: the source of unit {name} ({source}) changed since this conversion began "
                                 f"(its files' sizes or times differ); convert into a fresh OUT, or delete {out} "
                                 f"and run the command again")


def _claim(out: Path, plan: dict) -> None:
    """Start a conversion in OUT, or go on with the one there when its plan is this one."""
    found = _read_plan(out)
    if found is not None:
        if found != plan:
            _check_same_plan(out, found, plan)
        return
    if out.is_dir() and any(p.name != STATE for p in out.iterdir()):
        held = any((p / "index.json").is_file() for p in out.iterdir())
        raise WorkbenchError(f"{out} {'already holds an MDS dataset' if held else 'is not empty'}; "
                             f"choose an empty folder")
    (out / STATE / "done").mkdir(parents=True, exist_ok=True)
    write_text_whole(out / STATE / "plan.json", json.dumps(plan))


def _done_summaries(out: Path, names: Sequence[str]) -> dict[str, ConvertSummary]:
    return {n: ConvertSummary.from_json(f.read_bytes(), str(f)) for n in names if (f := _done_file(out, n)).is_file()}


def _unit_folders(out: Path, sides: Sequence[int], done: dict[str, ConvertSummary],
                  aspect: bool) -> dict[int, dict[str, list[Path]]]:
    """The folders the done units wrote, per side and per bucket ("" for a square conversion's one), in unit
    order; a unit wrote a bucket's folder only where its summary counts images in that bucket."""
    folders: dict[int, dict[str, list[Path]]] = {side: {} for side in sides}
    for name, summary in done.items():
        if not aspect:
            for side in sides:
                folders[side].setdefault("", []).append(out / str(side) / name)
            continue
        for key, n in summary.buckets.items():
            side, bucket = key.split("/")
            if n and int(side) in folders:
                folders[int(side)].setdefault(bucket, []).append(out / side / bucket / name)
    return folders


def _check_unit_indexes(folders: dict[int, dict[str, list[Path]]]) -> None:
    """Each unit's index, as ``merge_index`` will join it: only shards inside the unit's folder, present and
    of the size it says (a part from elsewhere naming ``../../x/shard`` would be merged as is)."""
    for buckets in folders.values():
        for units in buckets.values():
            for folder in units:
                checked_index(folder)


@contextlib.contextmanager
def _quiet_streaming_logs():
    """merge_index logs a warning for its temporary folder on every call."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _merge_into(folder: Path, parts: Sequence[Path]) -> None:
    """``folder/index.json`` over the indexes of its subfolders ``parts``, in their order: Streaming's own merge,
    which prefixes each shard's name with its subfolder's (``k/shard.00000.mds``, then ``640x384/k/...``)."""
    from streaming.base.util import merge_index

    (folder / "index.json").unlink(missing_ok=True)  # a merge a killed run began: done again
    if not parts:  # merge_index writes nothing for no parts; an empty budget stays a dataset of no samples
        write_text_whole(folder / "index.json", json.dumps({"version": 2, "shards": []}))
        return
    with _quiet_streaming_logs():
        merge_index([str(part / "index.json") for part in parts], str(folder))


def _merge(out: Path, folders: dict[int, dict[str, list[Path]]], buckets_in_order: dict[int, list[str]]) -> None:
    """Join the units' indexes, in unit order: per side into ``OUT/<side>/index.json``; with aspect-ratio buckets
    first per bucket into ``OUT/<side>/<WxH>/index.json``, then those, in the bucket set's order, into the side's.
    Both levels name the same shard files: nothing is copied."""
    for side, by_bucket in folders.items():
        if side not in buckets_in_order:
            _merge_into(out / str(side), by_bucket.get("", []))
            continue
        filled = [b for b in buckets_in_order[side] if b in by_bucket]
        for bucket in filled:
            _merge_into(out / str(side) / bucket, by_bucket[bucket])
        _merge_into(out / str(side), [out / str(side) / bucket for bucket in filled])


def _total(done: dict[str, ConvertSummary], sides: Sequence[int]) -> ConvertSummary:
    total = ConvertSummary(written={side: 0 for side in sides})
    for summary in done.values():
        total.add(summary)
    return total


def _merge_in_a_worker(out: Path, folders, buckets_in_order) -> None:
    """``_merge`` in a process of the workers' fork server, which has imported Streaming: this process need not
    (6-10 s of CPU, as long as a quarter of the work on a 400-image conversion at 2 workers)."""
    with _worker_pool(1) as pool:
        pool.submit(_merge, out, folders, buckets_in_order).result()


def _finish(out: Path, plan: dict, src: Any, workers: int = 1) -> ConvertSummary:
    """Merge the finished units' indexes and record the summary; refuse a conversion that wrote nothing."""
    sides, names = plan["options"]["sides"], _unit_names(len(plan["units"]))
    done = _done_summaries(out, names)
    total = _total(done, sides)
    if total.converted == 0:
        raise WorkbenchError(f"no usable images in {src} ({total.line()})")
    aspect = plan["options"].get("aspect")
    buckets_in_order = {side: [bucket_name(tuple(b)) for b in buckets] for side, buckets in aspect or ()}
    folders = _unit_folders(out, sides, {n: done[n] for n in names if n in done}, aspect is not None)
    _check_unit_indexes(folders)
    (_merge_in_a_worker if workers > 1 else _merge)(out, folders, buckets_in_order)
    write_text_whole(out / STATE / "summary.json", total.to_json())
    return total


def _filters(min_aesthetic, aesthetic_column, languages, language_column, max_punsafe, max_watermark):
    filters = []
    if min_aesthetic is not None:
        filters.append(Filter("aesthetic", aesthetic_column, AESTHETIC_COLUMNS, "min", float(min_aesthetic)))
    if languages is not None:
        filters.append(Filter("language", language_column, LANGUAGE_COLUMNS, "in",
                              tuple(sorted({lang.strip().lower() for lang in languages}))))
    if max_punsafe is not None:
        filters.append(Filter("punsafe", None, PUNSAFE_COLUMNS, "max", float(max_punsafe)))
    if max_watermark is not None:
        filters.append(Filter("watermark", None, WATERMARK_COLUMNS, "max", float(max_watermark)))
    return tuple(filters)


def _aspect_buckets(sides: Sequence[int], aspect_buckets: bool, bucket_step: int | None, max_aspect: float | None):
    """Each side's bucket set, or None for square buckets; the bucket options without aspect_buckets are refused."""
    if not aspect_buckets:
        if bucket_step is not None or max_aspect is not None:
            raise WorkbenchError("bucket_step and max_aspect apply to aspect-ratio buckets only (--aspect-buckets)")
        return None
    max_aspect = DEFAULT_MAX_ASPECT if max_aspect is None else float(max_aspect)
    check_bucket_count(sides, bucket_step, max_aspect)  # before any set is made: a set may be 10^8 buckets
    return tuple((side, bucket_set(side, bucket_step, max_aspect)) for side in sides)


def _check_arguments(sides, limit, max_megapixels, workers, part, image_format, max_row_group_bytes) -> None:
    if not sides or sides[0] <= 0:
        raise WorkbenchError(f"buckets must be positive sides in pixels, got {list(sides)}")
    if limit is not None and limit < 1:
        raise WorkbenchError(f"limit must be at least 1, got {limit}")
    if not max_megapixels > 0:
        raise WorkbenchError(f"max_megapixels must be positive, got {max_megapixels}")
    if not max_row_group_bytes > 0:
        raise WorkbenchError(f"max_row_group_bytes must be positive, got {max_row_group_bytes}")
    if workers is not None and workers < 1:
        raise WorkbenchError(f"workers must be at least 1, got {workers}")
    if part is not None and not (part[1] >= 1 and 0 <= part[0] < part[1]):
        raise WorkbenchError(f"part must be i/N with 0 <= i < N, got {part[0]}/{part[1]}")
    if part is not None and limit is not None:
        raise WorkbenchError("limit and part cannot be combined: a limit counts images across all parts")
    image_columns(image_format)  # validates the format before any work


def convert_to_mds(src: str | Path | Sequence[str | Path], out: str | Path, *, buckets: Sequence[int] = (256, 512),
                   image_format: str = "jpeg", image_column: str | None = None, caption_column: str | None = None,
                   min_aesthetic: float | None = None, aesthetic_column: str | None = None,
                   languages: Sequence[str] | None = None, language_column: str | None = None,
                   max_punsafe: float | None = None, max_watermark: float | None = None,
                   split: str = "train", limit: int | None = None, max_megapixels: float = DEFAULT_MAX_MEGAPIXELS,
                   workers: int | None = None, part: tuple[int, int] | None = None,
                   max_row_group_bytes: int = DEFAULT_MAX_ROW_GROUP_BYTES, aspect_buckets: bool = False,
                   bucket_step: int | None = None, max_aspect: float | None = None,
                   progress: bool = True) -> ConvertSummary:
    """Convert SRC (one source or several) into one MDS folder per bucket, ``OUT/<side>``.

    ``limit`` caps the images converted (then units run one after another, in order); images with more than
    ``max_megapixels`` to decode are skipped and counted, and so are Parquet row groups of more than
    ``max_row_group_bytes`` uncompressed. ``workers``: processes (default: every core).
    ``part=(i, N)`` converts only the i-th of N parts and leaves the merge to ``join_parts``. Repeating a
    command whose run was killed finishes it; repeating a finished one returns its summary.

    ``aspect_buckets``: each image goes, per side, into the aspect-ratio bucket nearest its own of about
    side x side pixels (``buckets.bucket_set``: sides multiples of ``bucket_step``, default 64 from 512 up and
    32 below; ratios up to ``max_aspect``:1, default 2), covered and centre-cropped, with its original size,
    crop and bucket in columns of its own.
    """
    sides = sorted({int(b) for b in buckets})
    _check_arguments(sides, limit, max_megapixels, workers, part, image_format, max_row_group_bytes)
    filters = _filters(min_aesthetic, aesthetic_column, languages, language_column, max_punsafe, max_watermark)
    options = _Options(tuple(sides), image_format, filters, max_megapixels * 1e6, limit, int(max_row_group_bytes),
                       _aspect_buckets(sides, aspect_buckets, bucket_step, max_aspect))
    sources = [src] if isinstance(src, (str, Path)) else list(src)
    units = plan_units(sources, Columns(image_column, caption_column, filters), split)
    out = Path(out)
    version = BUCKET_PLAN_VERSION if options.aspect else PLAN_VERSION
    plan = json.loads(json.dumps({"version": version, "options": options.plan(), "units": units}))
    _claim(out, plan)
    if part is None and (out / STATE / "summary.json").is_file():
        finished = out / STATE / "summary.json"
        summary = ConvertSummary.from_json(finished.read_bytes(), str(finished))
        summary.units_kept = len(units)
        return summary

    names = _unit_names(len(units))
    mine = [k for k in range(len(units)) if part is None or k % part[1] == part[0]]
    done = _done_summaries(out, [names[k] for k in mine])
    pending = [k for k in mine if names[k] not in done]
    workers = workers or len(os.sched_getaffinity(0))
    _convert_pending(out, names, units, options, pending, done, workers, progress)
    if part is not None:
        summary = _total(done, sides)
    else:
        where = src if isinstance(src, (str, Path)) else ", ".join(map(str, src))
        summary = _finish(out, plan, where, workers if options.limit is None and len(pending) > 1 else 1)
    summary.units_kept = len(mine) - len(pending)
    return summary


def _convert_pending(out: Path, names, units, options: _Options, pending: Sequence[int],
                     done: dict[str, ConvertSummary], workers: int, progress: bool) -> None:
    """Convert the pending units, adding each summary to ``done``; with a limit, in order until it is met."""
    bar = tqdm(total=len(pending), disable=not progress, unit="unit", desc="convert")
    if options.limit is None:
        tasks = [(str(out), names[k], units[k], options, None) for k in pending]
        for name, summary in _run(tasks, workers):
            done[name] = summary
            bar.update()
    else:
        for k in pending:
            budget = options.limit - sum(s.converted for s in done.values())
            if budget <= 0:
                break
            _, done[names[k]] = _convert_unit((str(out), names[k], units[k], options, budget))
            bar.update()
    bar.close()


def join_parts(out: str | Path) -> ConvertSummary:
    """Merge the parts of a conversion run with ``part=(i, N)`` (all in OUT: one shared folder, or each part's
    OUT copied into one) into ``OUT/<side>/index.json``; refuses while a unit of any part is missing."""
    out = Path(out)
    plan = _read_plan(out)
    if plan is None:
        raise WorkbenchError(f"{out} holds no conversion parts ({STATE}/plan.json missing)")
    names = _unit_names(len(plan["units"]))
    done = _done_summaries(out, names)
    if missing := [n for n in names if n not in done]:
        first = plan["units"][names.index(missing[0])]
        raise WorkbenchError(f"{out}: {len(missing)} of {len(names)} units are not converted yet (the first: unit "
                             f"{missing[0]}, {first.get('url') or first.get('dir') or first.get('src')}); run "
                             f"every part's command again, then join")
    return _finish(out, plan, out)
