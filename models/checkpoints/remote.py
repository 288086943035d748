"""Composer checkpoints in object storage (``s3://bucket/key``), fetched once into a local cache.

At scale training saves to S3; scoring and sampling read from there. An object is downloaded into
``$DWB_CACHE`` (default ``~/.cache/diffusion-workbench``) ``/checkpoints/<hash of URI and ETag>/<name>``:
the same object is never downloaded twice, and a rewritten object (a new ETag) is a new entry. The
download goes to a temporary name in that folder and is renamed when whole, so a crash never leaves a
half file where a whole one is expected. Endpoints, credentials and retries are boto3's
(``S3_ENDPOINT_URL`` for an S3-compatible store, as Composer and Streaming read it).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath

from ..common import download_cache, s3_client, split_s3
from ..errors import CheckpointError, WorkbenchError, first_line
from .names import Checkpoint, file_label, in_run_listing, step_in_name


def _split(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise WorkbenchError(f"{uri}: only s3:// URIs are read (give a local path, a hub id or s3://bucket/key)")
    return split_s3(uri)


def uri_label(uri: str) -> str:
    """``<run>/<stem>`` of ``s3://bucket/<run>/checkpoints/<name>`` (``#etag`` optional), as for a local file."""
    return file_label(PurePosixPath(_split(uri.partition("#")[0])[1]))


def _remote_error(uri: str, e: Exception) -> WorkbenchError:
    code = getattr(e, "response", {}).get("Error", {}).get("Code", "") if hasattr(e, "response") else ""
    if code in ("NoSuchKey", "404", "NoSuchBucket"):
        return CheckpointError(f"checkpoint not found: {uri}")
    first = first_line(e)
    return WorkbenchError(f"cannot read {uri}: {first}")


def list_remote(uri: str) -> list[Checkpoint]:
    """The checkpoints under an ``s3://`` prefix (``RUN`` or ``RUN/checkpoints``), by the step in their names.

    Nothing is downloaded: each comes with its ETag in ``ref`` (``uri#etag``) so a watcher knows a new
    object from one it has seen.
    """
    bucket, prefix = _split(uri.rstrip("/"))
    s3 = s3_client()
    objects = []
    for base in (f"{prefix}/checkpoints/", f"{prefix}/") if prefix else ("",):
        try:
            pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base, Delimiter="/")
            objects = [o for page in pages for o in page.get("Contents", [])]
        except Exception as e:  # noqa: BLE001 - botocore's many error types, as one line
            raise _remote_error(uri, e) from None
        if objects:
            break
    found = []
    for o in objects:
        name = PurePosixPath(o["Key"]).name
        if in_run_listing(name):
            found.append(Checkpoint(f"s3://{bucket}/{o['Key']}#{o['ETag'].strip(chr(34))}", "composer",
                                    file_label(PurePosixPath(o["Key"])), None, step_in_name(name)))
    return sorted(found, key=lambda c: (c.step if c.step is not None else -1, c.ref))


def fetch(uri: str) -> Path:
    """The local copy of ``s3://bucket/key`` (``#etag`` optional), downloaded once per ETag."""
    uri, _, etag = uri.partition("#")
    bucket, key = _split(uri)
    s3 = s3_client()
    if not etag:
        try:
            etag = s3.head_object(Bucket=bucket, Key=key)["ETag"].strip('"')
        except Exception as e:  # noqa: BLE001
            raise _remote_error(uri, e) from None
    folder = download_cache("checkpoints") / hashlib.sha256(f"{uri}\n{etag}".encode()).hexdigest()[:24]
    local = folder / PurePosixPath(key).name
    if local.is_file():
        return local
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / (local.name + f".part-{os.getpid()}")
    try:
        s3.download_file(bucket, key, str(partial))
        partial.replace(local)
    except Exception as e:  # noqa: BLE001
        partial.unlink(missing_ok=True)
        raise _remote_error(uri, e) from None
    return local

