"""Shared fixtures: a small shapes dataset and tiny components, built once per test session."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shapes_data(tmp_path_factory) -> Path:
    from train.shapes import write_shapes_dataset

    out = tmp_path_factory.mktemp("shapes")
    write_shapes_dataset(out, 192, seed=3, sizes=(16, 32), n_eval=16, progress=False)
    return out


@pytest.fixture(scope="session")
def components(shapes_data, tmp_path_factory) -> Path:
    from train.prepare import prepare_tiny

    out = tmp_path_factory.mktemp("components")
    prepare_tiny(shapes_data, out, vae_steps=3, max_images=192, progress=False)
    return out


def tiny_overrides(shapes_data: Path, components: Path, save_folder: Path, res: int = 16, **extra) -> list[str]:
    base = {
        "model.pretrained": components, "data.path": shapes_data / str(res), "data.resolution": res,
        "save_folder": save_folder, "global_train_batch_size": 8, "device_train_microbatch_size": 8,
        "progress_bar": False, "scheduler.t_warmup": "1ba", "loggers": "[]",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def run_dwb(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """The console script, started the way users start it."""
    exe = Path(sys.executable).parent / "dwb"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([str(exe), *args], cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout, env=env)
