"""Shards written by the tools that write them in the wild: img2dataset's own sample writers (its
``webdataset``, ``files`` and ``parquet`` output, each with the metadata Parquet it writes beside) and
WebDataset's ``TarWriter``.

img2dataset is installed without its dependencies (requirements-nodeps.txt says why), so its package
``__init__`` (the downloader's fire, wandb, opencv) cannot be imported; its ``writer`` module needs only
fsspec, numpy, pyarrow and webdataset, and is loaded from the installed package by file path.
"""
from __future__ import annotations

import importlib.util
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from PIL import Image


def img2dataset_writers():
    spec = importlib.util.find_spec("img2dataset")
    assert spec is not None, "img2dataset is not installed (scripts/setup.sh installs requirements-nodeps.txt)"
    path = Path(spec.submodule_search_locations[0]) / "writer.py"
    module_spec = importlib.util.spec_from_file_location("img2dataset_writer", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@dataclass
class Row:
    """One row of a LAION-aesthetics subset as img2dataset reads it (url, caption, and the columns a recipe
    keeps with --save_additional_columns), and what its download gave."""
    caption: str
    aesthetic: float
    punsafe: float
    pwatermark: float
    language: str
    image: bytes | None  # None: the download failed


def jpeg(w: int, h: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def laion_rows(n: int, seed: int = 0) -> list[Row]:
    """``n`` rows with varied sizes and scores; every 7th download failed."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        w, h = int(rng.integers(200, 700)), int(rng.integers(200, 700))
        rows.append(Row(f"photo number {i} of a {['red', 'green', 'blue'][i % 3]} thing", round(float(rng.uniform(4, 8)), 3),
                        round(float(rng.uniform(0, 0.3)), 3), round(float(rng.uniform(0, 1)), 3),
                        ["en", "de", "fr"][i % 3], None if i % 7 == 6 else jpeg(w, h, seed * 1000 + i)))
    return rows


def _schema() -> pa.Schema:
    """img2dataset's writer schema: the input's columns, then the ones its downloader appends."""
    base = pa.schema([("url", pa.string()), ("caption", pa.string()), ("AESTHETIC_SCORE", pa.float64()),
                      ("punsafe", pa.float64()), ("pwatermark", pa.float64()), ("LANGUAGE", pa.string())])
    for name, kind in (("key", pa.string()), ("status", pa.string()), ("error_message", pa.string()),
                       ("width", pa.int32()), ("height", pa.int32()), ("original_width", pa.int32()),
                       ("original_height", pa.int32()), ("sha256", pa.string())):
        base = base.append(pa.field(name, kind))
    return base


def write_img2dataset(out: Path, rows: list[Row], output_format: str, per_shard: int = 10) -> Path:
    """``rows`` as img2dataset's ``output_format`` writer (webdataset, files, parquet) writes them: shards of
    ``per_shard`` rows, keys of shard id and row index as its downloader computes them."""
    import hashlib

    writers = img2dataset_writers()
    cls = {"webdataset": writers.WebDatasetSampleWriter, "files": writers.FilesSampleWriter,
           "parquet": writers.ParquetSampleWriter}[output_format]
    out.mkdir(parents=True, exist_ok=True)
    for shard_id, start in enumerate(range(0, len(rows), per_shard)):
        writer = cls(shard_id, str(out), True, 5, _schema(), "jpg")
        for i, row in enumerate(rows[start:start + per_shard]):
            key = f"{shard_id:05d}{i:04d}"
            size = Image.open(io.BytesIO(row.image)).size if row.image else (None, None)
            meta = {"url": f"https://example.com/{start + i}.jpg", "caption": row.caption,
                    "AESTHETIC_SCORE": row.aesthetic, "punsafe": row.punsafe, "pwatermark": row.pwatermark,
                    "LANGUAGE": row.language, "key": key, "status": "success" if row.image else "failed_to_download",
                    "error_message": None if row.image else "HTTP Error 404: Not Found",
                    "width": size[0], "height": size[1], "original_width": size[0], "original_height": size[1],
                    "sha256": hashlib.sha256(row.image).hexdigest() if row.image else None}
            writer.write(row.image, key, row.caption, meta)
        writer.close()
    return out
