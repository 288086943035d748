"""Shared set-up for the CPU benchmarks: a shapes dataset and tiny components, built once under bench/out."""
from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))


def fixtures(n: int = 4096, vae_steps: int = 20) -> tuple[Path, Path]:
    """(shapes dataset, tiny components); the VAE's quality does not matter for timing."""
    from train.prepare import prepare_tiny
    from train.shapes import write_shapes_dataset

    data, parts = OUT / f"shapes-{n}", OUT / "components"
    if not (data / "32" / "index.json").is_file():
        write_shapes_dataset(data, n, seed=0, sizes=(16, 32), n_eval=0, progress=False)
    if not (parts / "vae").is_dir():
        prepare_tiny(data, parts, vae_steps=vae_steps, max_images=1024, progress=False)
    return data, parts


def random_sd2_base(captions: list[str]):
    """SD2-base at full size with seeded random weights (UNet 865.9M, VAE, 23-layer OpenCLIP-H text tower) and
    a tokenizer fitted on ``captions``: a float32 pipeline on the CPU, for timing (weights do not matter)."""
    import torch

    from train.components import build_pipeline, build_unet, random_text_encoder, random_vae
    from train.prepare import fit_tokenizer

    torch.manual_seed(0)
    tokenizer = fit_tokenizer(captions, max_length=77)
    return build_pipeline(build_unet("sd2-base"), random_vae("sd2-base"), random_text_encoder("sd2-base"), tokenizer,
                          "epsilon")


def machine() -> str:
    import torch

    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"


def report(name: str, result: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": name, "date": time.strftime("%Y-%m-%d"), "machine": machine(), **result}
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=2))
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
