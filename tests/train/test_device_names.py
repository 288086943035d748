"""One device vocabulary: torch's `auto`, `cpu` and `cuda` in `dwb train`'s config as in `dwb evaluate`, `dwb app`
and `dwb data precompute`; a config written with Composer's `gpu` is told, in one line, to write `cuda`."""
import re

import pytest
import torch

from train.config import load_config
from models.errors import WorkbenchError
from train.trainer import resolve_device

from ..conftest import REPO

PHASE1 = REPO / "configs/tiny-phase1.yaml"


def test_device_gpu_is_refused_in_one_line_naming_cuda(dwb):
    r = dwb("train", str(PHASE1), "device=gpu")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "config key 'device' must be auto, cpu or cuda (torch's device names), got 'gpu': write cuda" in r.stderr


def test_device_cuda_is_the_training_configs_name_for_a_gpu():
    cfg = load_config(PHASE1, ["device=cuda"])
    if torch.cuda.is_available():
        assert resolve_device(cfg) == "gpu"  # Composer's own name, inside the trainer only
    else:
        with pytest.raises(WorkbenchError, match="^config key 'device': device 'cuda' asked for, but no CUDA GPU"):
            resolve_device(cfg)
    assert resolve_device(load_config(PHASE1, ["device=cpu"])) == "cpu"


def test_no_doc_or_example_config_says_device_gpu():
    said = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in [*REPO.glob("*.md"), *REPO.glob("docs/*.md"),
                                                            *REPO.glob("configs/*.yaml")]
            for m in re.finditer(r"device[:=] *gpu\b", p.read_text())]
    assert not said
