"""Any aspect out of `dwb evaluate`: one aspect for every prompt or each prompt's own from a column, drawn at the
aspect bucket of the size evaluate uses, batched by size, recorded, scored, and shown at their aspect on the
comparison page."""
import csv
import json
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
from PIL import Image

from evaluate.config import load_eval_config
from evaluate.run import EvalConfig, evaluate_checkpoints
from evaluate.samples import Provenance, generate_samples, plan_batches
from models.checkpoints import content_hash, find_checkpoint, load_pipeline
from models.generation import Prompt, bucket_set, nearest_bucket, read_prompt_table
from models.errors import WorkbenchError

from ..html_elements import Elements
from ..png_readers import READERS, expected_fields, read_by_every_reader

SIDE = 32  # the budget side: the tiny run is trained at 16 px, where every bucket on a step of 8 is the square
STEP = 8  # SD 2's size step, which the workbench's own tiny checkpoints are drawn on
ASPECTS = ("2:1", "", "1:2", "2:1")  # an empty cell: the aspect key's (1:1 below)


def _prompt_file(folder: Path, aspects=ASPECTS, column: str = "aspect") -> Path:
    path = folder / "prompts.csv"
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([("prompt", "category", column),
                                 *((text, "shapes", a) for text, a in zip(
                                     ["a red circle", "two blue squares", "a green triangle", "three yellow circles"],
                                     aspects))])
    return path


def _bucket(aspect: str) -> tuple[int, int]:
    """The budget's bucket nearest the aspect, picked here from the bucket set itself."""
    w, h = (float(x) for x in aspect.split(":"))
    return nearest_bucket((w, h), bucket_set(SIDE, STEP))


def test_a_batch_holds_one_size_and_each_image_is_the_one_its_size_draws_alone(tiny_run, tmp_path):
    pipe = load_pipeline(find_checkpoint(tiny_run / "ep0-ba4-rank0.pt"))
    source = Provenance("ckpt", "tiny")
    prompts = [Prompt(t, "c", i) for i, t in enumerate(["a red circle", "two blue squares", "a green triangle"])]
    sizes = {0: (24, 16), 2: (24, 16)}  # prompt 1 at the square size
    assert [[(p.index, i) for p, i in b] for b in plan_batches(prompts, 2, 3, sizes=sizes)] == \
        [[(0, 0), (0, 1), (2, 0)], [(2, 1)], [(1, 0), (1, 1)]]
    seen = []
    mixed = generate_samples(pipe, prompts, tmp_path / "mixed", source=source, n_per_prompt=2, steps=2, size=16,
                             batch_size=3, progress=False, sizes=sizes,
                             on_batch=lambda images, jobs: seen.append((images.shape, [p.index for p, _ in jobs])))
    assert [s for s, _ in seen] == [(3, 3, 16, 24), (1, 3, 16, 24), (2, 3, 16, 16)]
    assert [(r.width, r.height) for r in mixed] == [sizes.get(r.prompt_index, (16, 16)) for r in mixed]
    wide = generate_samples(pipe, [prompts[0], prompts[2]], tmp_path / "wide", source=source, n_per_prompt=2,
                            steps=2, size=16, batch_size=3, progress=False, sizes=sizes)
    square = generate_samples(pipe, [prompts[1]], tmp_path / "square", source=source, n_per_prompt=2, steps=2,
                              size=16, batch_size=3, progress=False)
    for alone, folder in ((wide, "wide"), (square, "square")):
        for record in alone:
            one = np.asarray(Image.open(tmp_path / folder / record.path))
            assert one.shape[:2] == (record.height, record.width)
            assert np.array_equal(one, np.asarray(Image.open(tmp_path / "mixed" / record.path)))  # bit for bit


def test_samples_at_2_to_1_are_drawn_at_the_bucket_size_recorded_scored_and_shown_at_their_aspect(
        tiny_run, shapes_data, inception_weights, tiny_clip, tmp_path, dwb):
    prompts = _prompt_file(tmp_path)
    out = tmp_path / "eval"
    cfg = EvalConfig(out=str(out), reference=str(shapes_data / "eval/32"), inception_weights=str(inception_weights),
                     inception_features=64, clip=str(tiny_clip), prompts=str(prompts), aspect_column="aspect", aspect="1:1",
                     n_per_prompt=1, n_reference=16, guidance=(5.0,), steps=2, size=SIDE, batch_size=4,
                     kid_subsets=2, kid_subset_size=4, bootstrap=20, device="cpu", progress=False)
    a, b = tiny_run / "ep0-ba2-rank0.pt", tiny_run / "ep0-ba4-rank0.pt"
    rows = evaluate_checkpoints(cfg, [a, b])
    for row in rows:
        assert row["aspect"] == "column aspect, else 1:1" and row["n_images"] == 4
        assert np.isfinite(row["fid"]) and np.isfinite(row["kid_mean"]) and -100 <= row["clip_score"] <= 100
        manifest = [json.loads(line) for line in (out / row["samples"] / "manifest.jsonl").read_text().splitlines()]
        for line, aspect in zip(manifest, ASPECTS):
            assert (line["width"], line["height"]) == _bucket(aspect or "1:1")
            path = out / row["samples"] / line["path"]
            with Image.open(path) as image:
                assert image.size == _bucket(aspect or "1:1")
            assert line["clip_score"] is not None
        wide = manifest[0]
        assert wide["width"] > wide["height"] and wide["width"] * wide["height"] <= SIDE * SIDE
        record = find_record(wide)
        assert read_by_every_reader(out / row["samples"] / wide["path"]) == dict.fromkeys(
            READERS, expected_fields(record.image_record()))
        assert (out / row["samples"] / "grids" / "shapes.png").is_file()  # one grid of every aspect

    r = dwb("evaluate", "compare", str(a), str(b), "--out", str(out), "--bootstrap", "40")
    assert r.returncode == 0, r.stderr
    [page] = (out / "compare").glob("*.html")
    shown = [attrs for tag, attrs in Elements(page.read_text()).elements if tag == "img" and attrs.get("class") in ("a", "b")]
    assert len(shown) == 8  # A's and B's image of each of the four prompts
    for attrs in shown:
        with Image.open(page.parent / unquote(attrs["src"])) as image:
            width, height = image.size
        assert int(attrs["width"]) / int(attrs["height"]) == pytest.approx(width / height, rel=0.05)
    assert {int(x["width"]) > int(x["height"]) for x in shown} == {True, False}  # wide and tall ones


def find_record(line: dict):
    from evaluate.samples import SampleRecord

    return SampleRecord(**{k: line[k] for k in SampleRecord.__dataclass_fields__})


def test_one_aspect_for_every_prompt_draws_its_bucket(tiny_run, shapes_data, inception_weights, tmp_path):
    cfg = load_eval_config(None, {"out": str(tmp_path / "eval"), "reference": str(shapes_data / "eval/32"),
                                  "inception_weights": str(inception_weights), "inception_features": 64,
                                  "prompts": "shapes", "n_prompts": 2, "n_reference": 16, "guidance": (5.0,),
                                  "steps": 1, "size": SIDE, "bootstrap": 0, "kid_subsets": 2, "kid_subset_size": 2,
                                  "device": "cpu", "progress": False}, ["aspect=1:2"])
    [row] = evaluate_checkpoints(cfg, [tiny_run / "ep0-ba4-rank0.pt"])
    lines = [json.loads(x) for x in (tmp_path / "eval" / row["samples"] / "manifest.jsonl").read_text().splitlines()]
    assert row["aspect"] == "1:2" and {(x["width"], x["height"]) for x in lines} == {_bucket("1:2")}

    cfg.aspect = None  # the same checkpoint square into the same folder: both sets of images stay
    [square] = evaluate_checkpoints(cfg, [tiny_run / "ep0-ba4-rank0.pt"])
    assert square["samples"] != row["samples"]
    for r, size in ((row, _bucket("1:2")), (square, (SIDE, SIDE))):
        kept = [json.loads(x) for x in (tmp_path / "eval" / r["samples"] / "manifest.jsonl").read_text().splitlines()]
        assert {(x["width"], x["height"]) for x in kept} == {size}
        assert all((tmp_path / "eval" / r["samples"] / x["path"]).is_file() for x in kept)


@pytest.mark.parametrize("aspects, column, message", [
    (("2:1", "wide", "1:1", "1:1"), "aspect", r"prompts.csv, line 3: aspect must be W:H .* got 'wide'"),
    (("2:1", "9:1", "1:1", "1:1"), "aspect", "prompts.csv, line 3: aspect must be from 1:4 to 4:1, got 9:1"),
    (ASPECTS, "ratio", "has no aspect column 'aspect'"),
])
def test_a_bad_aspect_column_is_one_line_naming_the_row(tmp_path, aspects, column, message):
    path = _prompt_file(tmp_path, aspects, column)
    with pytest.raises(WorkbenchError, match=message) as e:
        read_prompt_table(path, aspect_column="aspect")
    assert "\n" not in str(e.value)


def test_aspect_key_flag_and_column_are_checked_before_any_work(tmp_path, dwb):
    base = {"out": str(tmp_path), "reference": "ref"}
    with pytest.raises(WorkbenchError, match=r"config key 'aspect' must be W:H in quotes, such as \"16:9\""):
        (tmp_path / "c.yaml").write_text("aspect: 16:9\n")  # YAML reads it as the base-60 number 969
        load_eval_config(tmp_path / "c.yaml", base)
    (tmp_path / "c.yaml").write_text('aspect: "16:9"\n')
    assert load_eval_config(tmp_path / "c.yaml", base).aspect == "16:9"
    r = dwb("evaluate", "run", "ckpt", "--out", str(tmp_path), "--reference", "ref", "--aspect", "0:1")
    assert r.returncode != 0 and "--aspect: must be W:H with two positive numbers" in r.stderr.splitlines()[-1]
    with pytest.raises(WorkbenchError, match="aspect_column 'aspect' is read from a CSV/TSV prompts file"):
        from evaluate.prompts import load_prompts

        load_prompts("shapes", 2, aspect_column="aspect")
