"""`dwb sample`'s PNGs carry their parameters in AUTOMATIC1111's text convention: each image on its own with
``--per-image``, and the grid the first cell's (as A1111 writes a grid's), read back alike by the app's PNG Info
and by two independent readers from PyPI; its seeds, negative prompt and settings are the ones asked for."""
import json

import numpy as np
import pytest
from PIL import Image

from models.generation import ImageRecord, Settings, generate_images

from ..png_readers import expected_fields, read_by_every_reader

PROMPTS = ["a red circle", "two blue squares, left of a green triangle"]


def record_in(path) -> ImageRecord:
    with Image.open(path) as im:
        return ImageRecord.from_json(json.loads(im.info["dwb"]))


@pytest.mark.slow
def test_sample_writes_every_image_and_the_grid_with_the_parameters_asked_for(tiny_run, tmp_path, dwb):
    from models.checkpoints import content_hash, find_checkpoint, load_pipeline

    ckpt = tiny_run / "ep0-ba4-rank0.pt"
    out = tmp_path / "grid.png"
    args = ["--seed", "4000000000", "--seeds", "2", "--negative-prompt", "blurry, dark", "--sampler", "Euler a",
            "--steps", "3", "--guidance", "4.5", "--size", "24", "--weights", "raw", "--per-image"]
    r = dwb("sample", str(ckpt), str(out), *[a for p in PROMPTS for a in ("--prompt", p)], *args)
    assert r.returncode == 0, r.stderr
    found = find_checkpoint(str(ckpt))
    asked = dict(negative_prompt="blurry, dark", sampler="Euler a", steps=3, guidance=4.5, width=24, height=24,
                 checkpoint=found.label, checkpoint_hash=content_hash(found), weights="raw")
    images = sorted((tmp_path / "grid").glob("*.png"))
    cells = [(p, s) for p in PROMPTS for s in (4000000000, 4000000001)]
    assert [i.name for i in images] == ["00000-4000000000.png", "00001-4000000001.png", "00002-4000000000.png",
                                        "00003-4000000001.png"]
    pipe = load_pipeline(found, ema=False)
    settings = Settings(steps=3, guidance=4.5, width=24, height=24, sampler="Euler a", negative_prompt="blurry, dark")
    for path, (prompt, seed) in zip(images, cells):
        record = record_in(path)
        assert record == ImageRecord(prompt=prompt, seed=seed, **asked)
        assert all(fields == expected_fields(record) for fields in read_by_every_reader(path).values())
    # each PNG is the image its parameters make: the app's generation path with that seed
    again = generate_images(pipe, [cells[-1][0]], [cells[-1][1]], settings)[0]
    with Image.open(images[-1]) as im:  # (one image alone, or four in one call: within 2 of 255 per channel)
        assert np.abs(np.asarray(im.convert("RGB")).astype(int) - again.astype(int)).max() <= 2
    grid = record_in(out)
    assert grid == record_in(images[0])  # the first cell's record, as A1111 writes a grid's
    assert all(fields == expected_fields(grid) for fields in read_by_every_reader(out).values())
    with Image.open(out) as im:
        assert json.loads(im.info["dwb"])["grid"] == {"prompts": PROMPTS, "seeds": [4000000000, 4000000001]}


@pytest.mark.parametrize("args, message", [
    (["--steps", "151"], "--steps: 151 is not between 1 and 150"),
    (["--size", "20"], "--size: 20 is not a multiple of 8"),
    (["--size", "1032"], "--size: 1032 is not between 16 and 1024"),
    (["--guidance", "31"], "--guidance: 31 is not between 0 and 30"),
    (["--guidance", "nan"], "--guidance: nan is not between 0 and 30"),
    (["--seed", "4294967295", "--seeds", "2"], "--seed 4294967295 and --seeds 2 go past the last seed, 4294967295"),
    (["--seed", "-2"], "--seed: -2 is not between -1 and 4294967295"),
])
def test_sample_refuses_what_the_app_refuses_in_one_line(args, message, tiny_run, tmp_path, dwb):
    r = dwb("sample", str(tiny_run / "ep0-ba4-rank0.pt"), str(tmp_path / "g.png"), *args)
    assert r.returncode != 0 and message in r.stderr.strip().splitlines()[-1], r.stderr  # argparse's usage, then one line
    assert not (tmp_path / "g.png").exists()
