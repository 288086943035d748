"""--parts FOLDER_OR_HUB_ID: where a single file's other parts come from (text encoders, tokenizers, VAE, scheduler,
configs), instead of NAME.config/ beside it: a diffusers folder or a hub id in the local cache, checked like any
folder, in `dwb sample`, `dwb evaluate` and the app's Parts field (under the app's folders only)."""
from __future__ import annotations

import inspect
import shutil

import numpy as np
import pytest
import torch

from app.generate import GenerationParams
from app.service import Service
from models.checkpoints import find_checkpoint, load_pipeline
from models.errors import WorkbenchError
from models.generation import Settings, generate_images

from ..checkpoints.fixtures import commit_hash, write_hub_snapshot
from .test_flux_single_file import write_flux_file

PROMPT, SEED = "a red circle", 3
SETTINGS = Settings(steps=1, guidance=3.5, width=32, height=32, sampler="Euler")
HUB_ID = "dwb-test/tiny-flux-schnell"


@pytest.fixture(scope="module")
def parts_tree(family_folders, tmp_path_factory):
    """Under one folder (the app's root): a Flux.1-schnell transformer file with nothing beside it, its folder
    (the parts), and an SD3 folder (another family's parts). The same folder in a hub cache, as HUB_ID."""
    root = tmp_path_factory.mktemp("parts-root")
    file, _ = write_flux_file(family_folders["flux-schnell"], root / "flux1-schnell-tiny.safetensors")
    shutil.copytree(family_folders["flux-schnell"], root / "flux-schnell")
    shutil.copytree(family_folders["sd3"], root / "sd3")
    cache = tmp_path_factory.mktemp("hf-cache") / "hub"
    write_hub_snapshot(cache, HUB_ID, family_folders["flux-schnell"], commit_hash("main"), refs=("main",))
    return root, file, cache


def folder_image(folder) -> np.ndarray:
    """What the folder draws, its transformer's weights in memory of their own as a converted file's are (read in
    place from the mmapped file, the CPU's kernels round one pixel differently: tests/families/test_flux_single_file)."""
    pipe = load_pipeline(find_checkpoint(str(folder)))
    with torch.no_grad():
        for weight in pipe.transformer.parameters():
            weight.data = weight.data.clone()
    return generate_images(pipe, [PROMPT], [SEED], SETTINGS)


def test_parts_from_a_folder_and_from_a_cached_hub_id_draw_what_the_folder_draws(parts_tree, family_folders,
                                                                                 monkeypatch):
    root, file, cache = parts_tree
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    expected = folder_image(family_folders["flux-schnell"])
    for parts in (str(root / "flux-schnell"), HUB_ID):
        checkpoint = find_checkpoint(str(file), parts=parts)
        assert checkpoint.parts is not None and (checkpoint.parts / "model_index.json").is_file()
        np.testing.assert_array_equal(generate_images(load_pipeline(checkpoint), [PROMPT], [SEED], SETTINGS), expected)


def one_line(refused) -> str:
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_parts_that_cannot_be_a_files_other_parts_are_one_line(parts_tree, family_folders, tmp_path, dwb):
    root, file, _ = parts_tree
    with pytest.raises(WorkbenchError) as refused:  # a missing folder
        find_checkpoint(str(file), parts=str(tmp_path / "nowhere"))
    assert one_line(refused) == f"parts not found: {tmp_path / 'nowhere'}"
    with pytest.raises(WorkbenchError) as refused:  # another family's folder
        find_checkpoint(str(file), parts=str(root / "sd3"))
    assert one_line(refused) == (f"{root / 'sd3'} holds Stable Diffusion 3.5 parts, not Flux.1 ones: give a diffusers "
                                 f"folder of the same model as the file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkbenchError) as refused:  # a folder that is no pipeline
        find_checkpoint(str(file), parts=str(tmp_path / "empty"))
    assert one_line(refused).endswith("a folder without model_index.json, not a diffusers pipeline")
    with pytest.raises(WorkbenchError) as refused:  # a checkpoint that holds its own parts
        find_checkpoint(str(root / "flux-schnell"), parts=str(root / "flux-schnell"))
    assert one_line(refused).endswith("parts are named for single files only")
    sidecar = shutil.copytree(family_folders["sd3"], tmp_path / "flux1.config")  # NAME.config/ of another family
    alone = shutil.copy(file, tmp_path / "flux1.safetensors")
    with pytest.raises(WorkbenchError) as refused:
        load_pipeline(find_checkpoint(str(alone)))
    assert one_line(refused) == f"{alone}: {sidecar} holds Stable Diffusion 3.5 parts, not Flux.1 ones: give a " \
                                f"diffusers folder of the same model as the file"
    run = dwb("sample", str(file), str(tmp_path / "grid.png"), "--parts", str(tmp_path / "nowhere"), "--seeds", "1")
    assert run.returncode != 0 and run.stderr.strip() == f"error: parts not found: {tmp_path / 'nowhere'}"
    assert not (tmp_path / "grid.png").exists()


def test_the_apps_parts_are_under_its_folders_and_refusals_name_no_server_path(parts_tree, family_folders):
    root, file, _ = parts_tree
    app = Service([root], cache_size=1)
    params = GenerationParams(PROMPT, sampler="Euler", steps=1, guidance=3.5, width=32, height=32, seed=SEED)
    made = app.generate(file.name, "auto", params, parts="flux-schnell")
    np.testing.assert_array_equal(np.asarray(made.images[0]), folder_image(family_folders["flux-schnell"])[0])
    outside = family_folders["flux-schnell"]  # a real pipeline, outside the app's folders
    for parts, words in ((str(outside), "is outside the allowed checkpoint folders"),
                         ("sd3", "holds Stable Diffusion 3.5 parts, not Flux.1 ones"),
                         ("missing-folder", "parts not found: missing-folder")):
        with pytest.raises(WorkbenchError) as refused:
            app.generate(file.name, "auto", params, parts=parts)
        message = app.for_client(one_line(refused))
        assert words in message and str(root) not in message and str(outside.parent) not in message


def test_the_apps_generate_event_takes_the_parts_field(parts_tree):
    from app.handlers import Handlers
    from app.ui import build_ui

    root, _, _ = parts_tree
    demo, _ = build_ui(Service([root], cache_size=1))
    generate = next(d for d in demo.config["dependencies"] if d.get("api_name") == "generate")
    parts = next(c for c in demo.config["components"] if c.get("props", {}).get("elem_id") == "parts")
    taken = [name for name in inspect.signature(Handlers.generate).parameters if name not in ("self", "request",
                                                                                               "progress")]
    assert generate["inputs"][taken.index("parts")] == parts["id"]


def test_evaluate_takes_parts_as_a_scoring_option():
    from dwb import build_parser
    from evaluate.cli import config_from_args

    for command in (["run", "a.safetensors"], ["compare", "a", "b"]):
        args = build_parser().parse_args(["evaluate", *command, "--parts", "org/name", "--out", "o",
                                          "--reference", "r"])
        assert config_from_args(args).parts == "org/name"
