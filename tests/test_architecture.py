"""The import rules of docs/architecture.md, as `lint-imports` checks them (contracts in pyproject.toml)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import REPO

LINT = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("train", "evaluate", "app", "human_eval", "demo")


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root), "NO_COLOR": "1"}
    done = subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True, env=env, timeout=120)
    done.stdout = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)
    return done


def test_the_tree_keeps_every_contract():
    done = lint(REPO)
    assert done.returncode == 0, done.stdout[-3000:]
    assert re.search(r"Contracts: (\d+) kept, 0 broken", done.stdout)
    assert int(re.search(r"Contracts: (\d+) kept", done.stdout)[1]) >= 7


def test_an_arrow_the_wrong_way_fails_with_the_contracts_name(tmp_path):
    for name in PACKAGES:
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    with open(tmp_path / "train" / "generation" / "grid.py", "a") as f:  # a room reaching up to the trainer
        f.write("\nfrom ..trainer import train  # noqa\n")
    with open(tmp_path / "app" / "xyz.py", "a") as f:  # another package reaching past a room's face
        f.write("\nfrom train.generation.samplers import SAMPLERS  # noqa\n")
    done = lint(tmp_path)
    assert done.returncode != 0
    broken = re.findall(r"^(.+) BROKEN$", done.stdout, re.M)
    assert set(broken) == {"Inside train: the trainer above shapes, data, checkpoints and generation, above the ground "
                           "floor", "train.generation is entered by its face", "No circle of imports anywhere"}
    assert "train.generation.grid -> train.trainer" in done.stdout and "app.xyz -> train.generation.samplers" in done.stdout
