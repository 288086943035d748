"""Runs shared by the training tests' modules: the multi-rank run whose real sharded checkpoints `test_scale.py`
resumes and `test_sharded_checkpoints.py` reads, launched once per test session."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest

from ..ranks import BIN, dwb_train_on_ranks, kill_ranks, launch


def made_once(tmp_path_factory, name: str, make: Callable[[Path], dict]) -> dict:
    """``make(folder)``'s result (plain JSON data), made once per test session: under pytest-xdist each worker has
    session fixtures of its own, so the first worker to ask makes it in the session's shared temporary folder while
    the others wait for it (a multi-rank launch costs tens of seconds each time it runs)."""
    from filelock import FileLock

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # the session's folder, above each worker's own
    done = shared / f"{name}.json"
    with FileLock(f"{done}.lock"):
        if not done.is_file():
            done.write_text(json.dumps(make(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared)))))
        return json.loads(done.read_text())


def kill_while_saving(proc: subprocess.Popen, checkpoint: Path, timeout: float = 240) -> list[list]:
    """SIGKILL the launcher and every rank once a rank has begun writing its part of the sharded ``checkpoint``
    folder, before the index DCP writes last; the folder's files and sizes as the kill left them. Polled every 2 ms:
    the tiny UNet's ranks took 0.1-0.2 s on 2 cores from their first part to the index."""
    deadline = time.monotonic() + timeout
    while not any(checkpoint.glob("*.distcp")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    kill_ranks(proc)
    return sorted([p.name, p.stat().st_size] for p in checkpoint.iterdir()) if checkpoint.is_dir() else []


@pytest.fixture(scope="session")
def killed_and_resumed(shapes_data, components, tmp_path_factory) -> dict:
    """1 node x 4 ranks of tiny phase 1 (``test_scale``'s run keys, FULL_SHARD, ``fsdp_state_dict_type: sharded``,
    a checkpoint every 2 batches), SIGKILLed while its ranks write batch 4's parts; then a copy of its checkpoint
    folder, byte for byte as the kill left it, resumed on 2 ranks (SHARD_GRAD_OP) to batch 6. Each checkpoint the
    resumed run writes is a real 2-rank FSDP save. ``{"killed": {folder, overrides}, "torn": [[file, bytes], ...]
    of batch 4's folder after the kill, "resumed": {folder, overrides, stdout}}``."""
    return made_once(tmp_path_factory, "killed-and-resumed", lambda root: kill_and_resume(shapes_data, components, root))


def kill_and_resume(shapes_data: Path, components: Path, root: Path) -> dict:
    from .test_scale import CONFIG, Run, run_overrides, run_overrides_like  # the keys of test_scale's runs

    folder = root / "four" / "checkpoints"
    overrides = run_overrides(shapes_data, components, folder, fsdp="true", fsdp_sharding_strategy="FULL_SHARD",
                              fsdp_state_dict_type="sharded", max_duration="12ba")
    proc = launch([str(BIN / "dwb"), "train", str(CONFIG), *map(str, overrides)], nproc=4)
    torn = kill_while_saving(proc, folder / "ep0-ba4")
    names = [name for name, _ in torn]
    logs = "".join(p.read_text()[-2000:] for p in sorted(proc.logs.glob("err-rank*.txt")))
    assert (folder / "ep0-ba2" / ".metadata").is_file(), f"batch 2 was not saved whole before the kill:\n{logs}"
    assert ".metadata" not in names and any(n.endswith(".distcp") for n in names), \
        f"the kill did not land while batch 4's parts were written: {torn}\n{logs}"
    resumed = root / "resumed" / "checkpoints"
    shutil.copytree(folder, resumed, symlinks=True)  # the killed run's own folder stays as it was, for its reports
    again = [str(o) for o in run_overrides_like(Run(folder, overrides), resumed, fsdp_sharding_strategy="SHARD_GRAD_OP",
                                                max_duration="6ba")]
    run = dwb_train_on_ranks(CONFIG, again, nproc=2)
    assert run.returncode == 0 and not run.hung, run.explain()
    return {"killed": {"folder": str(folder), "overrides": [str(o) for o in overrides]}, "torn": torn,
            "resumed": {"folder": str(resumed), "overrides": again, "stdout": run.stdout}}


def assert_trains_alike(model, raw: dict, pre: dict) -> None:
    """The precomputed batch gives the on-the-fly batch's loss under the same RNG state (its noise and timesteps),
    and another state a different one: equal because the inputs are, not because the loss ignores them."""
    import torch

    losses = []
    for batch in (raw, pre):
        torch.manual_seed(123)
        losses.append(model.loss(model(batch), batch).item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    torch.manual_seed(124)
    assert model.loss(model(pre), pre).item() != pytest.approx(losses[1], rel=1e-6)
