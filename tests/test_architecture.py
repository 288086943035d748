"""The import rules of docs/architecture.md, as `lint-imports` checks them (contracts in pyproject.toml)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import REPO

LINT = Path(sys.executable).parent / "lint-imports"
PACKAGES = ("models", "train", "evaluate", "app", "human_eval", "demo")


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
    with open(tmp_path / "models" / "generation" / "grid.py", "a") as f:  # the library reaching up to the trainer
        f.write("\nfrom train.trainer import train  # noqa\n")
    with open(tmp_path / "app" / "cache.py", "a") as f:  # a command package standing on train
        f.write("\nfrom train.data import open_local  # noqa\n")
    with open(tmp_path / "app" / "xyz.py", "a") as f:  # another package reaching past a room's face
        f.write("\nfrom models.generation.samplers import SAMPLERS  # noqa\n")
    done = lint(tmp_path)
    assert done.returncode != 0
    broken = re.findall(r"^(.+) BROKEN$", done.stdout, re.M)
    assert set(broken) == {"The command packages stand above models, and none of them imports another",
                           "The app, evaluate and human_eval stand on models alone, never on train",
                           "Inside models: export above the door, above generation, the families and the shapes domain, "
                           "above datasets, the readers and the ground floor",  # grid -> the trainer -> the door
                           "models.generation is entered by its face"}
    assert "models.generation.grid -> train.trainer" in done.stdout and "app.xyz -> models.generation.samplers" in done.stdout
    assert "app.cache -> train.data" in done.stdout


def test_the_rooms_the_architecture_page_lists_are_the_folders_of_the_code():
    page = (REPO / "docs" / "architecture.md").read_text()
    table = page[page.index("## What each room holds"):page.index("## Where a new thing goes")]
    listed = set(re.findall(r"^\| `([\w/]+/)`", table, re.M))
    folders = {f"{init.parent.relative_to(REPO)}/" for package in PACKAGES for init in (REPO / package).rglob("__init__.py")}
    assert listed == folders, f"listed, no such folder: {sorted(listed - folders)}; folders not listed: {sorted(folders - listed)}"
    modules = set(re.findall(r"^\| `([\w/]+\.py)`", table, re.M))
    assert modules == {"dwb.py", "models/errors.py"} and all((REPO / m).is_file() for m in modules)
