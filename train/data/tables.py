"""Tables of encoded images: Parquet files (img2dataset's ``parquet`` output, a Hugging Face hub repository's
``data/train-*.parquet``, LAION-style exports) and Hugging Face ``datasets`` datasets (``save_to_disk``
folders, hub ids); and the metadata Parquet img2dataset writes beside each shard of its other layouts.

A table's image cell is taken as bytes only: a cell that holds a file path instead (a ``{"bytes": null,
"path": ...}`` struct, a string) is refused and counted, never opened; so is an image over ``MAX_FILE_BYTES``
and a caption over ``MAX_SIDECAR_BYTES``. A hub dataset built from image files (datasets' ``imagefolder``)
keeps paths into the Hugging Face caches: those, and only those, are read. A Parquet file is read row group
by row group: one whose uncompressed columns hold more than ``max_row_group_bytes`` (the metadata says,
before any is read) is skipped and counted, and the rest in batches of at most ``BATCH_BYTES`` taking every
value as large as its whole column chunk (a dictionary-encoded 10 MiB cell in 150 rows of a 1 KiB file decoded
to 1.5 GB in one batch of 256 rows, and again as Python values). A ``save_to_disk`` folder is refused whole when it holds a link, or its JSON names a
file outside it (``state.json``'s ``_data_files`` are memory-mapped wherever they point).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Sequence

from models.common import load_outside
from models.errors import WorkbenchError, first_line

from .records import CAPTION_KEYS, MAX_FILE_BYTES, MAX_SIDECAR_BYTES, Filter, ReadCounts, Record, scalar_fields
from .storage import is_remote, local_copy, open_seekable, outside_root, read_bounded, walk_local

IMAGE_COLUMNS = ("image", "jpg", "png", "webp", "img")
KEY_COLUMN = "key"  # img2dataset's sample key: the tar member's or the file's name without its extension
ROWS_PER_UNIT = 5000  # rows of a datasets dataset per unit of work: about 20 s of one core at 256/512 px
# A Parquet row group's uncompressed columns, read whole by pyarrow: img2dataset writes 100 rows a group (30 MB
# at 300 KB an image), datasets' push_to_hub about 100 MB; 1 GiB leaves ten times that.
DEFAULT_MAX_ROW_GROUP_BYTES = 2**30
BATCH_BYTES = 64 * 2**20  # decoded rows of a Parquet file held at once (and again as Python values)
METADATA_BYTES = 256 * 2**20  # a metadata Parquet beside a shard, its scalars as Python values: 10,000 rows ~ 20 MB


def _pick(names: Sequence[str], given: str | None, candidates: Sequence[str], what: str, where: str) -> str:
    if given is not None and given in names:
        return given
    if given is None and (found := next((c for c in candidates if c in names), None)):
        return found
    wanted = repr(given) if given is not None else f"{what} column (looked for {', '.join(candidates)})"
    raise WorkbenchError(f"{where} has no {wanted}; its columns are {', '.join(names)}: "
                         f"name the {what} column with --{what}-column")


def has_image_column(names: Sequence[str], image_column: str | None) -> bool:
    return (image_column in names) if image_column else any(c in names for c in IMAGE_COLUMNS)


def table_columns(names: Sequence[str], where: str, image_column: str | None, caption_column: str | None,
                  filters: Sequence[Filter]) -> tuple[str, str]:
    """Resolve the image and caption columns; fail before any work when a requested filter has no column."""
    for f in filters:
        _pick(names, f.column, f.candidates, f.what, where)
    return (_pick(names, image_column, IMAGE_COLUMNS, "image", where),
            _pick(names, caption_column, CAPTION_KEYS, "caption", where))


def _image_bytes(cell: Any, counts: ReadCounts, cache_roots: Sequence[str] = ()) -> bytes | None:
    """The encoded image of a table's cell: bytes (or a struct's ``bytes``) up to ``MAX_FILE_BYTES``. A path
    (a struct's ``path`` without bytes, a string) is refused and counted, unless it lies in one of
    ``cache_roots`` (a hub dataset's own downloads); None is a row without image (a failed download)."""
    if isinstance(cell, dict):
        cell = cell.get("bytes") or (cell.get("path") and _cached_file(cell["path"], cache_roots))
    if cell is None:
        return None
    if not isinstance(cell, (bytes, bytearray, memoryview)) or len(cell) > MAX_FILE_BYTES:
        counts.refused += 1
        return None
    return bytes(cell)


def _cached_file(path: str, cache_roots: Sequence[str]) -> bytes | str:
    """A hub dataset's image file in a Hugging Face cache, read up to its limit; else the path, refused."""
    if any(outside_root(root, path, links=True) is None for root in cache_roots):
        return read_bounded(path, MAX_FILE_BYTES) or path
    return path


def _record(row: dict[str, Any], image_column: str, caption_column: str, source: str | int,
            counts: ReadCounts, cache_roots: Sequence[str] = ()) -> Record:
    image, caption = _image_bytes(row.pop(image_column), counts, cache_roots), row.pop(caption_column)
    caption = "" if caption is None else str(caption)
    if len(caption) > MAX_SIDECAR_BYTES:
        counts.refused += 1
        caption = None
    fields = {k: v for k, v in scalar_fields(row).items() if k not in CAPTION_KEYS}  # img2dataset repeats it as txt
    return Record(source, image, caption, fields)


def parquet_schema(url: str) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(open_seekable(url)).schema_arrow.names
    except (OSError, pa.ArrowException) as e:
        raise WorkbenchError(f"{url} is not a readable Parquet file ({first_line(e)})") from e


def row_group_bytes(metadata, index: int) -> int:
    """What a row group's columns hold uncompressed, as its metadata says (the larger of the group's total and
    its column chunks' sum, should one of them understate it)."""
    group = metadata.row_group(index)
    chunks = sum(group.column(c).total_uncompressed_size for c in range(group.num_columns))
    return max(group.total_byte_size, chunks)


def bounded_rows(parquet, counts: ReadCounts, max_row_group_bytes: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row index, row) of a ``pyarrow.parquet.ParquetFile``, row group by row group; a group over
    ``max_row_group_bytes`` is skipped and counted; rows are decoded ``BATCH_BYTES`` at a time, every value
    taken as large as its group (a dictionary's value is at most its column chunk), so never more."""
    metadata, start = parquet.metadata, 0
    for index in range(metadata.num_row_groups):
        size, rows = row_group_bytes(metadata, index), metadata.row_group(index).num_rows
        if size > max_row_group_bytes:
            counts.row_groups += 1
        else:
            batch = max(1, min(256, BATCH_BYTES // max(size, 1)))
            row = start
            for chunk in parquet.iter_batches(batch_size=batch, row_groups=[index]):
                for values in chunk.to_pylist():
                    yield row, values
                    row += 1
        start += rows


def parquet_records(url: str, name: str, image_column: str, caption_column: str, counts: ReadCounts,
                    max_row_group_bytes: int = DEFAULT_MAX_ROW_GROUP_BYTES) -> Iterator[Record]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(open_seekable(url))
    for row_index, row in bounded_rows(parquet, counts, max_row_group_bytes):
        yield _record(row, image_column, caption_column, f"{name}:{row_index}", counts)


def metadata_by_key(url: str, counts: ReadCounts) -> dict[str, dict[str, Any]]:
    """img2dataset's metadata beside a shard (every row it tried, by ``key``): scalars only. An unreadable
    one adds nothing; the samples' own ``.json`` members still carry the same fields. One of more than
    ``METADATA_BYTES``, uncompressed or as Python values, is refused and counted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    by_key, size = {}, 0
    try:
        parquet = pq.ParquetFile(open_seekable(url))
        groups = range(parquet.metadata.num_row_groups)
        if sum(row_group_bytes(parquet.metadata, i) for i in groups) > METADATA_BYTES:
            counts.refused += 1
            return {}
        if KEY_COLUMN not in parquet.schema_arrow.names:
            return {}
        for _, row in bounded_rows(parquet, counts, METADATA_BYTES):
            if row.get(KEY_COLUMN) is not None:
                by_key[str(row[KEY_COLUMN])] = fields = scalar_fields(row)
                size += sum(len(k) + (len(v) if isinstance(v, str) else 8) for k, v in fields.items())
                if size > METADATA_BYTES:
                    counts.refused += 1
                    return {}
    except (OSError, pa.ArrowException, WorkbenchError):
        return {}
    return by_key


def _check_saved_folder(root: Path) -> None:
    """Refuse a ``save_to_disk`` folder that holds a link, JSON that is too large or deep, or names a file
    outside it: ``dataset_dict.json``'s splits, each ``state.json``'s ``_data_files`` (memory-mapped by
    ``datasets`` wherever they point: ``../x.arrow`` read another dataset into this one)."""
    _, refused = walk_local(root)
    if refused:
        raise WorkbenchError(f"{root}: {refused[0]} {outside_root(root, refused[0])}; a saved dataset is read only "
                             f"from the files inside its folder")
    splits = ["."]
    if (root / "dataset_dict.json").is_file():
        listing = load_outside(root / "dataset_dict.json", f"{root}/dataset_dict.json")
        listed = listing.get("splits") if isinstance(listing, dict) else None
        splits = [str(s) for s in listed] if isinstance(listed, list) else []
    for split in splits:
        _check_split(root, split)


def _check_split(root: Path, split: str) -> None:
    where = "" if split == "." else f"{split}/"
    if split != "." and (reason := outside_root(root, f"{split}/state.json")):
        raise WorkbenchError(f"{root}/dataset_dict.json: the split {split!r}: {where}state.json {reason}")
    for name in ("dataset_info.json", "state.json"):
        if (root / where / name).is_file():
            load_outside(root / where / name, f"{root}/{where}{name}")
    state = load_outside(root / where / "state.json", f"{root}/{where}state.json")
    files = state.get("_data_files") if isinstance(state, dict) else None
    for entry in files if isinstance(files, list) else []:
        name = str(entry.get("filename")) if isinstance(entry, dict) else str(entry)
        if reason := outside_root(root, f"{where}{name}"):
            raise WorkbenchError(f"{root}/{where}state.json: the data file {name!r} {reason}; a saved dataset "
                                 f"is read only from the files inside its folder")


def _hub_caches() -> tuple[str, ...]:
    """Where ``datasets`` keeps a hub dataset's files: a dataset built from image files points into them."""
    import datasets
    from huggingface_hub import constants

    return str(datasets.config.HF_DATASETS_CACHE), str(constants.HF_HUB_CACHE)


@lru_cache(maxsize=2)  # a worker converts many units of one dataset: opened once per process (memory-mapped)
def _load_dataset(src: str, on_disk: bool, split: str):
    import datasets  # slow to import; only this source needs it

    if on_disk and is_remote(src):
        src = str(local_copy(src))  # datasets memory-maps the folder's Arrow files
    if on_disk:
        _check_saved_folder(Path(src))
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
    return ds


def hf_plan(src: str, on_disk: bool, split: str, image_column: str | None, caption_column: str | None,
            filters: Sequence[Filter]) -> list[dict]:
    """Units of ``ROWS_PER_UNIT`` rows of a datasets dataset saved with ``save_to_disk`` (``on_disk``) or a hub id."""
    ds = _load_dataset(src, on_disk, split)
    image_col, caption_col = table_columns(ds.column_names, src, image_column, caption_column, filters)
    return [{"kind": "hf", "src": src, "on_disk": on_disk, "split": split, "start": start,
             "stop": min(start + ROWS_PER_UNIT, len(ds)), "image_column": image_col, "caption_column": caption_col}
            for start in range(0, len(ds), ROWS_PER_UNIT)]


def hf_files(unit: dict) -> list[str]:
    """The files a datasets unit reads: its Arrow files (memory-mapped; a hub dataset's cached ones)."""
    ds = _load_dataset(unit["src"], unit["on_disk"], unit["split"])
    return [f["filename"] for f in ds.cache_files]


def hf_records(unit: dict, counts: ReadCounts) -> Iterator[Record]:
    import datasets

    ds = _load_dataset(unit["src"], unit["on_disk"], unit["split"])
    image_col = unit["image_column"]
    if isinstance(ds.features[image_col], datasets.Image):
        # Take the encoded bytes and decode in conversion: once, with JPEG draft, and a corrupt image is
        # skipped instead of raising in the middle of the dataset's iteration.
        ds = ds.cast_column(image_col, datasets.Image(decode=False))
    caches = () if unit["on_disk"] else _hub_caches()
    rows = ds.select(range(unit["start"], unit["stop"]))
    return (_record(row, image_col, unit["caption_column"], unit["start"] + i, counts, caches)
            for i, row in enumerate(rows))
