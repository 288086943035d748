"""`dwb data convert --aspect-buckets` against the square conversion, on the same img2dataset webdataset shards
of photo-like JPEGs of mixed aspect ratios: the bucket report (images per bucket, area cropped) and images per
second of the whole command, each run a fresh `dwb` process at 1 worker, the two alternating (the CPU is
shared: the ratio carries, not the absolute figures).

    python bench/convert_aspect.py [--images 2400 --rounds 2]
    python bench/convert_aspect.py --smoke
"""
from __future__ import annotations

import argparse
import io
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, RUN, parse_args, report

BUDGETS = "256,512"
# Width:height of the images, with how often each comes: photos (4:3, 3:2), screens (16:9), squares, portraits
# and a few panoramas and tall crops, as in web-scraped sets.
RATIOS = ((1.0, 4), (4 / 3, 5), (3 / 2, 4), (16 / 9, 3), (3 / 4, 3), (2 / 3, 3), (9 / 16, 2), (2.0, 1),
          (1 / 2, 1), (2.5, 1))


def photo_like_jpeg(seed: int) -> bytes:
    """A JPEG of 512-900 px on its shorter side and one of RATIOS, with a photo's spectrum."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    ratios, weights = zip(*RATIOS)
    ratio = ratios[rng.choice(len(ratios), p=np.array(weights) / sum(weights))]
    short = int(rng.integers(512, 900))
    w, h = (round(short * ratio), short) if ratio >= 1 else (short, round(short / ratio))
    coarse = Image.fromarray(rng.integers(0, 256, (h // 16, w // 16, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
    pixels = np.clip(np.asarray(coarse, dtype=np.float32) + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def build_shards(folder: Path, images: int, per_shard: int) -> None:
    from tests.train.shard_writers import Row, write_img2dataset

    if not folder.exists():
        rows = [Row(f"photo {i}", 6.0, 0.01, 0.1, "en", photo_like_jpeg(i)) for i in range(images)]
        write_img2dataset(folder, rows, "webdataset", per_shard=per_shard)


def convert(src: Path, out: Path, aspect: bool) -> tuple[float, float, str]:
    """Images per second and CPU seconds of one `dwb data convert` process, and its summary line."""
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "dwb", "data", "convert", str(src), str(out), "--buckets", BUDGETS,
               "--workers", "1", *(["--aspect-buckets"] if aspect else [])]
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    line = done.stdout.strip().splitlines()[-1]
    seen = int(line.split(" of ")[1].split()[0])
    return seen / wall, cpu / seen, line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=2400)
    ap.add_argument("--per-shard", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=2)
    args = parse_args(ap, {"images": 40, "per_shard": 20, "rounds": 1})
    src = RUN.out / f"aspect-shards-{args.images}"
    build_shards(src, args.images, args.per_shard)
    runs = {False: [], True: []}
    for _ in range(args.rounds):
        for aspect in (False, True):
            runs[aspect].append(convert(src, RUN.out / "aspect-out", aspect))
    square, aspect = max(r[0] for r in runs[False]), max(r[0] for r in runs[True])
    report("convert_aspect", {
        "images": args.images, "budgets": BUDGETS, "rounds": args.rounds,
        "square_images_per_s": [round(r[0], 1) for r in runs[False]],
        "aspect_images_per_s": [round(r[0], 1) for r in runs[True]],
        "aspect_vs_square_best": round(aspect / square, 3),
        "cpu_s_per_image_square_aspect": [round(min(r[1] for r in runs[k]), 4) for k in (False, True)],
        "square_line": runs[False][-1][2], "aspect_line": runs[True][-1][2]})


if __name__ == "__main__":
    main()
