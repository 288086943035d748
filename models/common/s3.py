"""S3 (and S3-compatible stores): a URL's bucket and key, a client that says in one line what it lacks, and the
local cache of what is downloaded."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import WorkbenchError


def download_cache(kind: str) -> Path:
    """Where downloads from object storage are kept: ``$DWB_CACHE`` (default ``~/.cache/diffusion-workbench``)
    ``/<kind>`` (``checkpoints``, ``datasets``)."""
    return Path(os.environ.get("DWB_CACHE", Path.home() / ".cache" / "diffusion-workbench")) / kind


def split_s3(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key)."""
    bucket, _, key = url[len("s3://"):].partition("/")
    if not bucket:
        raise WorkbenchError(f"{url}: no bucket in the URL")
    return bucket, key


def s3_client():
    """A boto3 client of ``S3_ENDPOINT_URL`` (AWS without it); no credentials is a one-line error."""
    import boto3

    if boto3.session.Session().get_credentials() is None:
        raise WorkbenchError("reading s3:// needs S3 credentials, and none were found (set AWS_ACCESS_KEY_ID and "
                             "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE; S3_ENDPOINT_URL for an S3-compatible store)")
    return boto3.client("s3", endpoint_url=os.environ.get("S3_ENDPOINT_URL") or None)
