"""Fixtures for the app: tiny checkpoints under one allowed root (good, broken, foreign and escaping ones),
files outside it, and `dwb app` started the way users start it."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from ..conftest import REPO

PHASE1 = REPO / "configs/tiny-phase1.yaml"
DWB = Path(sys.executable).parent / "dwb"


@dataclass
class Tree:
    root: Path  # the one folder given to --checkpoints
    ba2: Path  # Composer checkpoints, 16 px, EMA from the first batch
    ba4: Path
    export: Path  # ba4's EMA weights as a diffusers folder
    broken: Path  # a .pt file with garbage bytes
    foreign: Path  # a valid PyTorch file that is not a workbench checkpoint
    linked: Path  # a symlink in the root to a checkpoint outside it
    sneaky: Path  # a diffusers folder in the root whose UNet weights link outside it
    outside: Path  # a folder next to the root with a valid checkpoint and export


@pytest.fixture(scope="session")
def base(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("app")
    (folder / "checkpoints").mkdir()
    return folder


@pytest.fixture(scope="session")
def tree(tiny_run, base) -> Tree:
    from train.checkpoints import export_pipeline

    root, outside = base / "checkpoints", base / "outside"
    run = root / "tiny-phase1"
    run.mkdir()
    for name in ("ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt"):
        shutil.copy2(tiny_run / name, run / name)
    os.symlink("ep0-ba4-rank0.pt", run / "latest-rank0.pt")
    export_pipeline(run / "ep0-ba4-rank0.pt", root / "export-ba4", ema=True)

    (root / "broken").mkdir()
    (root / "broken" / "ep0-ba9-rank0.pt").write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    (root / "foreign").mkdir()
    torch.save({"state_dict": {"weight": torch.zeros(4)}}, root / "foreign" / "ep0-ba1-rank0.pt")

    outside.mkdir()
    shutil.copy(run / "ep0-ba4-rank0.pt", outside / "ep0-ba4-rank0.pt")
    shutil.copytree(root / "export-ba4", outside / "export")
    (root / "linked").mkdir()
    (root / "linked" / "ep0-ba5-rank0.pt").symlink_to(outside / "ep0-ba4-rank0.pt")
    sneaky = root / "sneaky-export"
    shutil.copytree(root / "export-ba4", sneaky)
    weights = sneaky / "unet" / "diffusion_pytorch_model.safetensors"
    weights.unlink()
    weights.symlink_to(outside / "export" / "unet" / "diffusion_pytorch_model.safetensors")
    return Tree(root, run / "ep0-ba2-rank0.pt", run / "ep0-ba4-rank0.pt", root / "export-ba4",
                root / "broken" / "ep0-ba9-rank0.pt", root / "foreign" / "ep0-ba1-rank0.pt",
                root / "linked" / "ep0-ba5-rank0.pt", sneaky, outside)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    """`dwb app` in a subprocess on 127.0.0.1 with a free port; its output goes to ``log``."""

    def __init__(self, roots: list[Path], *extra: str, log: Path, env: dict | None = None):
        self.roots, self.extra, self.log, self.env = roots, extra, log, env or {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def launch(self) -> "AppServer":
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "GRADIO_ANALYTICS_ENABLED": "False", **self.env}
        args = [str(DWB), "app", "--checkpoints", *map(str, self.roots), "--port", str(self.port), *self.extra]
        self._out = open(self.log, "w")
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=self._out, stderr=subprocess.STDOUT, text=True)
        return self

    def wait_ready(self, timeout: float = 180.0) -> "AppServer":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dwb app exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/gradio_api/info", timeout=2).status_code == 200:
                    return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"dwb app did not start within {timeout} s: {self.log.read_text()[-2000:]}")

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc:
            self._out.close()


@pytest.fixture(scope="session")
def server(base, request, tmp_path_factory):
    """One server for the API and browser tests: at most 2 requests wait while one runs.

    It starts on the (still empty) checkpoint folder while the tiny checkpoints are trained, as a
    user may start the app while training runs; a page load lists what is there.
    """
    app = AppServer([base / "checkpoints"], "--queue-size", "2", "--cache-size", "4", "--max-steps", "150",
                    log=tmp_path_factory.mktemp("server") / "app.log")
    app.launch()
    try:
        request.getfixturevalue("tree")
        app.wait_ready()
    except BaseException:
        app.stop()
        raise
    yield app
    app.stop()


@pytest.fixture
def client(server, tmp_path):
    from gradio_client import Client

    return Client(server.url, verbose=False, download_files=str(tmp_path))


@pytest.fixture(scope="session")
def pipe(tree):
    """ba4's EMA weights through the workbench's one door into a checkpoint."""
    from train.checkpoints import load_pipeline

    return load_pipeline(tree.ba4, ema=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item, so fixtures can tell a failed test at teardown."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
