"""SD2-base at full size, named as users name it: by its hub id from an offline Hugging Face cache, and as one
original-layout ``.safetensors`` file. Each trains (phase 1 of the published recipe, one batch), and the trained
checkpoint exports, samples, is scored and opens in the app, beside the model it started from.

Random weights (seeded), the real configs (``models.checkpoints.architectures``), the real CLIP BPE tokenizer. Every step is
the console script in its own process, as users run it, with ``HF_HUB_OFFLINE=1`` and an empty ``HF_HOME``.

Not in CI: the training step alone holds about 16 GB (UNet 866M in float32 with its gradients and AdamW's two
moments, beside the frozen VAE and 23-layer text tower), and the whole module takes tens of minutes on 2 cores.
Run it alone, on a machine with 24 GB or more:

    .venv/bin/python -m pytest tests/checkpoints/test_full_size.py --full-size -s

Each step's wall time and peak memory are printed at the end (BENCHMARKS.md has a run's figures).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ..conftest import DWB, REPO
from .fixtures import commit_hash, write_hub_snapshot

pytestmark = pytest.mark.full_size

HUB_ID = "stabilityai/stable-diffusion-2-base"
PROMPT = "two red circles left of a blue square"
SIZE = 256  # phase 1's resolution; generation at it too (512 px costs 4x the time on CPU)
STEPS: list[dict] = []  # what each command took: printed at the end of the module


@dataclass
class SD2Base:
    cache: Path  # HF_HUB_CACHE, holding HUB_ID
    single_file: Path  # the same weights in the original layout
    data: Path  # shapes at 256 px: training data and the reference images
    inception: Path


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print("\nfull-size SD2-base, one process per step (wall time, peak resident memory):")
    for step in STEPS:
        print(f"  {step['step']:<48} {step['seconds']:8.1f} s {step['peak_gb']:7.2f} GB")
    out = os.environ.get("DWB_FULL_SIZE_REPORT")
    if out:
        Path(out).write_text(json.dumps(STEPS, indent=2))


def peak_gb(pid: int) -> float:
    """The process's peak resident memory so far (``VmHWM``: its own, from its exec on; 0 once it is gone)."""
    try:
        return int(re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text()).group(1)) / 2**20
    except (OSError, AttributeError):
        return 0.0


def run_step(name: str, args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """``dwb ARGS`` in its own process; its wall time and peak resident memory (read every 0.2 s) join STEPS."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t, peak = time.perf_counter(), 0.0
        proc = subprocess.Popen([str(DWB), *args], cwd=cwd, env=env, stdout=out, stderr=err, text=True)
        while proc.poll() is None:
            peak = max(peak, peak_gb(proc.pid))
            time.sleep(0.2)
        STEPS.append({"step": name, "seconds": time.perf_counter() - t, "peak_gb": peak})
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(args, proc.returncode, out.read(), err.read())


def offline_env(sd2: SD2Base, home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    return {**env, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(sd2.cache), "HF_HOME": str(home),
            "PYTHONUNBUFFERED": "1", "GRADIO_ANALYTICS_ENABLED": "False"}


def write_sd2_base(root: Path) -> None:
    """The pipeline in a hub cache ``root/hub`` under HUB_ID (refs/main), and as one file in the original layout,
    ``root/checkpoints/sd2-base.safetensors``."""
    import torch
    from transformers import CLIPTokenizer

    from models.checkpoints.clip_bpe import write_clip_tokenizer
    from models.checkpoints.components import assemble_pipeline, build_unet, random_text_encoder, random_vae
    from models.families import family_named

    from .original_layout import write_single_file

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = CLIPTokenizer.from_pretrained(write_clip_tokenizer(tmp, pad_token="!"))
    parts = {"unet": build_unet("sd2-base"), "vae": random_vae("sd2-base"), "text_encoder": random_text_encoder("sd2-base")}
    pipe = assemble_pipeline(family_named("sd2"), parts, {"tokenizer": tokenizer}, {"prediction_type": "epsilon"})
    (root / "checkpoints").mkdir()
    write_single_file(pipe, root / "checkpoints" / "sd2-base.safetensors", "sd2")
    with tempfile.TemporaryDirectory(dir=root) as folder:
        pipe.save_pretrained(folder, safe_serialization=True)
        write_hub_snapshot(root / "hub", HUB_ID, Path(folder), commit_hash("sd2-base"), refs=("main",))


@pytest.fixture(scope="module")
def sd2(tmp_path_factory) -> SD2Base:
    from evaluate.scorers.features import write_random_inception
    from train.shapes import write_shapes_dataset

    root = tmp_path_factory.mktemp("full-size")
    # in a process of its own: this one stays small while the steps run beside it
    subprocess.run([sys.executable, "-c", f"from tests.checkpoints.test_full_size import write_sd2_base; "
                    f"from pathlib import Path; write_sd2_base(Path({str(root)!r}))"], cwd=REPO, check=True)
    cache, single_file = root / "hub", root / "checkpoints" / "sd2-base.safetensors"
    write_shapes_dataset(root / "data", 8, seed=3, sizes=(SIZE,), n_eval=8, progress=False)
    return SD2Base(cache, single_file, root / "data", write_random_inception(root / "inception"))


def train_overrides(pretrained: str, save_folder: Path, data: Path) -> list[str]:
    """Phase 1 of the published recipe, cut to one batch of 2 on the CPU."""
    return [f"model.pretrained={pretrained}", f"data.path={data / str(SIZE)}", "data.num_workers=0",
            "global_train_batch_size=2", "device_train_microbatch_size=2", "max_duration=1ba", "save_interval=1ba",
            f"save_folder={save_folder}", "scheduler.t_warmup=1ba", "device=cpu", "precision=fp32", "fsdp=false",
            "low_precision_norms=false", "autoresume=false", "loggers=[]"]


def app_images(sd2: SD2Base, env: dict, roots: list[Path], refs: list[tuple[str, str]]) -> list[np.ndarray]:
    """`dwb app --checkpoints ROOTS`, asked through its API for one image of each (checkpoint, weights)."""
    from gradio_client import Client

    from ..servers import ServerProcess, free_port

    port = free_port()
    t = time.perf_counter()
    server = ServerProcess([DWB, "app", "--checkpoints", *roots, "--port", port, "--cache-size", "1"], port=port,
                           ready_path="/gradio_api/info", timeout=300.0, env=env, cwd=REPO).start()
    images = []
    try:
        with tempfile.TemporaryDirectory() as downloads:
            client = Client(server.url, verbose=False, download_files=downloads)
            for ref, weights in refs:
                gallery, _ = client.predict(ref, weights, PROMPT, "", "DPM++ 2M", 2, 5.0, SIZE, SIZE, 9, 1,
                                            api_name="/generate")
                with Image.open(gallery[0]["image"]) as im:
                    images.append(np.asarray(im.convert("RGB")))
        peak = peak_gb(server.proc.pid)
    finally:
        server.stop()
    STEPS.append({"step": f"app: start, {len(refs)} images", "seconds": time.perf_counter() - t, "peak_gb": peak})
    return images


@pytest.mark.parametrize("kind", ["hub id", "single file"])
def test_sd2_base_trains_exports_samples_is_scored_and_opens_in_the_app(kind, sd2, tmp_path):
    home = tmp_path / "hf-home"
    home.mkdir()
    env = offline_env(sd2, home)
    base = HUB_ID if kind == "hub id" else str(sd2.single_file)
    run = tmp_path / "run"

    trained = run_step(f"{kind}: train phase 1, 1 batch", ["train", "configs/sd2-base-phase1.yaml",
                                                           *train_overrides(base, run, sd2.data)], env, REPO)
    assert trained.returncode == 0, trained.stderr[-3000:]
    [checkpoint] = run.glob("ep*-ba1-rank0.pt")

    exported = run_step(f"{kind}: export", ["export", str(checkpoint), str(tmp_path / "export")], env, REPO)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert (tmp_path / "export" / "unet" / "diffusion_pytorch_model.safetensors").is_file()

    for name, ref in (("base", base), ("trained", str(checkpoint))):
        grid = tmp_path / f"{name}.png"
        sampled = run_step(f"{kind}: sample {name}", ["sample", ref, str(grid), "--prompt", PROMPT, "--seeds", "2",
                                                      "--steps", "2", "--size", str(SIZE)], env, REPO)
        assert sampled.returncode == 0, sampled.stderr[-3000:]
        with Image.open(grid) as im:
            assert im.width >= 2 * SIZE and np.asarray(im).std() > 5  # two pictures, not a blank sheet

    scored = run_step(f"{kind}: evaluate run (base, trained)", [
        "evaluate", "run", base, str(checkpoint), "--out", str(tmp_path / "ev"), "--reference",
        str(sd2.data / "eval" / str(SIZE)), "--inception-weights", str(sd2.inception), "--inception-features", "64",
        "--prompts", "shapes", "--n-prompts", "4", "--n-reference", "8", "--guidance", "5", "--steps", "2",
        "--size", str(SIZE), "--kid-subset-size", "2", "--kid-subsets", "2", "--device", "cpu"], env, REPO)
    assert scored.returncode == 0, scored.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "ev" / "results.jsonl").read_text().splitlines()]
    # a hub id is named by its id; a file in a checkpoints/ folder by the folder above it and its name
    assert rows[0]["model"] == (HUB_ID if kind == "hub id" else f"{sd2.single_file.parent.parent.name}/sd2-base")
    assert all(np.isfinite(r["fid"]) and len(r["checkpoint_hash"]) == 12 for r in rows) and len(rows) == 2

    base_image, trained_image, exported_image = app_images(
        sd2, env, [tmp_path, sd2.single_file.parent],
        [(base, "ema"), (str(checkpoint), "raw"), (str(tmp_path / "export"), "raw")])
    assert np.array_equal(trained_image, exported_image)  # the export holds the weights the checkpoint does
    assert base_image.std() > 5 and trained_image.std() > 5
    assert not any(home.rglob("*")), "something was written into HF_HOME"


def test_the_hub_id_and_the_single_file_are_the_same_model_in_the_app(sd2, tmp_path):
    home = tmp_path / "hf-home"
    home.mkdir()
    by_id, by_file = app_images(sd2, offline_env(sd2, home), [sd2.single_file.parent],
                                [(HUB_ID, "ema"), (str(sd2.single_file), "ema")])
    assert np.array_equal(by_id, by_file)
