"""`dwb data convert` against its own floor, on img2dataset webdataset shards (written by img2dataset's
writer): images per second per core next to a bare one-core PIL loop that decodes, resizes (once per
bucket, largest first) and JPEG-encodes the same images (the work's floor); 2 workers against 1; peak
resident memory at 1x and 10x the shards; and a run killed with SIGKILL half-way, then repeated.

Targets: convert at 1 worker >= 0.8 of the bare loop; 2 workers >= 1.7x 1 worker on 2 cores; peak RSS at 10x
within 10% of 1x; the repeated run writes the samples of an uninterrupted one. Timings are side by side in
one run (the CPU is shared: ratios, not absolute figures, are what carries).

    python bench/convert_throughput.py [--shards 8 --per-shard 400 --memory-per-shard 50 --grow 10]
    python bench/convert_throughput.py --smoke
"""
from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import resource
import shutil
import signal
import sys
import time
from pathlib import Path

from _common import RUN, parse_args, report

BUCKETS = (256, 512)


def photo_like_jpeg(seed: int) -> bytes:
    """A 480-800 px JPEG with a photo's spectrum (smooth regions and edges, not pure noise)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = int(rng.integers(480, 800)), int(rng.integers(480, 800))
    coarse = Image.fromarray(rng.integers(0, 256, (h // 16, w // 16, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
    detail = rng.normal(0, 12, (h, w, 3))
    pixels = np.clip(np.asarray(coarse, dtype=np.float32) + detail, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def build_shards(folder: Path, shards: int, per_shard: int) -> list[bytes]:
    """img2dataset's webdataset output (its own writer); returns the images, for the bare loop."""
    from tests.train.shard_writers import Row, write_img2dataset

    rows = [Row(f"photo {i}", 6.0, 0.01, 0.1, "en", photo_like_jpeg(i)) for i in range(shards * per_shard)]
    if not folder.exists():
        write_img2dataset(folder, rows, "webdataset", per_shard=per_shard)
    return [r.image for r in rows]


def bare_loop(images: list[bytes]) -> tuple[float, float]:
    """Images per second of decode (with draft), resize per bucket (largest first, Lanczos) and JPEG encode,
    and CPU seconds per image."""
    from PIL import Image

    start, cpu = time.perf_counter(), time.process_time()
    for data in images:
        with Image.open(io.BytesIO(data)) as img:
            side = min(img.size)
            img.draft(None, (img.width * 2 * max(BUCKETS) // side, img.height * 2 * max(BUCKETS) // side))
            img = img.convert("RGB")
        w, h = img.size
        for bucket in sorted(BUCKETS, reverse=True):
            img = img.resize((round(w * bucket / min(w, h)), round(h * bucket / min(w, h))), Image.LANCZOS)
            img.save(io.BytesIO(), format="JPEG")
    return len(images) / (time.perf_counter() - start), (time.process_time() - cpu) / len(images)


def _bare_loop_child(images: list[bytes], queue) -> None:
    queue.put(bare_loop(images)[0])


def machine_ceiling(images: list[bytes]) -> float:
    """What the machine gives two copies of the bare loop side by side: their images per second together over
    one copy's (the most 2 workers could reach)."""
    fork = multiprocessing.get_context("fork")
    rates = []
    for copies_ in (1, 2):
        queue = fork.Queue()
        children = [fork.Process(target=_bare_loop_child, args=(images, queue)) for _ in range(copies_)]
        start = time.perf_counter()
        for child in children:
            child.start()
        for _ in children:
            queue.get()
        for child in children:
            child.join()
        rates.append(copies_ * len(images) / (time.perf_counter() - start))
    return rates[1] / rates[0]


def _convert_child(src: Path, out: Path, workers: int, queue) -> None:
    from train.data import convert_to_mds

    start, cpu = time.perf_counter(), _cpu_seconds()
    summary = convert_to_mds(src, out, buckets=BUCKETS, workers=workers, progress=False)
    seconds = time.perf_counter() - start
    _stop_fork_server()
    cpu = _cpu_seconds() - cpu
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    queue.put((summary.converted, seconds, peak / 1024, cpu))


CPU: dict[str, float] = {}


def _stop_fork_server() -> None:
    """The pool's workers are children of conversion's fork server, which reaps them: its CPU time and peak
    memory count here (RUSAGE_CHILDREN) once it has stopped too. ``_stop`` is the standard library's own way
    (its tests use it); the server would otherwise run until this process ends."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


def _cpu_seconds() -> float:
    """CPU time of this process and its finished descendants (the fork server and the pool's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def convert(src: Path, out: Path, workers: int, fresh: bool = True) -> tuple[int, float, float]:
    """(images converted, seconds, peak RSS of the largest of its processes in MiB), in a fresh process that
    imports what it needs, as `dwb data convert` does: at 1 worker Streaming is imported by the converting
    process, at 2 by the workers' fork server (a fork of a process that had imported it already would give the
    1-worker run its 6-10 s of imports for free)."""
    if fresh:
        shutil.rmtree(out, ignore_errors=True)
    context = multiprocessing.get_context("fork" if RUN.smoke else "spawn")  # a smoke run checks, it times nothing
    queue = context.Queue()
    child = context.Process(target=_convert_child, args=(src, out, workers, queue))
    child.start()
    converted, seconds, peak, cpu = queue.get()
    child.join()
    CPU[out.name] = cpu
    return converted, seconds, peak


def copies(src: Path, folder: Path, times: int) -> Path:
    """``times`` copies of every shard (and the Parquet beside it) under new names: the input grown ``times``-fold."""
    if not folder.exists():
        folder.mkdir(parents=True)
        for k in range(times):
            for f in sorted(src.iterdir()):
                shutil.copyfile(f, folder / f"{k:03d}{f.name}")
    return folder


def checking_workers() -> int:
    """Workers of the memory and resume checks: 2, as the default on this machine; 1 in a smoke run, which
    then starts one fork server fewer per check (each imports Streaming: 6-10 s)."""
    return 1 if RUN.smoke else 2


def _convert_to_be_killed(src: Path, out: Path) -> None:
    from train.data import convert_to_mds

    convert_to_mds(src, out, buckets=BUCKETS, workers=2, progress=False)


def kill_and_resume(src: Path, out: Path) -> dict:
    """SIGKILL a conversion half-way through its units, run it again: the samples of an uninterrupted run?
    (A forked process running what `dwb data convert` runs; the test suite kills a real `dwb` process.)"""
    from streaming import LocalDataset

    shutil.rmtree(out, ignore_errors=True)
    units = len(list(src.glob("*.tar")))
    fork = multiprocessing.get_context("fork")
    run = fork.Process(target=_convert_to_be_killed, args=(src, out / "resumed"))
    run.start()
    done = out / "resumed" / ".convert" / "done"
    while run.is_alive() and len(list(done.glob("*.json")) if done.is_dir() else []) < units // 2:
        time.sleep(0.005)
    os.kill(run.pid, signal.SIGKILL)
    run.join()
    kept = len(list(done.glob("*.json")))
    _, resumed_s, _ = convert(src, out / "resumed", checking_workers(), fresh=False)
    _, whole_s, _ = convert(src, out / "whole", checking_workers())

    def content(folder: Path) -> list:
        ds = LocalDataset(local=str(folder))
        return [(ds[i]["caption"], ds[i]["image"].tobytes()) for i in range(ds.num_samples)]

    same = all(content(out / "resumed" / str(b)) == content(out / "whole" / str(b)) for b in BUCKETS)
    return {"killed": run.exitcode == -signal.SIGKILL, "units": units, "units_done_when_killed": kept,
            "rerun_seconds": round(resumed_s, 2), "uninterrupted_seconds": round(whole_s, 2),
            "same_samples_and_order": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--per-shard", type=int, default=400, help="images per shard for the throughput figures: a "
                    "conversion starts with 6-10 s of imports (Streaming imports torch and transformers), so a "
                    "small input measures the start, not the rate")
    ap.add_argument("--memory-per-shard", type=int, default=50, help="images per shard of the memory and "
                    "kill-and-resume checks")
    ap.add_argument("--grow", type=int, default=10, help="the memory check's larger input, in copies of its shards")
    args = parse_args(ap, smoke={"shards": 2, "per_shard": 8, "memory_per_shard": 8, "grow": 2})
    src = RUN.out / f"convert-shards-{args.shards}x{args.per_shard}"
    images = build_shards(src, args.shards, args.per_shard)

    bare, bare_cpu = bare_loop(images)
    ceiling = machine_ceiling(images[:400])
    n1, s1, rss1 = convert(src, RUN.out / "convert-w1", 1)
    n2, s2, rss2 = convert(src, RUN.out / "convert-w2", 2)
    small = RUN.out / f"convert-shards-{args.shards}x{args.memory_per_shard}"
    n_small = len(build_shards(small, args.shards, args.memory_per_shard))
    _, _, rss_small = convert(small, RUN.out / "convert-small", checking_workers())
    grown = copies(small, RUN.out / f"convert-shards-{args.shards}x{args.memory_per_shard}-x{args.grow}", args.grow)
    ng, sg, rssg = convert(grown, RUN.out / "convert-grown", checking_workers())
    resume = kill_and_resume(small, RUN.out / "convert-resume")
    ok = (n1 == n2 == len(images) and ng == args.grow * n_small and resume["same_samples_and_order"]
          and resume["killed"])
    report("convert_throughput", {
        "command": " ".join(sys.argv), "images": len(images), "buckets": list(BUCKETS),
        "bare_loop_images_per_s_one_core": round(bare, 1),
        "convert_1_worker_images_per_s": round(n1 / s1, 1),
        "convert_2_workers_images_per_s": round(n2 / s2, 1),
        "per_core_vs_bare_loop": round(n1 / s1 / bare, 3),
        "per_cpu_second_vs_bare_loop": round(bare_cpu / (CPU["convert-w1"] / n1), 3),
        "speedup_2_vs_1_workers": round(s1 / s2, 3),
        "machine_ceiling_2_bare_loops_vs_1": round(ceiling, 3),
        "bare_loop_cpu_seconds_per_image": round(bare_cpu, 4),
        "cpu_seconds_per_image_1_vs_2_workers": [round(CPU["convert-w1"] / n1, 4), round(CPU["convert-w2"] / n2, 4)],
        "cores_busy_on_average_1_vs_2_workers": [round(CPU["convert-w1"] / s1, 2), round(CPU["convert-w2"] / s2, 2)],
        "load_average_at_end": [round(x, 1) for x in os.getloadavg()],
        "memory_check_images_1x": n_small,
        "peak_rss_mib_1x": round(rss_small, 1), f"peak_rss_mib_{args.grow}x": round(rssg, 1),
        "peak_rss_growth": round(rssg / rss_small - 1, 3),
        "kill_and_resume": resume, "checks_pass": ok,
    })
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
