"""Tables of encoded images: Parquet files (img2dataset's ``parquet`` output, a Hugging Face hub repository's
``data/train-*.parquet``, LAION-style exports) and Hugging Face ``datasets`` datasets (``save_to_disk``
folders, hub ids); and the metadata Parquet img2dataset writes beside each shard of its other layouts.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterator, Sequence

from ..errors import WorkbenchError, first_line
from .records import CAPTION_KEYS, Filter, Record, scalar_fields
from .storage import is_remote, local_copy, open_seekable

IMAGE_COLUMNS = ("image", "jpg", "png", "webp", "img")
KEY_COLUMN = "key"  # img2dataset's sample key: the tar member's or the file's name without its extension
ROWS_PER_UNIT = 5000  # rows of a datasets dataset per unit of work: about 20 s of one core at 256/512 px


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


def _record(row: dict[str, Any], image_column: str, caption_column: str, source: str | int) -> Record:
    image, caption = row.pop(image_column), row.pop(caption_column)
    fields = {k: v for k, v in scalar_fields(row).items() if k not in CAPTION_KEYS}  # img2dataset repeats it as txt
    return Record(source, image, "" if caption is None else str(caption), fields)


def parquet_schema(url: str) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(open_seekable(url)).schema_arrow.names
    except (OSError, pa.ArrowException) as e:
        raise WorkbenchError(f"{url} is not a readable Parquet file ({first_line(e)})") from e


def parquet_records(url: str, name: str, image_column: str, caption_column: str) -> Iterator[Record]:
    import pyarrow.parquet as pq

    parquet, row_index = pq.ParquetFile(open_seekable(url)), 0
    for batch in parquet.iter_batches(batch_size=256):  # bounded memory on large shards
        for row in batch.to_pylist():
            yield _record(row, image_column, caption_column, f"{name}:{row_index}")
            row_index += 1


def metadata_by_key(url: str) -> dict[str, dict[str, Any]]:
    """img2dataset's metadata beside a shard (every row it tried, by ``key``): scalars only. An unreadable
    one adds nothing; the samples' own ``.json`` members still carry the same fields."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(open_seekable(url))
    except (OSError, pa.ArrowException, WorkbenchError):
        return {}
    if KEY_COLUMN not in table.column_names:
        return {}
    return {str(row[KEY_COLUMN]): scalar_fields(row) for row in table.to_pylist() if row.get(KEY_COLUMN) is not None}


@lru_cache(maxsize=2)  # a worker converts many units of one dataset: opened once per process (memory-mapped)
def _load_dataset(src: str, on_disk: bool, split: str):
    import datasets  # slow to import; only this source needs it

    if on_disk and is_remote(src):
        src = str(local_copy(src))  # datasets memory-maps the folder's Arrow files
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


def hf_records(unit: dict) -> Iterator[Record]:
    import datasets

    ds = _load_dataset(unit["src"], unit["on_disk"], unit["split"])
    image_col = unit["image_column"]
    if isinstance(ds.features[image_col], datasets.Image):
        # Take the encoded bytes and decode in conversion: once, with JPEG draft, and a corrupt image is
        # skipped instead of raising in the middle of the dataset's iteration.
        ds = ds.cast_column(image_col, datasets.Image(decode=False))
    rows = ds.select(range(unit["start"], unit["stop"]))
    return (_record(row, image_col, unit["caption_column"], unit["start"] + i) for i, row in enumerate(rows))
