"""Hugging Face hub ids (``org/name``, ``org/name@revision``) as checkpoints: the local snapshot of a pipeline.

Offline (``HF_HUB_OFFLINE=1`` or ``allow_download=False``) only the local cache is read, found the way
huggingface_hub finds it (``HF_HUB_CACHE``, else ``HF_HOME/hub``); the revision (default ``main``) is
a branch or tag resolved through the cache's ``refs/``, or a commit hash. Online, only the files a
diffusers pipeline needs are downloaded (configs, tokenizer, safetensors weights), never the
repository's other checkpoints.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import CheckpointError, first_line

# The hub's names: letters, digits, "-", "_", "." (no "--" or "..", not at either end), 96 characters at most.
_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?"
_REVISION = r"[A-Za-z0-9_](?:[A-Za-z0-9._/-]*[A-Za-z0-9_])?"  # branch, tag, commit or refs/pr/N
HUB_ID = re.compile(rf"(?P<repo>{_NAME}/{_NAME})(?:@(?P<revision>{_REVISION}))?")
# A missing local checkpoint file must read as "not found", not as a hub id nobody meant.
_FILE_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors", ".bin", ".yaml", ".json")
# What a diffusers pipeline reads: model_index.json, each part's config, the tokenizer's files, the weights.
_SMALL_FILES = (".json", ".txt")


def _parse(ref: str) -> tuple[str, str | None] | None:
    m = HUB_ID.fullmatch(ref)
    if m is None or len(m["repo"]) > 96 or "--" in m["repo"] or ".." in ref:
        return None
    return m["repo"], m["revision"]


def is_hub_id(ref: str) -> bool:
    """The project's one rule for "is this a hub id": not an existing local path, and ``org/name`` or
    ``org/name@revision`` in the characters the hub allows (a name ending in a checkpoint file's suffix
    is taken for a missing local file)."""
    return not os.path.lexists(str(ref)) and written_as_hub_id(ref)


def written_as_hub_id(ref: str) -> bool:
    """``is_hub_id`` from the text alone, the file system left out (a server's answers must not depend on it)."""
    ref = str(ref)
    return _parse(ref) is not None and not ref.split("@")[0].lower().endswith(_FILE_SUFFIXES)


def hub_label(ref: str) -> str:
    """The id as the user wrote it (``org/name``, ``org/name@rev``), never the snapshot's hash."""
    if not is_hub_id(ref):
        raise CheckpointError(f"{ref!r} is not a Hugging Face hub id (org/name or org/name@revision)")
    return str(ref)


def hub_cache() -> Path:
    """The hub cache folder, read from the environment now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set to 1/on/yes/true, as huggingface_hub reads it."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in {"1", "ON", "YES", "TRUE"}


def pipeline_files(repo_files: list[str]) -> list[str]:
    """The files of a hub repository a diffusers pipeline needs, from its file list.

    Small files (model_index.json, configs, tokenizer vocabulary and merges) and each part's
    safetensors weights, full precision where the part has them and the ``fp16`` variant only where
    it has nothing else. Files at the top level other than JSON (the original single-file checkpoints
    many pipeline repositories also hold, gigabytes each) and ``.bin``/``.ckpt``/ONNX/Flax weights
    are left out.
    """
    chosen = [f for f in repo_files if f.endswith(_SMALL_FILES) and ("/" in f or f.endswith(".json"))]
    weights = [f for f in repo_files if f.endswith(".safetensors") and f.count("/") == 1]
    for part in sorted({f.split("/")[0] for f in weights}):
        files = [f for f in weights if f.startswith(part + "/")]
        full = [f for f in files if ".fp16." not in f.rsplit("/", 1)[1]]
        chosen += full or files
    return sorted(chosen)


def _missing_offline(repo: str, revision: str | None, cache: Path) -> CheckpointError:
    ref = f"{repo}@{revision}" if revision else repo
    download = (f"huggingface-cli download {repo}" + (f" --revision {revision}" if revision else "")
                + ' --include "*.json" "*.txt" "*/*.safetensors"')
    remedy = "or unset HF_HUB_OFFLINE" if hub_offline() else "or allow downloads"
    return CheckpointError(f"{ref} is not in the Hugging Face cache {cache} and downloads are off: "
                           f"run `{download}` where the hub can be reached, {remedy}")


def resolve_hub(ref: str, *, allow_download: bool) -> Path:
    """The local snapshot folder (diffusers layout) of a hub id at its revision (default ``main``)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    parsed = _parse(str(ref)) if is_hub_id(ref) else None
    if parsed is None:
        raise CheckpointError(f"{ref!r} is not a Hugging Face hub id (org/name or org/name@revision)")
    repo, revision = parsed
    cache = hub_cache()
    offline = hub_offline() or not allow_download
    try:
        if offline:
            folder = snapshot_download(repo, revision=revision, cache_dir=cache, local_files_only=True)
        else:
            folder = _download(repo, revision, cache)
    except LocalEntryNotFoundError:
        raise _missing_offline(repo, revision, cache) from None
    except Exception as e:  # not on the hub, gated, no such revision, hub unreachable
        first = first_line(e)
        raise CheckpointError(f"cannot get {ref} from the Hugging Face hub: {first}") from None
    folder = Path(folder)
    if not (folder / "model_index.json").is_file():
        raise CheckpointError(f"{ref} ({folder}) is not a diffusers pipeline (no model_index.json): "
                              "only pipelines open by hub id")
    return folder


def _download(repo: str, revision: str | None, cache: Path) -> str:
    from huggingface_hub import HfApi, snapshot_download

    files = HfApi().list_repo_files(repo, revision=revision)
    return snapshot_download(repo, revision=revision, cache_dir=cache, allow_patterns=pipeline_files(files))
