"""The adapter runs the adapter tests share: each family's LoRA run trained once a session, when first asked for
(training, exporting and `dwb evaluate watch` read the same checkpoints)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from models.adapters.presets import FLUX_TARGETS

from .adapted import made_once

# Flux.1's kohya converter splits a single block's fused linear1 at full width only: the double block is adapted
FLUX_DOUBLE_BLOCK = "[" + ", ".join(f"transformer_blocks.0.{t}" for t in FLUX_TARGETS) + "]"


def adapter_keys(shapes_data: Path, base: Path, folder: Path, **extra) -> list[str]:
    """A LoRA of alpha 8 over rank 4 (a scale of 2 the files must carry) trained 4 batches of 4 at a high lr (the
    adapter must move the image), EMA from the first batch, per-sample draws (1 process and 2 ranks draw alike)."""
    keys = {"model.init_from": base, "adapter.type": "lora", "adapter.alpha": 8, "data.path": shapes_data / "16",
            "data.resolution": 16, "save_folder": folder, "global_train_batch_size": 4,
            "device_train_microbatch_size": 2, "optimizer.lr": 0.02, "scheduler.t_warmup": "0ba",
            "max_duration": "4ba", "save_interval": "2ba", "ema.enabled": "true", "ema.smoothing": 0.5,
            "ema.ema_start": "0ba", "randomness": "per_sample", "autoresume": "true", "eval_interval": "null",
            "progress_bar": "false", "loggers": "[]", "run_name": "lora", **extra}
    return [f"{k}={v}" for k, v in keys.items()]


def killed_and_resumed(keys: list[str], folder: Path) -> Path:
    """The run of ``keys`` again into ``folder``: `dwb train` SIGKILLed once its checkpoint at batch 2 is saved,
    then autoresumed to batch 4 in this process. Returns the resumed run's last checkpoint."""
    from train.config import load_config
    from train.trainer import train

    from ..conftest import kill_once_saved

    folder.parent.mkdir(parents=True, exist_ok=True)
    config = folder.parent / "empty.yaml"
    config.write_text("{}\n")
    again = [k for k in keys if not k.startswith("save_folder=")] + [f"save_folder={folder}"]
    proc = subprocess.Popen([str(Path(sys.executable).parent / "dwb"), "train", str(config), *again],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kill_once_saved(proc, folder / "ep0-ba2-rank0.pt")
    assert not (folder / "ep0-ba4-rank0.pt").exists()
    train(load_config(None, again))
    return folder / "ep0-ba4-rank0.pt"


@pytest.fixture(scope="session")
def lora_runs(shapes_data, sd2_folder, family_folders, tmp_path_factory):
    """family ("sd2", "sdxl" or "flux") -> (the run's overrides, its checkpoint folder: ep0-ba2-rank0.pt, ep0-ba4-rank0.pt),
    trained in this process the first time it is asked for."""
    def make(family: str):
        from train.config import load_config
        from train.trainer import train

        base, extra = {"sd2": (sd2_folder, {}), "sdxl": (family_folders["sdxl"], {}),
                       "flux": (family_folders["flux-dev"], {"adapter.targets": FLUX_DOUBLE_BLOCK})}[family]
        folder = tmp_path_factory.mktemp(f"lora-{family}") / "checkpoints"
        keys = adapter_keys(shapes_data, base, folder, **extra)
        train(load_config(None, keys))
        return keys, folder

    return made_once(make)
