"""Where conversion's sources live: local paths or ``s3://bucket/prefix`` URLs, and brace patterns over
either (``shards/{00000..00999}.tar``, ``{a,b}``), as WebDataset and img2dataset name shards.

Tars are streamed in one pass and images of an image folder read one object at a time. A ``save_to_disk``
folder is memory-mapped by ``datasets``, so on S3 it is copied once into ``$DWB_CACHE/datasets/<hash of the
URL and every object's ETag>/`` (as ``datasets`` itself does for a remote folder). Endpoints, credentials and
retries are boto3's (``S3_ENDPOINT_URL`` for an S3-compatible store).
"""
from __future__ import annotations

import hashlib
import io
import itertools
import os
import re
from pathlib import Path
from typing import BinaryIO, Iterable

from models.common import download_cache, s3_client, split_s3, whole_folder
from models.errors import WorkbenchError, first_line
from models.readers import outside_root, unsafe_name

_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}|\{([^{}]*,[^{}]*)\}")  # a range {000..099} or a choice {a,b}
# Names one pattern may expand to, counted before any is made: LAION-5B's img2dataset shards are about 230,000;
# {0..9999999}{0..9999999} would be 10^14 (expanded, it took every byte of memory).
MAX_EXPANDED = 1_000_000


class _NumberRange:
    """The zero-padded numbers lo..hi as a sequence, made one at a time."""

    def __init__(self, lo: int, hi: int, width: int):
        self.lo, self.hi, self.width = lo, hi, width

    def __len__(self) -> int:
        return self.hi - self.lo + 1

    def __iter__(self):
        return (f"{i:0{self.width}d}" for i in range(self.lo, self.hi + 1))


def _brace_parts(pattern: str) -> list[list[str]]:
    """``a{0..2}b{x,y}`` -> [[a], [0, 1, 2], [b], [x, y]]: the choices of each piece, left to right; a range
    counts up, zero-padded to the width of its first bound. Only counts are made here for a range."""
    parts, end = [], 0
    for m in _BRACE.finditer(pattern):
        parts.append([pattern[end:m.start()]])
        if m.group(3) is not None:
            parts.append(m.group(3).split(","))
        else:
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise WorkbenchError(f"{pattern}: the range {m.group(0)} must count up")
            parts.append(_NumberRange(lo, hi, len(m.group(1))))
        end = m.end()
    parts.append([pattern[end:]])
    return parts


def expand_braces(pattern: str, limit: int = MAX_EXPANDED) -> list[str]:
    """``a{000..002}b`` -> a000b a001b a002b (zero padding kept from the first bound); ``{x,y}`` -> x y. The
    names are counted first: a pattern of more than ``limit`` is refused before one is made."""
    parts = _brace_parts(pattern)
    count = 1
    for choices in parts:
        count *= len(choices)
        if count > limit:
            raise WorkbenchError(f"{pattern}: expands to more than {limit:,} names; split it into several patterns")
    return ["".join(names) for names in itertools.product(*parts)]


def is_remote(url: str) -> bool:
    return url.startswith("s3://")


def list_objects(url: str, below: bool = True) -> dict[str, dict]:
    """The objects under an ``s3://bucket/prefix`` (the prefix taken as a folder), by name relative to it
    (``a/b.jpg``), each with its ``size`` and ``etag``; only those directly in it when not ``below``."""
    bucket, prefix = split_s3(url)
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    extra = {} if below else {"Delimiter": "/"}
    try:
        pages = s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, **extra)
        return {o["Key"][len(prefix):]: {"size": o["Size"], "etag": o["ETag"].strip('"')}
                for page in pages for o in page.get("Contents", []) if not o["Key"].endswith("/")}
    except WorkbenchError:
        raise
    except Exception as e:  # noqa: BLE001 - botocore's many error types, as one line
        raise WorkbenchError(f"cannot list {url}: {first_line(e)}") from None


def walk_local(root: Path) -> tuple[list[str], list[str]]:
    """The files under a local folder (relative, ``/``-separated) that ``outside_root`` admits, and those it
    refuses; links (to files or folders) are never followed."""
    admitted, refused = [], []
    for folder, dirs, files in os.walk(root):
        where = Path(folder).relative_to(root)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            relative = (where / name).as_posix()
            if outside_root(root, relative):
                refused.append(relative)
            else:
                admitted.append(relative)
    return admitted, refused


def source_state(urls: Iterable[str], listings: dict[str, dict]) -> str:
    """A digest of the size and modification time (the ETag on S3) of each file or object: what a resumed
    conversion compares to tell a source that changed since it began; a missing one counts as such.
    ``listings`` keeps each S3 prefix's listing for the caller's next call (a pattern of 1,000 shards under one
    prefix is one listing, not 1,000 requests)."""
    lines = sorted(f"{url} {_state(url, listings)}" for url in urls)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def _state(url: str, listings: dict[str, dict]) -> str:
    if is_remote(url):
        prefix, _, name = url.rpartition("/")
        if prefix not in listings:
            listings[prefix] = list_objects(prefix, below=False)
        found = listings[prefix].get(name)
        return f"{found['size']} {found['etag']}" if found else "missing"
    try:
        st = os.stat(url)
    except OSError:
        return "missing"
    return f"{st.st_size} {st.st_mtime_ns}"


def exists(url: str) -> bool:
    if not is_remote(url):
        return Path(url).is_file()
    bucket, key = split_s3(url)
    try:
        s3_client().head_object(Bucket=bucket, Key=key)
        return True
    except WorkbenchError:
        raise
    except Exception:  # noqa: BLE001 - a 404 and a 403 alike: nothing to read there
        return False


def open_stream(url: str) -> BinaryIO:
    """A forward-only binary stream of a file or object (a tar is read in one pass, never whole in memory)."""
    if not is_remote(url):
        return open(url, "rb")
    bucket, key = split_s3(url)
    try:
        return s3_client().get_object(Bucket=bucket, Key=key)["Body"]
    except WorkbenchError:
        raise
    except Exception as e:  # noqa: BLE001
        raise WorkbenchError(f"cannot read {url}: {first_line(e)}") from None


def open_seekable(url: str):
    """A local path as is, or an object's bytes in memory (a Parquet footer needs seeking)."""
    if not is_remote(url):
        return url
    with open_stream(url) as body:
        return io.BytesIO(body.read())


def read_bounded(url: str, limit: int) -> bytes | None:
    """A file's or object's bytes, or None when it holds more than ``limit`` (never read past it)."""
    with open_stream(url) as stream:
        data = stream.read(limit + 1)
    return None if len(data) > limit else data


def local_copy(url: str) -> Path:
    """The local copy of every object under an ``s3://`` folder, downloaded once per set of ETags; made whole or
    not at all (``whole_folder``), so a killed download is never taken for a copy."""
    objects = list_objects(url)
    if not objects:
        raise WorkbenchError(f"{url} holds no objects")
    if unsafe := next((n for n in objects if unsafe_name(n)), None):
        raise WorkbenchError(f"{url}: refusing to copy the object {unsafe!r}: its name leads out of the folder")
    listing = "\n".join(f"{name} {o['etag']}" for name, o in sorted(objects.items()))
    folder = download_cache("datasets") / hashlib.sha256(f"{url}\n{listing}".encode()).hexdigest()[:24]
    if folder.is_dir():
        return folder
    bucket, prefix = split_s3(url.rstrip("/"))
    client = s3_client()
    try:
        with whole_folder(folder) as partial:
            for name in objects:
                (partial / name).parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, f"{prefix}/{name}" if prefix else name, str(partial / name))
    except OSError:  # another process finished the same copy first
        if not folder.is_dir():
            raise
    except WorkbenchError:
        raise
    except Exception as e:  # noqa: BLE001 - botocore's many error types, as one line
        raise WorkbenchError(f"cannot copy {url}: {first_line(e)}") from None
    return folder
