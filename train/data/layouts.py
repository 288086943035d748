"""Which layout a conversion source is, and its units of work: one tar shard, one Parquet file, up to
``IMAGES_PER_UNIT`` images of one folder, or ``ROWS_PER_UNIT`` rows of a datasets dataset.

Sources: local paths or ``s3://`` URLs, several at once, with brace patterns (``{00000..00999}.tar``).
A folder is read as the first of these it holds: a ``save_to_disk`` dataset; WebDataset tars (img2dataset's
``webdataset`` output: the Parquet beside each tar is its metadata); Parquet files with an image column
(img2dataset's ``parquet`` output, a hub repository's ``data/`` files); images with sidecars (img2dataset's
``files`` output: the Parquet beside each folder is its metadata). A name that is none of these is a hub id.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from ..errors import WorkbenchError
from .image_folders import folder_plan, has_json_sidecars
from .records import IMAGE_SUFFIXES, Filter
from .storage import expand_braces, is_remote, list_s3
from .tables import has_image_column, hf_plan, parquet_schema, table_columns

HF_DISK_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
HUB_ID = re.compile(r"^[\w-][\w.-]*(/[\w.-]+)?$")  # "name" or "owner/name"; not ./x, ~/x, /x
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
LAYOUTS = ("WebDataset tars (img2dataset's webdataset output), Parquet files with an image column "
           "(img2dataset's parquet output, a hub repository's data/), images with .txt/.json sidecars (an image "
           "folder, img2dataset's files output), or a datasets save_to_disk folder")


class Columns:
    """The columns the user named and the filters: what table layouts check before any work."""

    def __init__(self, image: str | None, caption: str | None, filters: Sequence[Filter]):
        self.image, self.caption, self.filters = image, caption, filters


def _is_tar(name: str) -> bool:
    return name.endswith(TAR_SUFFIXES)


def _tar_units(urls: Sequence[str], base: str) -> list[dict]:
    return [{"kind": "tar", "url": url, "name": url[len(base):].lstrip("/") or url.rsplit("/", 1)[-1]}
            for url in urls]


def _parquet_units(urls: Sequence[str], base: str, columns: Columns) -> list[dict]:
    """Every file's columns are checked before converting anything."""
    units = []
    for url in urls:
        image_col, caption_col = table_columns(parquet_schema(url), url, columns.image, columns.caption,
                                               columns.filters)
        units.append({"kind": "parquet", "url": url, "name": url[len(base):].lstrip("/") or url.rsplit("/", 1)[-1],
                      "image_column": image_col, "caption_column": caption_col})
    return units


def _metadata_beside_shard(parquet: Path) -> bool:
    """img2dataset's ``00000.parquet`` beside ``00000.tar`` or the ``00000/`` folder of its files output."""
    stem = parquet.with_suffix("")
    return stem.with_suffix(".tar").is_file() or stem.is_dir()


def _local_folder(root: Path, columns: Columns, split: str) -> list[dict]:
    if any((root / marker).is_file() for marker in HF_DISK_MARKERS):
        return hf_plan(str(root), True, split, columns.image, columns.caption, columns.filters)
    files = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).parts)
    tars = [p for p in files if _is_tar(p.name)]
    if tars:
        return _tar_units([str(p) for p in tars], str(root))
    parquets = [p for p in files if p.suffix == ".parquet"]
    tables = [p for p in parquets if has_image_column(parquet_schema(str(p)), columns.image)]
    if tables or (parquets and not any(_metadata_beside_shard(p) for p in parquets)):
        return _parquet_units([str(p) for p in (tables or parquets)], str(root), columns)  # else: which column
    if any(p.suffix.lower() in IMAGE_SUFFIXES for p in files):
        if columns.filters and not parquets and not has_json_sidecars(root):
            raise WorkbenchError(f"{root} is an image folder without .json sidecars, so it has no "
                                 f"{' or '.join(f.what for f in columns.filters)} values to filter on")
        return folder_plan(root)
    raise WorkbenchError(f"{root} holds nothing conversion reads; looked for {LAYOUTS}")


def _local_file(path: Path, columns: Columns) -> list[dict]:
    if _is_tar(path.name):
        return _tar_units([str(path)], str(path.parent))
    if path.suffix == ".parquet":
        if not has_image_column(parquet_schema(str(path)), columns.image) and _metadata_beside_shard(path):
            return _local_file(path.with_suffix(".tar"), columns) if path.with_suffix(".tar").is_file() \
                else folder_plan_of_shard(path.with_suffix(""))
        return _parquet_units([str(path)], str(path.parent), columns)
    raise WorkbenchError(f"{path} is not a tar shard, a Parquet file, a folder of either, an image folder or a "
                         f"saved datasets dataset (looked for {LAYOUTS})")


def folder_plan_of_shard(folder: Path) -> list[dict]:
    """One img2dataset ``files`` shard named by its metadata Parquet: its folder, read with that metadata."""
    return [dict(u, root=str(folder.parent), dir=folder.name) for u in folder_plan(folder)
            if u["dir"] == "."]


def _remote(url: str, columns: Columns) -> list[dict]:
    if _is_tar(url):
        return _tar_units([url], url.rsplit("/", 1)[0])
    if url.endswith(".parquet"):
        return _parquet_units([url], url.rsplit("/", 1)[0], columns)
    objects = list_s3(url)
    tars = [o for o in objects if _is_tar(o)]
    if tars:
        return _tar_units(tars, url)
    parquets = [o for o in objects if o.endswith(".parquet")]
    if parquets:
        return _parquet_units(parquets, url, columns)
    raise WorkbenchError(f"{url} holds no tar shards and no Parquet files ({len(objects)} objects); on S3 "
                         f"conversion reads WebDataset tars and Parquet files with an image column")


def _one_source(src: str, columns: Columns, split: str, single: bool) -> list[dict]:
    if is_remote(src):
        return _remote(src, columns)
    path = Path(src).expanduser()
    if path.is_dir():
        return _local_folder(path, columns, split)
    if path.is_file():
        return _local_file(path, columns)
    if not single or not HUB_ID.match(src):
        raise WorkbenchError(f"{src} does not exist")
    return hf_plan(src, False, split, columns.image, columns.caption, columns.filters)


def plan_units(sources: Sequence[str | Path], columns: Columns, split: str) -> list[dict]:
    """The units of work of every source, in the order given (brace patterns expanded in order)."""
    names = [name for src in sources for name in expand_braces(str(src))]
    units = [u for name in names for u in _one_source(name, columns, split, single=len(names) == 1)]
    if not units:
        raise WorkbenchError(f"{', '.join(map(str, sources))} holds nothing to convert; looked for {LAYOUTS}")
    return units
