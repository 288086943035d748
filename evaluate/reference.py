"""Reference sets (an MDS folder or an image folder) and their cached feature statistics.

Statistics are computed once per (set, resize policy, extractor, weights hash) and cached as a
``torch.save`` file of plain tensors, read back with ``weights_only=True``. Unreadable images are
skipped and counted; a set smaller than requested is an error unless ``allow_fewer``.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from PIL import Image
from tqdm import tqdm

from models.errors import WorkbenchError
from models.common import torch_save_whole

from .scorers.features import FeatureExtractor, prepare_image, resize_policy, to_batch
from .statistics.metrics import FeatureStats, FrechetReference

log = logging.getLogger("evaluate.reference")
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
RESERVOIR_SEED = 0


def _is_mds(path: Path) -> bool:
    return (path / "index.json").is_file()


def _image_files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)


def _check(path: Path) -> None:
    if not path.is_dir():
        raise WorkbenchError(f"reference set not found: {path} (give an MDS folder or an image folder)")


def count_images(path: str | Path) -> int:
    """How many images a reference set holds (an MDS index's sample count, or image files), without reading them."""
    path = Path(path)
    _check(path)
    if _is_mds(path):
        from models.datasets import count_samples

        try:
            return count_samples(path)  # the index checked against its shards
        except WorkbenchError as e:
            raise WorkbenchError(f"reference set {path}: {e}") from None
    return len(_image_files(path))


def check_reference_size(path: str | Path, n: int, allow_fewer: bool = False) -> None:
    """A set smaller than ``n`` stops scoring before any checkpoint is opened (unless ``allow_fewer``)."""
    have = count_images(path)
    if have < n and not allow_fewer:
        raise WorkbenchError(f"reference set {path} has {have} images, fewer than the {n} requested; lower "
                             f"--n-reference or pass --allow-fewer-reference")
    if have < 2:
        raise WorkbenchError(f"reference set {path} has {have} images; FID needs at least 2")


def iter_captions(path: str | Path, limit: int | None = None) -> Iterator[str]:
    path = Path(path)
    _check(path)
    n = 0
    if _is_mds(path):
        from models.datasets import open_local

        ds = open_local(path)
        for i in range(len(ds)):
            if limit and n >= limit:
                return
            yield ds.get_item(i)["caption"]
            n += 1
        return
    for img in _image_files(path):
        if limit and n >= limit:
            return
        txt = img.with_suffix(".txt")
        if txt.is_file():
            yield txt.read_text().strip()
            n += 1


def iter_images(path: str | Path, size: int, limit: int | None = None) -> Iterator[np.ndarray | None]:
    """(size, size, 3) uint8 per image in the set's order, ``None`` for one that cannot be read."""
    path = Path(path)
    _check(path)
    if _is_mds(path):
        from models.datasets import open_local

        ds = open_local(path)
        for i in range(min(len(ds), limit) if limit else len(ds)):
            try:
                yield prepare_image(ds.get_item(i)["image"], size)
            except Exception as e:  # noqa: BLE001 - a damaged sample is skipped and counted
                log.debug("skipping sample %d of %s: %s", i, path, e)
                yield None
        return
    files = _image_files(path)
    for f in files[:limit] if limit else files:
        try:
            with Image.open(f) as im:
                yield prepare_image(im, size)
        except Exception as e:  # noqa: BLE001
            log.debug("skipping %s: %s", f, e)
            yield None


@dataclass
class ReferenceStats:
    stats: FeatureStats
    skipped: int
    key: str
    cached: bool
    path: Path | None = None  # the cache file

    @cached_property
    def frechet(self) -> FrechetReference:
        """The mean, covariance and covariance square root every Frechet distance against this set reuses."""
        return FrechetReference.from_stats(self.stats)


def set_fingerprint(path: Path) -> str:
    """Identity of a set's content: its MDS index, or its files' names, sizes and mtimes."""
    h = hashlib.sha256(str(path.resolve()).encode())
    if _is_mds(path):
        h.update((path / "index.json").read_bytes())
    else:
        for f in _image_files(path):
            st = f.stat()
            h.update(f"{f.relative_to(path)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _check_count(path: Path, found: int, n: int, skipped: int, allow_fewer: bool) -> None:
    if found < n and not allow_fewer:
        raise WorkbenchError(f"reference set {path} has {found} readable images, fewer than the {n} requested "
                             f"({skipped} unreadable); lower --n-reference")
    if found < 2:
        raise WorkbenchError(f"reference set {path} has {found} readable images; FID needs at least 2")


def reference_stats(path: str | Path, extractor: FeatureExtractor, size: int, n: int, cache_dir: str | Path,
                    batch_size: int = 32, allow_fewer: bool = False, kid_max: int = 10000,
                    progress: bool = True) -> ReferenceStats:
    """Feature statistics of the first ``n`` readable images of a reference set, cached on disk."""
    path = Path(path)
    _check(path)
    # every setting that changes what is kept: the set, how many images, how each is resized and embedded,
    # and the KID/CMMD sample (its size and its reservoir's seed); not the batch size or device, which
    # change features only by float rounding
    meta = {"set": set_fingerprint(path), "n": n, "resize": resize_policy(size), "extractor": extractor.name,
            "weights": extractor.weights_hash, "kid_max": kid_max, "reservoir_seed": RESERVOIR_SEED}
    key = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]
    cache = Path(cache_dir) / f"ref-{key}.pt"
    if cache.is_file():
        state = torch.load(cache, map_location="cpu", weights_only=True)
        stats, skipped = FeatureStats.from_state_dict(state, kid_max), int(state["skipped"])
        _check_count(path, stats.n, n, skipped, allow_fewer)  # a cache written under --allow-fewer-reference
        return ReferenceStats(stats, skipped, key, True, cache)

    stats, skipped, batch = FeatureStats(extractor.dim, kid_max=kid_max, seed=RESERVOIR_SEED), 0, []
    bar = tqdm(total=n, desc=f"reference {path.name}", unit="img", disable=not progress)
    for image in iter_images(path, size):
        if stats.n + len(batch) >= n:
            break
        if image is None:
            skipped += 1
            continue
        batch.append(image)
        if len(batch) == batch_size:
            stats.update(extractor(to_batch(batch)))
            bar.update(len(batch))
            batch = []
    if batch:
        stats.update(extractor(to_batch(batch)))
        bar.update(len(batch))
    bar.close()
    if skipped:
        log.warning("warning: skipped %d unreadable image(s) in %s", skipped, path)
    _check_count(path, stats.n, n, skipped, allow_fewer)
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch_save_whole({**stats.state_dict(), "skipped": skipped, "meta": json.dumps(meta)}, cache)
    return ReferenceStats(stats, skipped, key, False, cache)
