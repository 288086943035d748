"""Prompt sets, per-image seeds, PNG parameters, the manifest and the category grids."""
import json

import numpy as np
import pytest
from PIL import Image

from evaluate.prompts import load_prompts, read_prompt_table, shapes_prompts
from evaluate.samples import (MANIFEST, Provenance, generate_samples, image_seed, plan_batches, read_manifest,
                              write_category_grids, write_manifest)
from models.errors import WorkbenchError
from models.checkpoints import content_hash, find_checkpoint, load_pipeline

from ..conftest import PROMPT_SETS
from ..png_readers import READERS, expected_fields, read_by_every_reader

PROMPTS = PROMPT_SETS
MANIFEST_KEYS = {"prompt", "prompt_index", "category", "image_index", "seed", "checkpoint", "model", "guidance",
                 "sampler", "steps", "width", "height", "path"}


def test_drawbench_and_parti_read_with_categories():
    drawbench = read_prompt_table("drawbench")
    parti = read_prompt_table("parti")
    assert len(drawbench) == 200 and len({p.category for p in drawbench}) == 11  # per SOURCES.md
    assert len(parti) == 1632 and len({p.category for p in parti}) == 12
    assert drawbench[0].text == "A red colored car." and drawbench[0].category == "Colors"
    assert [p.index for p in parti[:3]] == [0, 1, 2]
    assert load_prompts("drawbench", limit=5) == load_prompts(str(PROMPTS / "drawbench.csv"), limit=5) == drawbench[:5]


def test_shapes_prompts_are_the_held_out_captions():
    from models.shapes import make_sample

    prompts = shapes_prompts(6, seed=3)
    assert [p.text for p in prompts] == [make_sample(3, "eval", i, (16,))["caption"] for i in range(6)]
    assert {p.category for p in prompts} <= {"one group", "two groups"}


def test_reference_captions_from_an_mds_set(shapes_data):
    from streaming import LocalDataset

    prompts = load_prompts("reference", limit=5, reference=shapes_data / "eval/32")
    ds = LocalDataset(local=str(shapes_data / "eval/32"))
    assert [p.text for p in prompts] == [ds.get_item(i)["caption"] for i in range(5)]
    with pytest.raises(WorkbenchError, match="needs a reference set"):
        load_prompts("reference")


@pytest.mark.parametrize("content, message", [
    ("", "is empty"),
    ("prompt,category\n", "no prompts"),
    ("text_missing,category\nfoo,bar\n", "no prompt column"),
    ("prompt,category\n,Colors\n", "line 2: no prompt"),
])
def test_bad_prompt_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "prompts.csv"
    path.write_text(content)
    with pytest.raises(WorkbenchError, match=message) as e:
        read_prompt_table(path)
    assert "\n" not in str(e.value)
    with pytest.raises(WorkbenchError, match="not found"):
        read_prompt_table(tmp_path / "missing.tsv")


def test_seeds_depend_only_on_prompt_and_image_index():
    assert image_seed(3, 1) == image_seed(3, 1) and image_seed(3, 1) != image_seed(1, 3)
    prompts = shapes_prompts(3)
    whole = plan_batches(prompts, 4, batch_size=5)
    ranks = [plan_batches(prompts, 4, batch_size=5, rank=r, world=2) for r in range(2)]
    assert [len(b) for b in whole] == [5, 5, 2] and ranks == [[whole[0], whole[2]], [whole[1]]]  # same batches
    assert [(p.index, i) for b in whole for p, i in b] == [(p, i) for p in range(3) for i in range(4)]


def test_images_identical_at_batch_sizes_1_and_4(tiny_run, tmp_path):
    ckpt = find_checkpoint(tiny_run / "ep0-ba4-rank0.pt")
    pipe = load_pipeline(ckpt)
    source = Provenance(ckpt.ref, ckpt.label, content_hash(ckpt), "raw")
    prompts = shapes_prompts(3)
    seen = []
    one = generate_samples(pipe, prompts, tmp_path / "b1", source=source, n_per_prompt=2, steps=3, size=16,
                           batch_size=1, progress=False, on_batch=lambda im, caps: seen.append(im.shape))
    four = generate_samples(pipe, prompts, tmp_path / "b4", source=source, n_per_prompt=2, steps=3, size=16,
                            batch_size=4, progress=False)
    assert len(one) == len(four) == 6 and seen[0] == (1, 3, 16, 16)
    differ = 0
    for a, b in zip(one, four):
        assert a.seed == b.seed
        x = np.asarray(Image.open(tmp_path / "b1" / a.path)).astype(int)
        y = np.asarray(Image.open(tmp_path / "b4" / b.path)).astype(int)
        assert np.abs(x - y).max() <= 1  # same noise; batched float kernels may round one level differently
        differ += int((x != y).sum())
    assert differ <= 0.01 * 6 * 16 * 16 * 3
    again = generate_samples(pipe, prompts, tmp_path / "b4-again", source=source, n_per_prompt=2, steps=3,
                             size=16, batch_size=4, progress=False)
    assert all(np.array_equal(np.asarray(Image.open(tmp_path / "b4" / a.path)),
                              np.asarray(Image.open(tmp_path / "b4-again" / b.path))) for a, b in zip(four, again))
    images = [np.asarray(Image.open(tmp_path / "b1" / r.path)) for r in one]
    assert not np.array_equal(images[0], images[1])  # different seeds, different images

    png = Image.open(tmp_path / "b4" / four[5].path)
    meta = json.loads(png.text["dwb"])
    assert meta["seed"] == four[5].seed and meta["prompt"] == prompts[2].text and meta["steps"] == 3
    assert f"Seed: {four[5].seed}" in png.text["parameters"]

    manifest = write_manifest(list(reversed(four)), tmp_path / "b4")
    assert manifest.name == MANIFEST
    rows = read_manifest(manifest)
    assert [(r["prompt_index"], r["image_index"]) for r in rows] == [(p, i) for p in range(3) for i in range(2)]
    assert all(MANIFEST_KEYS <= set(r) and (tmp_path / "b4" / r["path"]).is_file() for r in rows)
    assert rows[0]["model"] == "tiny-phase1/ep0-ba4-rank0" and rows[0]["width"] == 16  # run/stem
    assert rows[0]["checkpoint_hash"] == content_hash(ckpt) == meta["checkpoint_hash"]

    # every PNG of the set, images and category grids, read alike by PNG Info and two readers from PyPI
    for record in four:
        fields = expected_fields(record.image_record())
        assert read_by_every_reader(tmp_path / "b4" / record.path) == dict.fromkeys(READERS, fields)
    grids = write_category_grids(four, tmp_path / "b4")
    assert grids and all(g.is_file() for g in grids)
    for grid in grids:  # its first image's parameters, as AUTOMATIC1111 writes a grid's, and each cell's image
        cells = json.loads(Image.open(grid).text["dwb"])["grid"]["images"]
        first = next(r for r in four if r.path == cells[0][0])
        assert read_by_every_reader(grid) == dict.fromkeys(READERS, expected_fields(first.image_record()))
        in_grid = [r for row in cells for path in row for r in four if r.path == path]
        assert len({r.category for r in in_grid}) == 1 and [r.path for r in four if r.category == first.category] == \
            [r.path for r in in_grid]
