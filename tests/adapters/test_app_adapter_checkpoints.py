"""A run's adapter checkpoints in the app, used by name as LoRA files are: an X/Y/Z LoRA axis over two of them
(``ep0-ba2``, ``ep0-ba4``) draws in each cell what `dwb sample --lora` draws with that checkpoint exported by
`dwb export`, and its ``Lora hashes`` names that file's AUTOMATIC1111 short hash; the export lands in the app's own
cache (never the user's folders), once per version of the checkpoint's file; a checkpoint linked in from outside
the folders is not listed, and no message names a server path.

The session's tiny SD 2 LoRA run (tests/adapters/conftest.py) and its base, copied under the app's one folder."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from app.generate import GenerationParams
from app.handlers import Handlers
from app.service import Runtime, Service
from models.adapters import a1111_short_hash
from models.errors import WorkbenchError
from models.generation import DEFAULT_SAMPLER, parse_parameters
from models.readers import read_safetensors_head

SETTINGS = dict(steps=2, guidance=5.0, width=16, height=16, seed=3, sampler=DEFAULT_SAMPLER)
NAMES = ("ep0-ba2", "ep0-ba4")


def _short_hash(path) -> str:
    return a1111_short_hash(path, read_safetensors_head(path).header_bytes)


def _sampled(main, base, lora, out) -> np.ndarray:
    """`dwb sample --lora FILE:1`'s one image at the plot's settings (``--per-image``: in OUT/)."""
    assert main(["sample", str(base), str(out.with_suffix(".png")), "--prompt", "a red circle", "--seeds", "1", "--seed",
                 str(SETTINGS["seed"]), "--steps", "2", "--size", "16", "--guidance", "5", "--sampler",
                 DEFAULT_SAMPLER, "--lora", f"{lora}:1", "--per-image"]) == 0
    return np.asarray(Image.open(out / f"00000-{SETTINGS['seed']}.png").convert("RGB"))


@pytest.fixture(scope="module")
def app_of_run(lora_runs, sd2_folder, tmp_path_factory):
    """(the app's Service over base/ and run/checkpoints/, its folder, its adapter cache, a folder beside it)."""
    _, trained = lora_runs("sd2")
    top = tmp_path_factory.mktemp("app-adapters")
    root, cache, outside = top / "root", top / "cache", top / "outside"
    (root / "run" / "checkpoints").mkdir(parents=True)
    outside.mkdir()
    shutil.copytree(sd2_folder, root / "base")
    for name in NAMES:
        shutil.copy(trained / f"{name}-rank0.pt", root / "run" / "checkpoints")
    shutil.copy(trained / "ep0-ba4-rank0.pt", outside / "ep0-ba6-rank0.pt")
    os.symlink(outside / "ep0-ba6-rank0.pt", root / "run" / "checkpoints" / "ep0-ba6-rank0.pt")
    service = Service([root], runtime=Runtime("cpu", torch.float32), cache_size=4, adapter_cache=cache)
    return service, root, cache, outside


def test_an_xyz_axis_over_adapter_checkpoints_draws_what_dwb_sample_draws_with_each_exported(app_of_run, tmp_path):
    from dwb import main

    service, root, cache, _ = app_of_run
    before = sorted(p for p in root.rglob("*"))
    plot = service.xyz_plot("base", "auto", GenerationParams("a red circle", **SETTINGS),
                            [("lora", ", ".join(NAMES)), ("none", ""), ("none", "")], 1)
    assert [r.prompt for r in plot.cells.records] == [f"a red circle <lora:{n}:1>" for n in NAMES]
    cells = [np.asarray(image.convert("RGB")) for image in plot.cells.images]
    for name, cell, image in zip(NAMES, cells, plot.cells.images):
        exported = tmp_path / f"{name}.safetensors"  # the adapter as AUTOMATIC1111 reads it: `dwb export`'s file
        assert main(["export", str(root / "run" / "checkpoints" / f"{name}-rank0.pt"), str(exported), "--layout",
                     "kohya", "--weights", "ema"]) == 0
        np.testing.assert_array_equal(cell, _sampled(main, root / "base", exported, tmp_path / name))
        assert parse_parameters(image.info["parameters"])["Lora hashes"] == f"{name}: {_short_hash(exported)}"
    assert np.abs(cells[0].astype(int) - cells[1].astype(int)).max() > 0  # the two checkpoints draw differently
    assert sorted(p for p in root.rglob("*")) == before  # nothing written into the user's folders
    assert len(list(cache.rglob("*.safetensors"))) == 2  # one export a checkpoint, in the app's own cache


def test_the_picker_lists_the_runs_checkpoints_and_a_rewritten_one_is_exported_again(app_of_run):
    service, root, cache, _ = app_of_run
    labels = Handlers(service).lora_labels()
    assert labels == [f"run/checkpoints/{n}-rank0.pt" for n in NAMES]  # the one linked in from outside is not
    assert [c.label for c in service.checkpoints()] == ["base"]  # listed as LoRAs, not as models to draw with
    assert Handlers(service).add_lora("a red circle", labels[0], 0.5) == "a red circle <lora:ep0-ba2:0.5>"
    hashes = [service.loras.chosen(f"<lora:{n}:1>")[1][0].hash for n in NAMES]
    assert hashes[0] != hashes[1]
    ba2 = root / "run" / "checkpoints" / "ep0-ba2-rank0.pt"
    shutil.copy(root / "run" / "checkpoints" / "ep0-ba4-rank0.pt", ba2)  # the checkpoint rewritten in place
    os.utime(ba2, ns=(ba2.stat().st_atime_ns, ba2.stat().st_mtime_ns + 10**9))
    assert service.loras.chosen("<lora:ep0-ba2:1>")[1][0].hash == hashes[1]  # exported again: ba4's adapter now

    with pytest.raises(WorkbenchError) as e:
        service.generate("base", "auto", GenerationParams("a red circle <lora:ep0-ba6:1>", **SETTINGS))
    message = str(e.value)
    assert "unknown LoRA" in message and "\n" not in message
    assert all(str(p) not in message for p in (root, cache, app_of_run[3]))


def test_an_adapter_checkpoint_opened_as_a_model_says_how_its_adapter_is_drawn(lora_runs):
    """Opened where a whole model is wanted (`dwb sample`, the app's checkpoint list, evaluate), an adapter checkpoint
    is one line that names the file alone and says how to draw it, not a count of the weights it lacks."""
    from models.checkpoints import find_checkpoint, load_pipeline

    _, folder = lora_runs("sd2")
    with pytest.raises(WorkbenchError) as e:
        load_pipeline(find_checkpoint(str(folder / "ep0-ba4-rank0.pt")), device="cpu")
    message = str(e.value)
    assert "\n" not in message and str(folder) not in message
    assert message.startswith("ep0-ba4-rank0.pt holds a lora adapter alone") and "dwb export ep0-ba4-rank0.pt" in message
