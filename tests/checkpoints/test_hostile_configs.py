"""Hostile numbers in a checkpoint's own files, as `dwb sample` meets them: a part's config that builds far more than
its weights hold, layer counts of 10^9, -1, 0 and NaN, a recorded native size past what `--size` takes or no size at
all, a Flux.1 file without the weights diffusers' converter reads. Each is one line naming the file and the key or
weight, with nothing drawn.

The attacks that once took gigabytes or minutes run in a forked process under a cap on its data memory (RLIMIT_DATA)
and a deadline, so that a regression fails in a minute at most instead of filling the machine."""
from __future__ import annotations

import contextlib
import io
import json
import math
import multiprocessing
import queue
import re
import resource
import shutil
from pathlib import Path

import pytest
import torch

from models.checkpoints import find_checkpoint
from models.readers.plain import SAFE_TYPES
from models.families import family_or_ours
from models.generation import MAX_SIZE, MIN_SIZE

GiB = 1 << 30
DATA_CAP = 2 * GiB  # `dwb sample` of these tiny models peaks under 1 GiB; the attacks asked for 3 to 19 GiB
DEADLINE_S = 60  # each bounded attack: refused in a second now; before, they built or drew for minutes


def _edited_folder(src: Path, out: Path, part: str, **changes) -> Path:
    """A copy of the diffusers folder ``src`` whose ``part/config.json`` says ``changes``."""
    shutil.copytree(src, out)
    config = out / part / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **changes}))
    return out


def _with_spec(src: Path, out: Path, change) -> Path:
    """A copy of the Composer checkpoint ``src`` whose model spec ``change`` edits in place."""
    with torch.serialization.safe_globals(SAFE_TYPES):
        ckpt = torch.load(src, map_location="cpu", weights_only=True)
    change(ckpt["state"]["callbacks"]["ModelSpec"]["spec"])
    torch.save(ckpt, out)
    return out


def _one_error_line(stderr: str, code: object = 1) -> str:
    """The one line `dwb` printed for a refusal (exit code ``code``: 1, or what stopped a bounded run)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), f"exit {code!r}: {stderr[-2000:]}"
    assert "Traceback" not in stderr
    return lines[0]


def _data_used() -> int:
    """This process's data segment (heap and anonymous mappings): what RLIMIT_DATA limits."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData:"))


def sample_bounded(checkpoint: Path, out: Path, *flags: str) -> tuple[object, str]:
    """`dwb sample CHECKPOINT OUT FLAGS` in a forked copy of this process (no new interpreter's imports) whose data
    memory may grow by DATA_CAP at most, for DEADLINE_S at most: (its exit code, or what stopped it; its stderr)."""
    from dwb import main

    fork = multiprocessing.get_context("fork")
    results = fork.Queue()

    def run() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (_data_used() + DATA_CAP, resource.RLIM_INFINITY))
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(["sample", str(checkpoint), str(out), "--steps", "1", "--seeds", "1", *flags])
            except BaseException as e:  # noqa: BLE001 - the test reads what stopped it
                code = f"{type(e).__name__}: {e}"
        results.put((code, err.getvalue()))

    child = fork.Process(target=run)
    child.start()
    try:
        return results.get(timeout=DEADLINE_S)
    except queue.Empty:
        return f"still running after {DEADLINE_S} s", ""
    finally:
        child.kill()
        child.join()


def test_an_sdxl_text_encoder_config_4096_wide_beside_a_one_value_file_is_refused_by_the_memory_plan(family_folders,
                                                                                                    tmp_path):
    """S4: text_encoder_2/config.json 4,096 wide x 24 layers beside a safetensors of one value. The plan counted the
    header's value and passed; transformers built the 5B weights the file lacks and drew them at random (19 GiB)."""
    from safetensors.torch import save_file

    folder = _edited_folder(family_folders["sdxl"], tmp_path / "sdxl", "text_encoder_2", hidden_size=4096,
                            intermediate_size=4 * 4096, num_hidden_layers=24, num_attention_heads=32,
                            projection_dim=4096)
    for weights in (folder / "text_encoder_2").glob("*.safetensors"):
        weights.unlink()
    save_file({"text_model.final_layer_norm.bias": torch.zeros(1)}, str(folder / "text_encoder_2" / "model.safetensors"))
    out = tmp_path / "grid.png"
    code, stderr = sample_bounded(folder, out)
    line = _one_error_line(stderr, code)
    assert not out.exists()
    assert "text_encoder_2/config.json builds a CLIPTextModelWithProjection of " in line, line
    assert "the weight files in text_encoder_2/ hold 1 value" in line, line
    built = int(re.search(r"of ([\d,]+) weights", line)[1].replace(",", ""))
    assert built > 4096 * 4096 * 24  # at least the layers' square matrices: what the config asks for is counted


def test_an_sd3_config_of_a_billion_blocks_is_one_line_before_any_is_built(family_folders, tmp_path):
    """S5: transformer/config.json num_layers 10^9 built blocks for 108 s and took 3 GiB before a weight was read."""
    folder = _edited_folder(family_folders["sd3"], tmp_path / "sd3", "transformer", num_layers=10**9)
    out = tmp_path / "grid.png"
    code, stderr = sample_bounded(folder, out, "--size", "64")
    line = _one_error_line(stderr, code)
    assert not out.exists()
    assert "transformer/config.json: num_layers must be a whole number from 1 to " in line, line
    assert line.endswith("got 1000000000"), line


def test_a_spec_config_of_a_billion_layers_is_one_line_before_any_is_built(tiny_run, tmp_path):
    """The same through a Composer checkpoint's spec: its unet config is built before its weights are loaded."""
    ckpt = _with_spec(tiny_run / "ep0-ba2-rank0.pt", tmp_path / "ep0-ba7-rank0.pt",
                      lambda spec: spec["unet"].update(layers_per_block=10**9))
    out = tmp_path / "grid.png"
    code, stderr = sample_bounded(ckpt, out)
    line = _one_error_line(stderr, code)
    assert not out.exists()
    assert "its spec's unet config: layers_per_block must be a whole number from 1 to " in line, line


@pytest.mark.parametrize("resolution", [16384, 2048])
def test_a_recorded_native_size_past_what_size_takes_draws_nothing_without_size(resolution, tiny_run, tmp_path):
    """K4: a spec recording resolution 16384 (3 GiB in 12 s) or 2048 (still drawing after 300 s on a CPU), and
    `dwb sample` with no --size: the recorded size was drawn at, though --size takes sides from 16 to 1024."""
    ckpt = _with_spec(tiny_run / "ep0-ba2-rank0.pt", tmp_path / "ep0-ba3-rank0.pt",
                      lambda spec: spec.update(resolution=resolution))
    out = tmp_path / "grid.png"
    code, stderr = sample_bounded(ckpt, out)
    line = _one_error_line(stderr, code)
    assert not out.exists()
    assert line.startswith(f"error: {find_checkpoint(str(ckpt)).label}") and str(resolution) in line, line
    if resolution <= family_or_ours(None).largest_side():  # a side it may have been trained at: only drawn, refused
        assert f"is not between {MIN_SIZE} and {MAX_SIZE}: give --size" in line, line
    else:
        assert "its spec's resolution must be a whole number of pixels from 1 to " in line, line


@pytest.mark.parametrize("resolution", [0, 2**40, "512"])
def test_a_spec_resolution_of_zero_2_40_or_text_is_one_line(resolution, tiny_run, tmp_path, dwb):
    """K3: 0 drew the native size and said "0 px", 2^40 was "Storage size calculation overflowed", text a TypeError."""
    ckpt = _with_spec(tiny_run / "ep0-ba2-rank0.pt", tmp_path / "ep0-ba3-rank0.pt",
                      lambda s: s.update(resolution=resolution))
    out = tmp_path / "grid.png"
    run = dwb("sample", str(ckpt), str(out), "--steps", "1", "--seeds", "1")
    line = _one_error_line(run.stderr, run.returncode)
    assert not out.exists()
    label = find_checkpoint(str(ckpt)).label
    assert line.startswith(f"error: {label}: its spec's resolution must be a whole number of pixels from 1 to "), line
    assert line.endswith(f"got {resolution!r}"), line


@pytest.mark.parametrize("layers", [-1, 0, math.nan])
def test_an_sd3_config_of_minus_one_zero_or_nan_blocks_draws_nothing(layers, family_folders, tmp_path, dwb):
    """S5: num_layers -1 or 0 built an MMDiT without blocks, ignored the file's blocks and drew an image, exit 0;
    NaN was a TypeError from inside diffusers naming no key."""
    folder = _edited_folder(family_folders["sd3"], tmp_path / "sd3", "transformer", num_layers=layers)
    out = tmp_path / "grid.png"
    run = dwb("sample", str(folder), str(out), "--steps", "1", "--seeds", "1", "--size", "64")
    line = _one_error_line(run.stderr, run.returncode)
    assert not out.exists()
    assert "transformer/config.json: num_layers must be a whole number from 1 to " in line, line
    assert line.endswith(f"got {layers!r}"), line


def test_a_flux_file_without_its_biases_names_the_file_and_a_missing_weight(family_folders, tmp_path, dwb):
    """S8: a Flux.1 transformer file with no biases: diffusers' converter raised a bare KeyError of one name."""
    from safetensors.torch import load_file, save_file

    from ..families.test_flux_single_file import write_flux_file

    whole, _ = write_flux_file(family_folders["flux-dev"], tmp_path / "whole.safetensors")
    weights = load_file(str(whole))
    biases = {k for k in weights if k.endswith(".bias")}
    path = tmp_path / "flux1-dev-no-biases.safetensors"
    save_file({k: v for k, v in weights.items() if k not in biases}, str(path))
    out = tmp_path / "grid.png"
    run = dwb("sample", str(path), str(out), "--parts", str(family_folders["flux-dev"]), "--steps", "1",
              "--seeds", "1", "--size", "64")
    line = _one_error_line(run.stderr, run.returncode)
    assert not out.exists()
    named = re.search(r"the weight (\S+) is missing", line)
    assert line.startswith(f"error: {path}: ") and named and named[1] in biases, line
