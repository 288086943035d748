"""Fixtures for the app: tiny checkpoints under one allowed root (good, broken, foreign and escaping ones),
files outside it, and `dwb app` started the way users start it."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from ..conftest import DWB, REPO
from ..servers import ServerProcess, free_port


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
    from models.checkpoints import export_pipeline

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


class AppServer(ServerProcess):
    """`dwb app --checkpoints ROOTS... EXTRA...` on 127.0.0.1 with a free port, ready when Gradio's API answers;
    its output goes to ``log``."""

    def __init__(self, roots: list[Path], *extra: str, log: Path, env: dict | None = None):
        port = free_port()
        super().__init__([DWB, "app", "--checkpoints", *roots, "--port", port, *extra], port=port,
                         ready_path="/gradio_api/info", timeout=180.0, log=log, cwd=REPO,
                         env={"GRADIO_ANALYTICS_ENABLED": "False", **(env or {})})


@pytest.fixture(scope="session")
def server(base, request, tmp_path_factory):
    """One server for the API and browser tests: at most 2 requests wait while one runs.

    It starts on the (still empty) checkpoint folder while the tiny checkpoints are trained, as a
    user may start the app while training runs; a page load lists what is there. Its results store,
    ``base/results``, is empty until a test writes rows there (the app reads them when they change).
    """
    app = AppServer([base / "checkpoints"], "--queue-size", "2", "--cache-size", "4", "--max-steps", "150",
                    "--results", base / "results", log=tmp_path_factory.mktemp("server") / "app.log")
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
    from models.checkpoints import load_pipeline

    return load_pipeline(tree.ba4, ema=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item, so fixtures can tell a failed test at teardown."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
