"""What a new user met with `dwb sample`: one size rule that refuses only what a family cannot draw (a side off its
step) and what the command's limits hold, never the size a checkpoint was trained at (a mosaicml/diffusion SD 2
checkpoint trained at 32 px); an aspect whose bucket is the square is one line, not a silent square; a refused
refiner prints no recommended settings first; `dwb --help` names every family; a folder load prints no progress bar.
(The mosaicml/diffusion checkpoint drawn at its 32 px: tests/checkpoints/test_mosaicml.py, beside its fixture.)
"""
from __future__ import annotations

import shutil

import pytest


def _configs_only(folder, tmp_path):
    """A family folder without its weights: what is refused before the weights are read is refused as well."""
    out = tmp_path / folder.name
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    return out


@pytest.mark.parametrize("aspect", ["16:9", "2:1"])
def test_an_aspect_whose_bucket_is_the_square_is_one_line(family_folders, tmp_path, dwb, aspect):
    """Friction 7: `--aspect 16:9` and `--aspect 2:1` on a 32 px model silently drew a square (on Flux.1's step of
    16, a budget of 32 px has no other bucket)."""
    out = tmp_path / "x.png"
    r = dwb("sample", str(_configs_only(family_folders["flux-schnell"], tmp_path)), str(out), "--size", "32",
            "--aspect", aspect, "--steps", "1")
    assert r.returncode != 0 and not out.exists()
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: the {aspect} bucket of 32 px on Flux.1's step of 16 is the square 32x32: no bucket of that budget is "
        "nearer the aspect; give a larger --size")


def test_a_refused_refiner_prints_no_recommended_settings_first(family_folders, tmp_path, dwb):
    """Friction 13: the base's recommended settings were announced, then the refiner refused."""
    r = dwb("sample", str(family_folders["sdxl"]), str(tmp_path / "x.png"), "--refiner", str(family_folders["sdxl"]))
    assert r.returncode != 0 and "not a refiner" in r.stderr.strip().splitlines()[-1]
    assert "recommended" not in r.stdout and r.stdout == ""


def test_dwb_help_names_every_family(dwb):
    """Friction 14: `dwb --help` said "SD2 models"."""
    r = dwb("--help")
    assert r.returncode == 0 and "SD2 models" not in r.stdout
    assert "text-to-image models (SD 1/2, SDXL, SD3, Flux.1)" in " ".join(r.stdout.split())


def test_a_folder_load_prints_no_progress_bar(family_folders, tmp_path, dwb):
    """Friction 16: every folder load printed diffusers' "Loading pipeline components" bar."""
    r = dwb("sample", str(family_folders["sd3"]), str(tmp_path / "x.png"), "--prompt", "a red circle", "--steps", "1",
            "--seeds", "1", "--size", "32")
    assert r.returncode == 0, r.stderr
    assert "Loading pipeline components" not in r.stderr and "it/s" not in r.stderr
