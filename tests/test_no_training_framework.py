"""What does not train never loads the training framework: the app, evaluate, human_eval, `dwb sample` and
`dwb export` stand on `models`, which imports no Composer. A change in Composer can then not break them, and
they start without it (docs/architecture.md; the import times are in BENCHMARKS.md)."""
from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

from .conftest import REPO

# A finder first on sys.meta_path that refuses Composer, naming who asked: a fresh interpreter runs the code
# under it, so an import of Composer anywhere (at a module's top or inside a function) fails the run.
NO_COMPOSER = """
import sys, traceback

class NoComposer:
    def find_spec(self, name, path=None, target=None):
        if name == "composer" or name.startswith("composer."):
            where = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack() if "{repo}" in f.filename]
            raise ImportError("composer imported from " + " <- ".join(reversed(where)))
        return None

sys.meta_path.insert(0, NoComposer())
"""


def run_without_composer(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    script = NO_COMPOSER.replace("{repo}", str(REPO)) + code
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def library_modules() -> list[str]:
    """Every module of `models`, by walking its folders (not its faces, which load names only on first use)."""
    import models

    return sorted(m.name for m in pkgutil.walk_packages(models.__path__, "models."))


def test_every_module_of_models_and_the_command_packages_imports_without_composer():
    modules = library_modules() + ["app.service", "app.ui", "app.handlers", "app.cli", "evaluate.run", "evaluate.cli",
                                   "evaluate.watch", "human_eval.server", "human_eval.cli"]
    assert "models.checkpoints.open" in modules and "models.export.export" in modules  # the walk found the rooms
    done = run_without_composer("import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
                                + "assert 'composer' not in sys.modules\nprint('ok')")
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_check_itself_sees_composer_imported():
    done = run_without_composer("import train.trainer")
    assert done.returncode != 0 and "composer imported from" in done.stderr


@pytest.fixture(scope="module")
def last_checkpoint(tiny_run):
    return tiny_run / "latest-rank0.pt"


def test_sample_and_export_of_a_composer_checkpoint_run_without_composer(last_checkpoint, tmp_path):
    grid, folder = tmp_path / "grid.png", tmp_path / "export"
    done = run_without_composer(
        "import dwb\n"
        f"assert dwb.main(['sample', {str(last_checkpoint)!r}, {str(grid)!r}, '--steps', '2', '--seeds', '1', "
        "'--prompt', 'a red circle']) == 0\n"
        f"assert dwb.main(['export', {str(last_checkpoint)!r}, {str(folder)!r}]) == 0\n"
        "assert 'composer' not in sys.modules\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert grid.stat().st_size > 0 and (folder / "model_index.json").is_file()
