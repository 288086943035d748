"""Session fixtures: one reduced SD 2.x pipeline as a diffusers folder, in a hub cache and as single files."""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from .fixtures import commit_hash, reduced_pipeline, write_hub_snapshot
from .original_layout import write_single_file

HUB_REPO = "dwb-test/tiny-sd2"


@dataclass
class HubCache:
    cache: Path  # what HF_HUB_CACHE points at
    repo: str
    main: str  # commit of refs/main: the `sd2_folder` pipeline
    other: str  # commit of refs/v2: the same pipeline with another UNet
    main_snapshot: Path
    other_snapshot: Path


@pytest.fixture(scope="session")
def sd2_folder(tmp_path_factory) -> Path:
    """The reduced SD 2.x pipeline (v prediction) as a diffusers folder: the reference every kind is compared to."""
    folder = tmp_path_factory.mktemp("sd2-folder") / "pipeline"
    reduced_pipeline("sd2", "v_prediction", seed=0).save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="session")
def single_files(tmp_path_factory, sd2_folder) -> dict[str, tuple[Path, Path]]:
    """``{name: (single file, the same weights as a diffusers folder)}``: sd2 as .safetensors and .ckpt
    (``sd2_folder``'s weights, v prediction) and sd1 as .safetensors (epsilon), with sidecar original configs."""
    from diffusers import StableDiffusionPipeline

    out = tmp_path_factory.mktemp("single-files")
    sd2 = StableDiffusionPipeline.from_pretrained(sd2_folder, safety_checker=None)
    sd1 = reduced_pipeline("sd1", "epsilon", seed=1)
    sd1.save_pretrained(out / "sd1-folder", safe_serialization=True)
    return {
        "sd2": (write_single_file(sd2, out / "sd2.safetensors", "sd2", prediction_type="v_prediction"), sd2_folder),
        "sd2-ckpt": (write_single_file(sd2, out / "sd2.ckpt", "sd2", prediction_type="v_prediction"), sd2_folder),
        "sd1": (write_single_file(sd1, out / "sd1.safetensors", "sd1", prediction_type="epsilon"), out / "sd1-folder"),
    }


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory, sd2_folder) -> HubCache:
    """A Hugging Face cache holding HUB_REPO at two revisions: main (``sd2_folder``) and branch v2."""
    from diffusers import UNet2DConditionModel

    cache = tmp_path_factory.mktemp("hf-cache") / "hub"
    main, other = commit_hash("main"), commit_hash("v2")
    main_snapshot = write_hub_snapshot(cache, HUB_REPO, sd2_folder, main, refs=("main",))
    v2 = tmp_path_factory.mktemp("sd2-v2") / "pipeline"
    shutil.copytree(sd2_folder, v2)
    unet = UNet2DConditionModel.from_pretrained(sd2_folder, subfolder="unet")
    for p in unet.parameters():
        p.data.mul_(1.5)
    unet.save_pretrained(v2 / "unet")
    other_snapshot = write_hub_snapshot(cache, HUB_REPO, v2, other, refs=("v2",))
    return HubCache(cache, HUB_REPO, main, other, main_snapshot, other_snapshot)
