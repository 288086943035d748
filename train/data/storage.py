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
import re
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ..common import download_cache, s3_client, split_s3, whole_folder
from ..errors import WorkbenchError, first_line

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_CHOICE = re.compile(r"\{([^{}]*,[^{}]*)\}")
MAX_EXPANDED = 10_000_000  # names one pattern may expand to: a typo such as {0..99999999999} fails at once


def expand_braces(pattern: str) -> list[str]:
    """``a{000..002}b`` -> a000b a001b a002b (zero padding kept from the first bound); ``{x,y}`` -> x y."""
    if m := _RANGE.search(pattern):
        lo, hi = int(m.group(1)), int(m.group(2))
        if hi < lo or hi - lo >= MAX_EXPANDED:
            raise WorkbenchError(f"{pattern}: the range {m.group(0)} must count up, by at most {MAX_EXPANDED:,} names")
        width = len(m.group(1))
        heads = [f"{pattern[:m.start()]}{i:0{width}d}" for i in range(lo, hi + 1)]
        return [head + tail for head in heads for tail in expand_braces(pattern[m.end():])]
    if m := _CHOICE.search(pattern):
        return [name for choice in m.group(1).split(",")
                for name in expand_braces(pattern[:m.start()] + choice + pattern[m.end():])]
    return [pattern]


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


def unsafe_name(name: str) -> bool:
    """A file name from elsewhere (a tar member, an object key) that leads out of its folder: absolute, with a
    ``..`` part, a backslash or a NUL."""
    path = PurePosixPath(name)
    return path.is_absolute() or ".." in path.parts or "\\" in name or "\x00" in name


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
