"""`dwb sample` at any aspect: `--size WIDTHxHEIGHT`, `--aspect W:H` (the aspect bucket of the native size on the
family's step), each recorded as A1111's `Size: WxH`; a size the family cannot draw is one line before its weights
are read."""
import shutil

import pytest
from PIL import Image

from models.checkpoints import describe, find_checkpoint
from models.generation import bucket_set, nearest_bucket
from models.families import family_named

from .png_readers import read_by_every_reader


def _sizes(out) -> set[tuple[str, tuple[int, int]]]:
    """(Size as every PNG reader reads it, the pixels' size) of each image written beside the grid."""
    found = set()
    for path in sorted(out.with_suffix("").glob("*.png")):
        with Image.open(path) as image:
            found |= {(fields["size"], image.size) for fields in read_by_every_reader(path).values()}
    return found


def test_aspect_draws_the_bucket_of_the_native_size_and_size_takes_width_x_height(family_folders, tiny_run,
                                                                                    tmp_path, dwb):
    sdxl = family_named("sdxl")
    native = describe(find_checkpoint(family_folders["sdxl"])).resolution  # its UNet's sample size x its VAE's scale
    width, height = nearest_bucket((2, 1), bucket_set(native, sdxl.size_step()))
    out = tmp_path / "wide.png"
    r = dwb("sample", str(family_folders["sdxl"]), str(out), "--prompt", "a red circle", "--steps", "1",
            "--seeds", "2", "--aspect", "2:1", "--per-image")
    assert r.returncode == 0, r.stderr
    assert width > height and _sizes(out) == {(f"{width}x{height}", (width, height))}
    assert f"{width}x{height} px" in r.stdout

    out = tmp_path / "tall.png"  # this workbench's own checkpoint (SD 2's family), trained at 16 px
    r = dwb("sample", str(tiny_run / "ep0-ba4-rank0.pt"), str(out), "--prompt", "a red circle", "--steps", "1",
            "--seeds", "1", "--size", "16x32", "--per-image")
    assert r.returncode == 0, r.stderr
    assert _sizes(out) == {("16x32", (16, 32))}
    with Image.open(out) as grid:
        assert "Size: 16x32" in grid.text["parameters"]  # the grid carries its first image's parameters


@pytest.mark.parametrize("args, message", [
    (["--size", "72x64"], "Stable Diffusion 3.5 draws sides that are multiples of 16; --size is 72x64"),
    (["--size", "1024", "--aspect", "4:1"], "the 4:1 bucket of 1024 px is 2048x512: each side is drawn from 16 to "
                                            "1024 px"),
    (["--size", "64x32", "--aspect", "2:1"], "give --size WIDTHxHEIGHT or --aspect W:H"),
    (["--size", "64x"], "--size: size '64x' is neither a side (512) nor WIDTHxHEIGHT (768x512)"),
    (["--aspect", "5:1"], "--aspect: aspect must be from 1:4 to 4:1, got 5:1"),
])
def test_a_size_the_family_cannot_draw_is_one_line_before_its_weights_are_read(family_folders, tmp_path, dwb,
                                                                                args, message):
    r = dwb("sample", str(_configs_only(family_folders, tmp_path)), str(tmp_path / "x.png"), "--steps", "1", *args)
    assert r.returncode != 0 and message in r.stderr.strip().splitlines()[-1], r.stderr
    assert not (tmp_path / "x.png").exists()


def _configs_only(family_folders, tmp_path):
    """The tiny SD3 folder without its weights: what is refused before the weights are read is refused as well."""
    folder = tmp_path / "sd3"
    shutil.copytree(family_folders["sd3"], folder, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    return folder


def test_a_size_it_draws_goes_on_to_the_weights(family_folders, tmp_path, dwb):
    r = dwb("sample", str(_configs_only(family_folders, tmp_path)), str(tmp_path / "x.png"), "--steps", "1",
            "--aspect", "2:1")
    assert r.returncode != 0 and "multiples of" not in r.stderr and "each side is drawn" not in r.stderr
    assert "the weight files in transformer/ hold 0 values" in r.stderr.strip().splitlines()[-1]  # none there
