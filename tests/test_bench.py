"""Every benchmark in bench/ runs end to end in its smoke mode, as `.venv/bin/python bench/NAME.py --smoke`
runs it (each in its own process, forked from one that imported the heavy libraries once: see
tests/bench_smoke.py), so a benchmark that breaks, or a new one without --smoke, fails here instead of on
the next person who runs it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

SCRIPTS = sorted(p.name for p in (REPO / "bench").glob("*.py") if not p.name.startswith("_"))


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """Each script's smoke run and exit status, all on one folder so they share its small dataset, tiny
    components and checkpoint (the scripts build each once under a lock)."""
    out = tmp_path_factory.mktemp("bench")
    run = subprocess.run([sys.executable, "tests/bench_smoke.py", str(out), *SCRIPTS], cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return out, json.loads(run.stdout.strip().splitlines()[-1])


def test_every_benchmark_is_found():
    """The discovery itself: an empty list would make the smoke tests pass by having none."""
    assert {"app_overhead.py", "composer_overhead.py", "evaluate_bench.py"} <= set(SCRIPTS)
    assert "_common.py" not in SCRIPTS


@pytest.mark.slow  # the first waits for every script's run: about 165 s of CPU (300 s as ten separate processes)
@pytest.mark.parametrize("script", SCRIPTS)
def test_smoke_run(script, smoke_runs):
    out, status = smoke_runs
    printed, log = (out / f"{script}.out").read_text(), (out / f"{script}.log").read_text()
    assert status[script] == 0, f"bench/{script} --smoke exited {status[script]}:\n{printed[-1500:]}\n{log[-1500:]}"
    # the JSON it reports is the last thing it prints: the run got to its end, marked as a smoke run
    result = json.loads(printed[printed.rfind("\n{") + 1:])
    assert result["smoke"] is True and result["benchmark"]
