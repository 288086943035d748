"""The image-caption MDS format every training dataset of the workbench is written in.

Columns: ``image`` (encoded PNG or JPEG), ``caption`` (str), ``meta`` (json: source attributes); a dataset
converted into aspect-ratio buckets adds ``ASPECT_COLUMNS`` (int32): the source's size, the crop's top-left in
the resized image (SDXL's crop conditioning) and the bucket's size. A DreamBooth dataset (``dwb data dreambooth``)
adds ``DREAMBOOTH_COLUMNS``: ``prior`` (uint8, 1 for a class image of prior preservation) and, where any image has
a mask, ``mask`` (PNG, one channel: each pixel's weight in the loss, 255 full, 0 none).
A dataset folder holds one subfolder per resolution bucket, named by its side in pixels
(``OUT/256``, ``OUT/512``); the shapes domain adds a held-out split under ``OUT/eval/<side>``. A budget
folder of aspect-ratio buckets holds one dataset per bucket, ``OUT/<side>/<WxH>/``, and an index over all of
them (shards named ``<WxH>/<unit>/shard...``), so it reads as one dataset too.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..common import Range, checked, load_outside
from ..errors import WorkbenchError, first_line

from ..readers import outside_root


@dataclass
class StreamConfig:
    """One MDS dataset in a mixture (Streaming's ``Stream``): local, or remote with a local cache."""

    path: str = ""  # the local folder, or the cache folder of a remote (empty: a temporary cache)
    remote: Optional[str] = None  # s3://bucket/prefix or any remote Streaming reads
    proportion: Optional[float] = checked(None, Range(0, 1))  # share of each epoch (all streams or none; they sum to 1)
    repeat: Optional[float] = checked(None, Range(0, 1e6))  # or: how many times each sample is seen per epoch
    choose: Optional[int] = checked(None, Range(0, 1 << 36))  # or: how many samples this stream gives per epoch


ASPECT_COLUMNS = ("original_width", "original_height", "crop_top", "crop_left", "bucket_width", "bucket_height")


DREAMBOOTH_COLUMNS = {"prior": "uint8", "mask": "png"}


def image_columns(image_format: str, aspect: bool = False, extra: tuple[str, ...] = ()) -> dict[str, str]:
    """The columns of a dataset; ``extra``: names of ``DREAMBOOTH_COLUMNS`` it also holds."""
    if image_format not in ("png", "jpeg"):
        raise WorkbenchError(f"image format must be png or jpeg, got {image_format!r}")
    return {"image": image_format, "caption": "str", "meta": "json",
            **({name: "int32" for name in ASPECT_COLUMNS} if aspect else {}),
            **{name: DREAMBOOTH_COLUMNS[name] for name in extra}}


def open_writer(out: str | Path, image_format: str = "png", size_limit: str = "64mb", aspect: bool = False,
                extra: tuple[str, ...] = ()):
    """An MDSWriter for one bucket folder; refuses to mix into an existing dataset."""
    from streaming import MDSWriter  # Streaming imports transformers' auto classes (seconds); counting needs none

    out = Path(out)
    if (out / "index.json").exists():
        raise WorkbenchError(f"{out} already holds an MDS dataset; choose an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    return MDSWriter(out=str(out), columns=image_columns(image_format, aspect, extra), size_limit=size_limit,
                     compression=None)


def bucket_dirs(root: str | Path) -> dict[int, Path]:
    """The resolution buckets under a dataset folder, by side."""
    root = Path(root)
    return {int(p.name): p for p in sorted(root.iterdir()) if p.name.isdigit() and (p / "index.json").is_file()} if root.is_dir() else {}


BUCKET_FOLDER = re.compile(r"^([0-9]{1,5})x([0-9]{1,5})$")  # an aspect-ratio bucket's folder: 640x384


def by_aspect(bucket: tuple[int, int]) -> float:
    """The order of a bucket set: tallest to widest."""
    return bucket[0] / bucket[1]


def buckets_of_index(index: dict) -> dict[tuple[int, int], int]:
    """Samples per aspect-ratio bucket (width, height) of a budget folder's index, whose every shard lies in a
    bucket's folder (``640x384/00000/shard.00000.mds``); {} for any other dataset."""
    counts: dict[tuple[int, int], int] = {}
    for shard in index["shards"]:
        match = BUCKET_FOLDER.match(shard["raw_data"]["basename"].split("/")[0])
        if match is None or "/" not in shard["raw_data"]["basename"]:
            return {}
        bucket = (int(match[1]), int(match[2]))
        counts[bucket] = counts.get(bucket, 0) + int(shard["samples"])
    return counts


def bucket_folders(folder: str | Path) -> dict[tuple[int, int], int]:
    """The aspect-ratio buckets (width, height) of a local budget folder, with the samples of each, counted from
    each bucket's own index once checked against its shards; {} for any other dataset."""
    folder = Path(folder)
    buckets = buckets_of_index(_read_index(folder))
    return {bucket: count_samples(folder / f"{bucket[0]}x{bucket[1]}") for bucket in sorted(buckets, key=by_aspect)}


def count_samples(folder: str | Path) -> int:
    """Samples of a local MDS dataset, from its index once checked against its shards (``checked_index``)."""
    return sum(shard["samples"] for shard in checked_index(folder)["shards"])


def checked_index(folder: str | Path) -> dict:
    """The ``index.json`` of a local MDS dataset, checked against its shard files before any sample is read.

    Each shard the index lists must be present with the size the index gives, and an uncompressed MDS shard's
    own sample count (its first four bytes) and end (its last offset) must agree with it. An index that
    claimed 1000x its samples failed later as "ValueError: not enough values to unpack", a deleted shard as
    "RuntimeError: Background thread failed"; neither named the dataset. Costs two small reads per shard.
    """
    folder = Path(folder)
    index = _read_index(folder)
    for shard in index["shards"]:
        _check_shard(folder, shard)
    return index


def _read_index(folder: Path) -> dict:
    path = folder / "index.json"
    if not path.is_file():
        raise WorkbenchError(f"no MDS dataset at {folder} (index.json missing)")
    index = load_outside(path, f"MDS dataset {folder}: index.json")
    try:
        for shard in index["shards"]:
            int(shard["samples"]), int(shard["raw_data"]["bytes"])
            if not all(isinstance(shard[k]["basename"], str) for k in ("raw_data", "zip_data") if shard.get(k)):
                raise TypeError("a shard's basename is not a string")
    except (ValueError, KeyError, TypeError) as e:
        raise WorkbenchError(f"MDS dataset {folder}: index.json is unreadable ({type(e).__name__}: {first_line(e)})") from None
    return index


def _check_shard(folder: Path, shard: dict) -> None:
    """One shard against its index entry: inside the dataset folder, present (uncompressed, or else its
    compressed file, which Streaming unpacks on first read), its size, and an MDS shard's own sample count."""
    raw, packed = shard["raw_data"], shard.get("zip_data")
    unpacked = (folder / raw["basename"]).is_file() or not (packed and (folder / packed["basename"]).is_file())
    file = raw if unpacked else packed
    path, where = folder / file["basename"], f"MDS dataset {folder}: shard {file['basename']}"
    reason = outside_root(folder, file["basename"], links=True)
    if reason == "leads out of its folder":
        raise WorkbenchError(f"{where} lies outside the dataset folder")
    if reason:
        raise WorkbenchError(f"{where} {'is missing (index.json lists it)' if reason == 'does not exist' else reason}")
    size = path.stat().st_size
    if size != file["bytes"]:
        raise WorkbenchError(f"{where} is {size} bytes, but index.json says {file['bytes']} (cut short or replaced)")
    if unpacked and shard.get("format") == "mds":
        held, end = _mds_header(path)
        if held != shard["samples"]:
            raise WorkbenchError(f"{where} holds {held} samples, but index.json says {shard['samples']}")
        if end != size:
            raise WorkbenchError(f"{where}: its sample table ends at byte {end}, but the file has {size}")


def _mds_header(path: Path) -> tuple[int, int]:
    """(samples, end of the last sample) from an MDS shard's header: a uint32 count, then count + 1 uint32
    offsets into the file (``MDSWriter.encode_joint_shard``)."""
    with open(path, "rb") as f:
        head = f.read(4)
        if len(head) < 4:
            return 0, -1
        held = int.from_bytes(head, "little")
        f.seek(4 + 4 * held)
        last = f.read(4)
    return held, int.from_bytes(last, "little") if len(last) == 4 else -1


# Streaming's pickle encoding: decoding a sample of such a column runs whatever the pickle says.
UNSAFE_ENCODINGS = frozenset({"pkl"})


def check_safe_columns(dataset, where: str) -> None:
    """Refuse, by column, a dataset (``StreamingDataset`` or ``LocalDataset``) whose columns decode with pickle.

    Call it after the dataset is built (its index is read, no sample yet) and before any sample is read.
    ``StreamingDataset`` refuses them itself while it is built (``allow_unsafe_types`` is never set here);
    ``LocalDataset`` does not.
    """
    for shard in getattr(dataset, "shards", []):
        for name, encoding in zip(getattr(shard, "column_names", []), getattr(shard, "column_encodings", [])):
            if encoding in UNSAFE_ENCODINGS:
                raise WorkbenchError(f"{where}: column '{name}' is stored with pickle ('{encoding}'), which runs code "
                                     "when read; refused (write it as json, str or bytes)")


def open_local(folder: str | Path, where: str | None = None):
    """A ``LocalDataset`` of an MDS folder, its index checked against its shards (``checked_index``) and its
    columns checked (``check_safe_columns``)."""
    from streaming import LocalDataset

    if not sum(int(shard["samples"]) for shard in checked_index(folder)["shards"]):
        raise WorkbenchError(f"{where or folder}: the MDS dataset holds no samples")  # Streaming: a raw IndexError
    dataset = LocalDataset(local=str(folder))
    check_safe_columns(dataset, where or str(folder))
    return dataset


def open_streaming(open_dataset, attempts: int = 5):
    """Open a StreamingDataset, again when another process took its shared-memory name first. Streaming picks
    the first free name, then creates it: two datasets opened at the same moment on one machine (two runs, or
    a run beside a benchmark) can pick the same one, and the second fails with FileExistsError; reopening
    picks the next free name."""
    for attempt in range(attempts):
        try:
            return open_dataset()
        except FileExistsError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
