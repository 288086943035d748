"""`dwb sample --prompts FILE`: a CSV/TSV with a prompt column and optional seed, size and negative_prompt columns,
or a text file of one prompt a line. Each row draws the image `--prompt` with its own seed, size and negative
prompt draws, and records them; a row that is not one is one line before the checkpoint is opened."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image


def _images(folder) -> dict[str, tuple[np.ndarray, str]]:
    """name -> (pixels, parameters) of each image written beside a grid."""
    found = {}
    for path in sorted(folder.glob("*.png")):
        with Image.open(path) as png:
            found[path.name] = (np.asarray(png.convert("RGB")), png.text["parameters"])
    return found


def test_each_row_draws_what_its_own_prompt_seed_size_and_negative_prompt_draw(family_folders, tmp_path, dwb):
    sd3 = str(family_folders["sd3"])
    table = tmp_path / "prompts.tsv"
    table.write_text("prompt\tseed\tsize\tnegative_prompt\n"
                     "a red circle\t5\t32x48\tblurry\n"
                     "two blue squares\t\t\t\n")
    common = ("--steps", "1", "--seeds", "2", "--size", "32", "--sampler", "Euler", "--per-image")
    r = dwb("sample", sd3, str(tmp_path / "grid.png"), "--prompts", str(table), *common)
    assert r.returncode == 0, r.stderr
    rows = _images(tmp_path / "grid")
    assert list(rows) == ["00000-5.png", "00001-6.png", "00002-0.png", "00003-1.png"]
    own = dwb("sample", sd3, str(tmp_path / "own.png"), "--prompt", "a red circle", "--seed", "5",
              "--negative-prompt", "blurry", "--steps", "1", "--seeds", "2", "--size", "32x48", "--sampler", "Euler",
              "--per-image")
    plain = dwb("sample", sd3, str(tmp_path / "plain.png"), "--prompt", "two blue squares", *common)
    assert own.returncode == 0 == plain.returncode, own.stderr + plain.stderr
    expected = [*_images(tmp_path / "own").values(), *_images(tmp_path / "plain").values()]
    for (pixels, parameters), (want, want_parameters) in zip(rows.values(), expected):
        assert np.array_equal(pixels, want) and parameters == want_parameters
    assert rows["00000-5.png"][0].shape == (48, 32, 3) and "Negative prompt: blurry" in rows["00000-5.png"][1]
    assert "Negative prompt" not in rows["00002-0.png"][1] and "Size: 32x32" in rows["00002-0.png"][1]
    with Image.open(tmp_path / "grid.png") as grid:
        assert "Seed: 5, Size: 32x48" in grid.text["parameters"]  # the grid carries its first image's


def test_a_text_file_is_one_prompt_a_line(family_folders, tmp_path, dwb):
    text = tmp_path / "prompts.txt"
    text.write_text("# shapes\na red circle\n\n  two blue squares  \n")
    r = dwb("sample", str(family_folders["sd3"]), str(tmp_path / "grid.png"), "--prompts", str(text), "--steps", "1",
            "--seeds", "1", "--size", "32", "--per-image")
    assert r.returncode == 0, r.stderr
    assert f"2 prompts from {text}" in r.stdout
    prompts = [parameters.splitlines()[0] for _, parameters in _images(tmp_path / "grid").values()]
    assert prompts == ["a red circle", "two blue squares"]


@pytest.mark.parametrize("rows, message", [
    ("prompt,seed\na red circle,abc\n", "prompt 1 ('a red circle'): seed must be a whole number from 0 to 4294967295, "
                                        "got 'abc'"),
    ("prompt,size\na red circle\ntwo squares,20\n", "prompt 2 ('two squares'): 20 is not a multiple of 8"),
    ("prompt,seed\na red circle,4294967295\n", "--seed 4294967295 and --seeds 4 go past the last seed, 4294967295"),
    ("caption\n\n", "holds a header but no prompts"),
])
def test_a_row_that_is_not_one_is_one_line_before_the_checkpoint_is_opened(tmp_path, dwb, rows, message):
    table = tmp_path / "prompts.csv"
    table.write_text(rows)
    r = dwb("sample", str(tmp_path / "no-such-checkpoint"), str(tmp_path / "x.png"), "--prompts", str(table))
    assert r.returncode != 0 and message in r.stderr.strip().splitlines()[-1], r.stderr


def test_prompt_and_prompts_are_one_or_the_other(tmp_path, dwb):
    (tmp_path / "p.txt").write_text("a red circle\n")
    r = dwb("sample", "x", str(tmp_path / "x.png"), "--prompt", "a", "--prompts", str(tmp_path / "p.txt"))
    assert r.returncode != 0 and "give --prompt (repeatable) or --prompts FILE, not both" in r.stderr
