"""Shared set-up for the benchmarks: the options every script has (--smoke, --out), a shapes dataset,
tiny components and a tiny checkpoint built once in the output folder, and the JSON report."""
from __future__ import annotations

import argparse
import atexit
import fcntl
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SMOKE_IMAGES = 256  # shapes samples of a smoke run's dataset: more than any smoke run reads (a second to write)


@dataclass
class Run:
    """Where this run builds and writes its files, and whether it is a smoke run."""
    out: Path = ROOT / "bench" / "out"
    smoke: bool = False


RUN = Run()


def parse_args(ap: argparse.ArgumentParser, smoke: dict) -> argparse.Namespace:
    """``ap``'s options plus --smoke and --out. With --smoke, ``smoke`` replaces ``ap``'s defaults (an option
    given on the command line still wins), the data is small, and the folder is a new temporary one."""
    ap.add_argument("--smoke", action="store_true",
                    help="a short run on the tiny model and small data: checks that the script runs end to end "
                         "and that its equality checks hold (its figures mean nothing); exit status 1 if not")
    ap.add_argument("--out", type=Path, help="folder for the data, checkpoints and results it builds (default "
                                             "bench/out; with --smoke a temporary folder, removed at exit)")
    if ap.parse_known_args()[0].smoke:
        ap.set_defaults(**smoke)
    args = ap.parse_args()
    RUN.smoke = args.smoke
    if args.smoke:
        # One thread in this process and its children: on 2 cores shared with other work (load average 7)
        # composer_overhead's smoke run took 131 s with torch's 2 threads and 30 s with 1.
        os.environ["OMP_NUM_THREADS"] = "1"
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)
    if args.out is not None:
        RUN.out = args.out.resolve()
    elif args.smoke:
        RUN.out = Path(tempfile.mkdtemp(prefix="dwb-bench-smoke-"))
        atexit.register(shutil.rmtree, RUN.out, ignore_errors=True)
    RUN.out.mkdir(parents=True, exist_ok=True)
    return args


@contextmanager
def building():
    """Hold the output folder's build lock, so that benchmarks run side by side on one folder build each
    shared file once (the others wait for it, then reuse it)."""
    with open(RUN.out / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def fixtures(n: int = 4096, vae_steps: int = 20) -> tuple[Path, Path]:
    """(shapes dataset, tiny components); the VAE's quality does not matter for timing. A smoke run
    builds ``SMOKE_IMAGES`` samples and a VAE of 3 steps on 64 of them, whatever it asks for."""
    from train.shapes.prepare import prepare_tiny
    from train.shapes import write_shapes_dataset

    n, vae_steps, vae_images = (SMOKE_IMAGES, 3, 64) if RUN.smoke else (n, vae_steps, 1024)
    data, parts = RUN.out / f"shapes-{n}", RUN.out / "components"
    with building():
        if not (data / "32" / "index.json").is_file():
            write_shapes_dataset(data, n, seed=0, sizes=(16, 32), n_eval=0, progress=False)
        if not (parts / "prepare.json").is_file():  # written last
            prepare_tiny(data, parts, vae_steps=vae_steps, max_images=vae_images, progress=False)
    return data, parts


def tiny_checkpoint() -> Path:
    """A tiny 32 px Composer checkpoint with EMA weights (2 batches of 16: its quality does not matter here)."""
    folder = RUN.out / "tiny-ckpt"
    ckpt = folder / "ep0-ba2-rank0.pt"
    data, parts = fixtures()
    with building():
        if ckpt.is_file():
            return ckpt
        from train.config import load_config
        from train.trainer import train  # Composer: seconds to import, so only when there is training to do

        train(load_config(ROOT / "configs/tiny-phase2.yaml", [
            f"model.pretrained={parts}", f"data.path={data / '32'}", "data.resolution=32", "load_path=null",
            f"save_folder={folder}", "max_duration=2ba", "save_interval=2ba", "global_train_batch_size=16",
            "device_train_microbatch_size=16", "progress_bar=false", "loggers=[]", "scheduler.t_warmup=1ba"]))
    return ckpt


def random_sd2_base(captions: list[str]):
    """SD2-base at full size with seeded random weights (UNet 865.9M, VAE, 23-layer OpenCLIP-H text tower) and
    a tokenizer fitted on ``captions``: a float32 pipeline on the CPU, for timing (weights do not matter)."""
    import torch

    from models.checkpoints.components import assemble_pipeline, build_unet, random_text_encoder, random_vae
    from models.families import family_named
    from train.shapes.prepare import fit_tokenizer

    torch.manual_seed(0)
    tokenizer = fit_tokenizer(captions, max_length=77)
    parts = {"unet": build_unet("sd2-base"), "vae": random_vae("sd2-base"), "text_encoder": random_text_encoder("sd2-base")}
    return assemble_pipeline(family_named("sd2"), parts, {"tokenizer": tokenizer}, {"prediction_type": "epsilon"})


def machine() -> str:
    """The processor, its cores, and torch's threads and version where the script uses torch."""
    cpu = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    torch = sys.modules.get("torch")
    return cpu if torch is None else f"{cpu}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"


def report(name: str, result: dict) -> None:
    """Print ``result`` and write it to ``RUN.out / f"{name}.json"`` with the date and machine (and "smoke": true in a
    smoke run, whose figures mean nothing)."""
    result = {"benchmark": name, "date": time.strftime("%Y-%m-%d"), "machine": machine(),
              **({"smoke": True} if RUN.smoke else {}), **result}
    (RUN.out / f"{name}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def fit_batch_end_times(trainer, batches: int, sync=None) -> list[float]:
    """Fit ``trainer`` for ``batches`` batches; the wall-clock time at each batch's end (after ``sync``)."""
    from composer.core import Callback

    class Clock(Callback):
        def __init__(self):
            self.t = []

        def batch_end(self, state, logger):
            if sync is not None:
                sync()
            self.t.append(time.perf_counter())

    clock = Clock()
    trainer.state.callbacks.append(clock)
    trainer.fit(duration=f"{batches}ba")
    trainer.close()
    return clock.t
