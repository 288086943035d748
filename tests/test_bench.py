"""Every benchmark in bench/ runs end to end in its smoke mode, started as users start it
(`.venv/bin/python bench/NAME.py --smoke`), so a benchmark that breaks, or a new one without --smoke,
fails here instead of on the next person who runs it."""
from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .conftest import REPO

SCRIPTS = sorted(p.name for p in (REPO / "bench").glob("*.py") if not p.name.startswith("_"))
# Two at a time: a smoke run keeps one core busy (one after the other, the seven took 185 s of CPU in
# 192 s), most of it importing torch, diffusers and Composer, so two side by side use both of 2 cores.
SIDE_BY_SIDE = 2


def smoke(script: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"bench/{script}", "--smoke", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Each script's smoke run, all on one folder so they share its small dataset, tiny components and
    checkpoint (the scripts build each once under a lock)."""
    out = tmp_path_factory.mktemp("bench")
    with ThreadPoolExecutor(SIDE_BY_SIDE) as pool:
        return dict(zip(SCRIPTS, pool.map(lambda script: smoke(script, out), SCRIPTS)))


def test_every_benchmark_is_found():
    """The discovery itself: an empty list would make the smoke tests pass by having none."""
    assert {"app_overhead.py", "composer_overhead.py", "evaluate_bench.py"} <= set(SCRIPTS)
    assert "_common.py" not in SCRIPTS


@pytest.mark.slow  # the first waits for every script's run: 3.5 to 5 minutes on 2 cores shared with other work
@pytest.mark.parametrize("script", SCRIPTS)
def test_smoke_run(script, smoke_runs):
    run = smoke_runs[script]
    assert run.returncode == 0, f"bench/{script} --smoke exited {run.returncode}:\n{(run.stdout + run.stderr)[-3000:]}"
    # the JSON it reports is the last thing it prints: the run got to its end, marked as a smoke run
    result = json.loads(run.stdout[run.stdout.rfind("\n{") + 1:])
    assert result["smoke"] is True and result["benchmark"]
