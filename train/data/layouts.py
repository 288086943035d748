"""Which layout a conversion source is, and its units of work: one tar shard, one Parquet file, up to
``IMAGES_PER_UNIT`` images of one folder, or ``ROWS_PER_UNIT`` rows of a datasets dataset.

Sources: local paths or ``s3://`` URLs, several at once, with brace patterns (``{00000..00999}.tar``).
A folder (local or an ``s3://`` prefix, read alike) is read as the first of these it holds: a ``save_to_disk``
dataset; WebDataset tars (img2dataset's ``webdataset`` output: the Parquet beside each tar is its metadata);
Parquet files with an image column (img2dataset's ``parquet`` output, a hub repository's ``data/`` files); images
with sidecars (img2dataset's ``files`` output: the Parquet beside each folder is its metadata). A name that is
none of these is a hub id.

A local folder is read only inside itself: its listing never follows a link, and a link (or device) where a
tar or Parquet source would be becomes a ``refused`` unit, counted when converted; an image folder's links are
counted by its reader. Each unit carries ``state``: a digest of the sizes and times (ETags on S3) of the files
it reads, which a resumed conversion compares.
"""
from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Collection, Sequence

from models.errors import WorkbenchError

from .image_folders import folder_plan
from .records import IMAGE_SUFFIXES, Filter
from .storage import expand_braces, is_remote, list_objects, source_state, walk_local
from .tables import has_image_column, hf_files, hf_plan, parquet_schema, table_columns

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


def _unit_name(url: str, base: str) -> str:
    return url[len(base):].lstrip("/") or url.rsplit("/", 1)[-1]


def _tar_units(urls: Sequence[str], base: str, refused: Collection[str] = ()) -> list[dict]:
    return [{"kind": "refused" if url in refused else "tar", "url": url, "name": _unit_name(url, base)}
            for url in urls]


def _parquet_units(urls: Sequence[str], base: str, columns: Columns, refused: Collection[str] = ()) -> list[dict]:
    """Every file's columns are checked before converting anything (a refused one is never opened)."""
    units = []
    for url in urls:
        if url in refused:
            units.append({"kind": "refused", "url": url, "name": _unit_name(url, base)})
            continue
        image_col, caption_col = table_columns(parquet_schema(url), url, columns.image, columns.caption,
                                               columns.filters)
        units.append({"kind": "parquet", "url": url, "name": _unit_name(url, base), "image_column": image_col,
                      "caption_column": caption_col})
    return units


def _places(names) -> set[str]:
    """The files and the folders (``a/``) that hold them."""
    return set(names) | {n.rsplit("/", 1)[0] + "/" for n in names if "/" in n}


def _metadata_beside_shard(parquet: str, places: set[str]) -> bool:
    """img2dataset's ``00000.parquet`` beside ``00000.tar`` or the ``00000/`` folder of its files output."""
    stem = parquet[: -len(".parquet")]
    return f"{stem}.tar" in places or f"{stem}/" in places


def _folder(root: str, names: list[str], columns: Columns, split: str, refused: Sequence[str] = ()) -> list[dict]:
    """The units of a folder, local or on S3, from the names of the files under it (relative, ``/``-separated,
    in path order) and those its listing refused (links, devices): the first layout it holds, in the order of
    the module's docstring."""
    where = lambda name: f"{root.rstrip('/')}/{name}"  # noqa: E731
    everything, refused_urls = _in_path_order([*names, *refused]), {where(n) for n in refused}
    if any(marker in names for marker in HF_DISK_MARKERS):
        return hf_plan(root, True, split, columns.image, columns.caption, columns.filters)
    if tars := [n for n in everything if _is_tar(n)]:
        return _tar_units([where(n) for n in tars], root, refused_urls)
    parquets = [n for n in names if n.endswith(".parquet")]
    tables = [n for n in parquets if has_image_column(parquet_schema(where(n)), columns.image)]
    places = _places(names) if parquets else set()
    if tables or (parquets and not any(_metadata_beside_shard(n, places) for n in parquets)):
        chosen = set(tables or parquets) | {n for n in refused if n.endswith(".parquet")}  # else: which column
        return _parquet_units([where(n) for n in everything if n in chosen], root, columns, refused_urls)
    if images := [n for n in everything if PurePosixPath(n).suffix.lower() in IMAGE_SUFFIXES]:
        if columns.filters and not parquets and not any(n.endswith(".json") for n in names):
            raise WorkbenchError(f"{root} is an image folder without .json sidecars, so it has no "
                                 f"{' or '.join(f.what for f in columns.filters)} values to filter on")
        return folder_plan(root, images)
    raise WorkbenchError(f"{root} holds nothing conversion reads; looked for {LAYOUTS}")


def _in_path_order(names) -> list[str]:
    return sorted(names, key=lambda n: n.split("/"))


def _local_folder(root: Path, columns: Columns, split: str) -> list[dict]:
    names, refused = walk_local(root)
    return _folder(str(root), _in_path_order(names), columns, split, refused)


def _local_file(path: Path, columns: Columns) -> list[dict]:
    if _is_tar(path.name):
        return _tar_units([str(path)], str(path.parent))
    if path.suffix == ".parquet":
        tar, folder = path.with_suffix(".tar"), path.with_suffix("")  # what img2dataset's metadata describes
        if not has_image_column(parquet_schema(str(path)), columns.image) and (tar.is_file() or folder.is_dir()):
            return _local_file(tar, columns) if tar.is_file() else folder_plan_of_shard(folder)
        return _parquet_units([str(path)], str(path.parent), columns)
    raise WorkbenchError(f"{path} is not a tar shard, a Parquet file, a folder of either, an image folder or a "
                         f"saved datasets dataset (looked for {LAYOUTS})")


def folder_plan_of_shard(folder: Path) -> list[dict]:
    """One img2dataset ``files`` shard named by its metadata Parquet: its folder, read with that metadata (its
    reader judges each file, links among them)."""
    images = [f"{folder.name}/{p.name}" for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES]
    return folder_plan(str(folder.parent), _in_path_order(images))


def _remote(url: str, columns: Columns, split: str) -> list[dict]:
    if _is_tar(url):
        return _tar_units([url], url.rsplit("/", 1)[0])
    if url.endswith(".parquet"):
        return _parquet_units([url], url.rsplit("/", 1)[0], columns)
    names = _in_path_order(list_objects(url))
    if not names:
        raise WorkbenchError(f"{url} holds no objects")
    return _folder(url.rstrip("/"), names, columns, split)


def _one_source(src: str, columns: Columns, split: str, single: bool) -> list[dict]:
    if is_remote(src):
        return _remote(src, columns, split)
    path = Path(src).expanduser()
    if path.is_dir():
        return _local_folder(path, columns, split)
    if path.is_file():
        return _local_file(path, columns)
    if not single or not HUB_ID.match(src):
        raise WorkbenchError(f"{src} does not exist")
    return hf_plan(src, False, split, columns.image, columns.caption, columns.filters)


def plan_units(sources: Sequence[str | Path], columns: Columns, split: str) -> list[dict]:
    """The units of work of every source, in the order given (brace patterns expanded in order), each with
    its source's ``state``."""
    names = [name for src in sources for name in expand_braces(str(src))]
    units = [u for name in names for u in _one_source(name, columns, split, single=len(names) == 1)]
    if not units:
        raise WorkbenchError(f"{', '.join(map(str, sources))} holds nothing to convert; looked for {LAYOUTS}")
    listings, folders = {}, {}
    for unit in units:
        unit["state"] = source_state(_files_read(unit, listings, folders), listings)
    return units


def _files_read(unit: dict, listings: dict, folders: dict) -> list[str]:
    """The files and objects a unit reads (its whole directory for an image folder's unit, listed once)."""
    kind = unit["kind"]
    if kind in ("tar", "parquet"):
        beside = unit["url"][: -len(".tar")] + ".parquet" if unit["url"].endswith(".tar") else None
        return [unit["url"]] + ([beside] if beside else [])
    if kind == "images":
        root = unit["root"].rstrip("/")
        where = root if unit["dir"] == "." else f"{root}/{unit['dir']}"
        if where not in folders:
            if is_remote(where) and where not in listings:
                listings[where] = list_objects(where, below=False)
            names = listings[where] if is_remote(where) else os.listdir(where)
            folders[where] = [f"{where}/{n}" for n in names] + ([f"{where}.parquet"] if unit["dir"] != "." else [])
        return folders[where]
    if kind == "hf":
        return hf_files(unit)
    return []
