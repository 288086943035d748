"""Shared fixtures: a small shapes dataset and tiny components, built once per test session."""
from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from .servers import ServerProcess, free_port

if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n 2`: one core per worker and for what it starts; two
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torch threads per worker on 2 cores spin against each other
    os.environ.setdefault("MKL_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent
PROMPT_SETS = REPO / "models" / "generation" / "prompt_sets"  # DrawBench and PartiPrompts, as the workbench ships them
DWB = Path(sys.executable).parent / "dwb"  # the console script users run


@pytest.fixture(scope="session")
def shapes_data(tmp_path_factory) -> Path:
    from train.shapes import write_shapes_dataset

    out = tmp_path_factory.mktemp("shapes")
    write_shapes_dataset(out, 192, seed=3, sizes=(16, 32), n_eval=16, progress=False)
    return out


@pytest.fixture(scope="session")
def components(shapes_data, tmp_path_factory) -> Path:
    from train.shapes.prepare import prepare_tiny

    out = tmp_path_factory.mktemp("components")
    prepare_tiny(shapes_data, out, vae_steps=3, max_images=192, progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_run(shapes_data, components, tmp_path_factory) -> Path:
    """The suite's one short training run: tiny phase 1, 16 px, 4 batches of 8, EMA from the first batch,
    checkpoints ep0-ba2 and ep0-ba4 in ``<tmp>/tiny-phase1/checkpoints``. Treat it as read-only."""
    from train.config import load_config
    from train.trainer import train

    folder = tmp_path_factory.mktemp("tiny-run") / "tiny-phase1" / "checkpoints"
    train(load_config(REPO / "configs/tiny-phase1.yaml",
                      tiny_overrides(shapes_data, components, folder, max_duration="4ba", save_interval="2ba")))
    return folder


def tiny_overrides(shapes_data: Path, components: Path, save_folder: Path, res: int = 16, **extra) -> list[str]:
    base = {
        "model.pretrained": components, "data.path": shapes_data / str(res), "data.resolution": res,
        "save_folder": save_folder, "global_train_batch_size": 8, "device_train_microbatch_size": 8,
        "progress_bar": False, "scheduler.t_warmup": "1ba", "loggers": "[]",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def kill_once_saved(proc: subprocess.Popen, checkpoint: Path, timeout: float = 300) -> None:
    """SIGKILL a `dwb train` process once ``checkpoint`` is whole (within ``timeout`` s, or the test fails with the
    process's stderr)."""
    import signal
    import time

    from models.checkpoints import checkpoint_problem

    deadline = time.time() + timeout
    while not (checkpoint.exists() and checkpoint_problem(checkpoint) is None):
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else "timeout"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@contextmanager
def file_size_limit(nbytes: int):
    """Writes of this process past ``nbytes`` into any file fail as on a full disk (EFBIG, "File too large"):
    the kernel's file-size limit (RLIMIT_FSIZE), with SIGXFSZ ignored so the write returns the error."""
    import resource
    import signal

    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def run_with_peak_memory(*argv: str) -> tuple[subprocess.CompletedProcess, int]:
    """``argv`` run from a fresh interpreter that reports its one child's peak resident memory (bytes): a hostile
    input refused under ``prlimit`` is shown to have stayed within its cap."""
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "sys.stdout.write(r.stdout); sys.stderr.write(r.stderr); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, file=sys.stderr); "
             "sys.exit(r.returncode)")
    run = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, cwd=REPO, timeout=300,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    *lines, peak = run.stderr.splitlines()
    return subprocess.CompletedProcess(argv, run.returncode, run.stdout, "\n".join(lines)), int(peak)


def run_dwb(*args: str, cwd: Path | None = None, timeout: int = 600,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The console script, started the way users start it (``env``: variables set on top of this process's)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([str(DWB), *args], cwd=cwd or REPO, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture
def dwb(capsys, monkeypatch):
    """`dwb ARGS` through `dwb.main` in this process, from the repository root: what `run_dwb` returns,
    without the 5-10 s of imports a new process pays (keep `run_dwb` for what only a process shows)."""
    from dwb import main

    monkeypatch.chdir(REPO)

    def run(*args: str) -> subprocess.CompletedProcess:
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's own errors
            code = e.code
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, captured.out, captured.err)

    return run


# Scoring models (evaluate, human_eval from evaluate, the checkpoint door): random, small, saved as users keep them.

@pytest.fixture(scope="session")
def inception_weights(tmp_path_factory) -> Path:
    """The Inception-v3 architecture torch-fidelity uses, seeded random weights with He initialisation (features
    O(0.1-1) that differ between images; see ``write_random_inception``), saved as a state dict."""
    from evaluate.scorers.features import write_random_inception

    return write_random_inception(tmp_path_factory.mktemp("inception"))


@pytest.fixture(scope="session")
def tiny_dinov2(tmp_path_factory) -> Path:
    """A two-layer, 32-wide ``Dinov2Model`` from config, saved as a folder.

    Initialised with a standard deviation of 0.2 instead of the config's default 0.02: at 0.02 the CLS
    token and position embeddings outweigh what the image contributes, and features (about 0.8 in size)
    varied only by 0.04 across images; at 0.2 they vary by about 0.5.
    """
    import torch
    from transformers import Dinov2Config, Dinov2Model

    out = tmp_path_factory.mktemp("dinov2")
    torch.manual_seed(0)
    Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             patch_size=14, image_size=224, initializer_range=0.2)).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_clip(components, tmp_path_factory) -> Path:
    """A CLIP model with small sizes from config, with the tiny tokenizer, saved as a folder."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    out = tmp_path_factory.mktemp("clip")
    tokenizer = CLIPTokenizer.from_pretrained(components / "tokenizer")
    config = CLIPConfig(
        # the tokenizer's own special ids: CLIP pools the text at the first end token, and with the config's
        # default (49407, absent from this vocabulary) it pooled the start token, the same for every caption
        text_config=dict(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=77, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16)
    torch.manual_seed(0)
    model = CLIPModel(config)
    with torch.no_grad():  # a fixture that cannot tell captions apart would test nothing
        text = model.get_text_features(**tokenizer(["a red circle", "two blue squares"], padding=True, return_tensors="pt"))
    assert not torch.allclose(text[0], text[1], atol=1e-3)
    model.save_pretrained(out)
    processor = CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32},
                                                                 crop_size={"height": 32, "width": 32}),
                              tokenizer=tokenizer)
    processor.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def family_folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny SDXL, SD3 and Flux.1 (dev, schnell) diffusers folders written by diffusers (tests/family_fixtures.py)."""
    from .family_fixtures import write_family_folders

    return write_family_folders(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="session")
def sd2_folder(tmp_path_factory) -> Path:
    """The reduced SD 2 pipeline (tests/checkpoints/fixtures.py, predicting v) as a diffusers folder written by
    diffusers' save_pretrained: a base to fine-tune or adapt (``model.init_from``)."""
    from .checkpoints.fixtures import reduced_pipeline

    out = tmp_path_factory.mktemp("sd2-base") / "sd2"
    reduced_pipeline("sd2", prediction_type="v_prediction").save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def s3_server():
    """A local S3-compatible store: moto's server on 127.0.0.1, with test credentials in the environment."""
    port = free_port()
    moto = ServerProcess([Path(sys.executable).parent / "moto_server", "-H", "127.0.0.1", "-p", port], port=port)
    moto.start()
    url = moto.url
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "S3_ENDPOINT_URL": url}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield url
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    moto.stop()


def upload_folder(folder: Path, bucket: str, prefix: str) -> str:
    """Copy a local folder to s3://bucket/prefix (creating the bucket); returns the URL."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT_URL"])
    try:
        s3.create_bucket(Bucket=bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            s3.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")
    return f"s3://{bucket}/{prefix}"


def pytest_addoption(parser):
    parser.addoption("--full-size", action="store_true",
                     help="also run the tests marked full_size (SD2-base at full size: 16 GB of RAM, tens of minutes)")


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run where a CUDA GPU is visible and are skipped, with the reason, elsewhere; tests
    marked `full_size` run only with --full-size."""
    import torch

    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (FSDP, low-precision norms, xformers, auto microbatching)")
    skip_full = pytest.mark.skip(reason="SD2-base at full size: run alone with --full-size (16 GB of RAM)")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "full_size" in item.keywords and not config.getoption("--full-size"):
            item.add_marker(skip_full)


@pytest.fixture(autouse=True, scope="module")
def _release_streaming_shared_memory():
    """Each test module's Streaming shared memory is freed when the module ends (``train.patches.streaming``)."""
    from train.patches.streaming import release_streaming_shared_memory

    with release_streaming_shared_memory():
        yield


def under_ci() -> bool:
    """Whether the suite runs where every check is meant to run (CI=true, as GitHub Actions and most CI set it)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def unavailable(reason: str) -> None:
    """Skip a test that needs what this machine lacks, with the reason; under CI fail it with that reason instead:
    a check skipped there passes in silence (the browser tests skipped on CI whenever Chromium failed to install)."""
    if under_ci():
        pytest.fail(f"{reason} (CI=true: a check that cannot run fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


# Browser tests: Debian's chromium driven by Playwright's Python package (executable_path).
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def require_chromium(executable: Path = CHROMIUM) -> None:
    """Chromium and Playwright's Python package, or ``unavailable`` with what is missing."""
    import importlib.util

    if not executable.exists():
        unavailable(f"Debian's chromium is not installed at {executable} (scripts/setup-test-deps.sh installs it)")
    if importlib.util.find_spec("playwright") is None:
        unavailable("Playwright's Python package is not installed (pip install playwright; the test extra has it)")


@pytest.fixture(scope="session")
def chromium() -> Path:
    """The browser the browser tests drive: skipped without it, failed under CI (``unavailable``). Session-scoped,
    so it is checked before any module's fixtures start servers or score checkpoints for a browser test."""
    require_chromium()
    return CHROMIUM


needs_chromium = pytest.mark.usefixtures("chromium")
