"""Numbers at the ends of what Python holds, in files the app reads: a finite FID of 1.7e308 in evaluate's results
(the Scores plot raised OverflowError), and a 5,000-digit Size or a 4,000-digit Seed in a PNG's parameters text,
a JPEG's or WebP's EXIF UserComment or a PNG's ``dwb`` record (Python's int-limit text and a TypeError reached
PNG Info). Each is read through the app's handlers, as a user's page meets it."""
from __future__ import annotations

import json
import re

import gradio as gr
import pytest
from PIL import Image, PngImagePlugin

from app.handlers import Handlers
from app.score_plot import BOTTOM, HEIGHT, LEFT, RIGHT, TOP, WIDTH
from app.service import Service
from models.generation import ImageRecord, exif_parameters

INT_LIMIT_WORDS = ("Exceeds the limit", "set_int_max_str_digits", "int too large", "64-bit")  # Python's, orjson's
HUGE = 1.7e308  # about the largest finite float


def results_row(name: str, step, fid, **extra) -> dict:
    return dict(checkpoint=f"/elsewhere/{name}.pt", checkpoint_hash=f"hash-{name}", model=f"run/{name}", step=step,
                guidance=5.0, sampler="DDIM", weights="ema", status="ok", fid=fid, **extra)


@pytest.fixture
def handlers(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "results").mkdir()
    return Handlers(Service([tmp_path / "checkpoints"], results=[tmp_path / "results"]))


def write_results(handlers: Handlers, rows: list, raw_lines: list[str] = ()) -> None:
    folder = handlers.service.scores.results[0]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "".join(l + "\n" for l in raw_lines))


def drawn_points(plot: str) -> list[dict]:
    return [dict(re.findall(r'([\w-]+)="([^"]*)"', attrs)) for attrs in re.findall(r'<circle class="point"([^>]*)>', plot)]


ROWS = [results_row("ba2", 2, HUGE, fid_lo=-HUGE, fid_hi=HUGE, gpu_hours=HUGE),
        results_row("ba4", 4, -HUGE, gpu_hours=1e-300),
        results_row("ba6", 6, 1e300, gpu_hours=2.0),
        results_row("ba8", 8, 250.0, fid_lo=240.0, fid_hi=260.0, gpu_hours=3.0),
        results_row("ba10", 10, 5e-324, gpu_hours=5e-324)]


@pytest.mark.parametrize("axis", ["step", "gpu_hours"])
def test_finite_metrics_at_the_ends_of_the_float_range_are_plotted_inside_the_axes(handlers, axis):
    write_results(handlers, ROWS)
    plot, table, note, _, _ = handlers.scores_table("fid", axis)
    points = drawn_points(plot)
    assert sorted(float(p["data-value"]) for p in points) == sorted(r["fid"] for r in ROWS)  # each as its row says
    for p in points:
        assert TOP <= float(p["cy"]) <= HEIGHT - BOTTOM and LEFT <= float(p["cx"]) <= WIDTH - RIGHT, p
    at = {float(p["data-value"]): float(p["cy"]) for p in points}
    assert at[HUGE] <= at[1e300] < at[250.0] < at[-HUGE]  # higher on the page, the higher the value
    bars = re.findall(r'<line class="bar"[^>]*y1="([-\d.]+)" y2="([-\d.]+)"', plot)
    assert len(bars) == 2 and all(TOP <= float(y) <= HEIGHT - BOTTOM for bar in bars for y in bar)
    assert len(re.findall(r'class="y-tick"', plot)) >= 2
    assert sorted(table.data["fid"]) == sorted(r["fid"] for r in ROWS) and note == ""
    gr.Dataframe().postprocess(table)  # what the page receives


def test_numbers_past_a_float_or_an_int_in_results_rows_are_left_out_in_one_line(handlers):
    """A metric of 400 digits (float() raised OverflowError), a step of 400 digits and a metric of 5,000 digits
    (Python's int-limit text): the row is not a score, or the line is skipped with a one-line reason."""
    write_results(handlers, [results_row("ba8", 8, 250.0, fid_lo=240.0, fid_hi=260.0), results_row("ba9", 9, 10**400),
                             results_row("ba10", 10**400, 240.0)],
                  ['{"checkpoint_hash": "hash-long", "step": 12, "status": "ok", "fid": ' + "9" * 5000 + "}"])
    plot, table, note, _, _ = handlers.scores_table("fid", "step")
    assert [float(p["data-value"]) for p in drawn_points(plot)] == [250.0]
    assert list(table.data["fid"]) == [250.0]
    assert "Skipped 1 unreadable results row: results.jsonl line 4" in note and "\n" not in note, note
    assert not any(words in note for words in INT_LIMIT_WORDS), note
    gr.Dataframe().postprocess(table)


# -- PNG Info ---------------------------------------------------------------------------------------

def parameters_text(size: str = "512x768", seed: str = "1234") -> str:
    return ("a photo of a cat\nNegative prompt: blurry\n"
            f"Steps: 20, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 7, Seed: {seed}, Size: {size}")


def image_with(tmp_path, name: str, text: str, dwb: str | None = None):
    path = tmp_path / name
    image = Image.new("RGB", (8, 8))
    if path.suffix == ".png":
        info = PngImagePlugin.PngInfo()
        info.add_text("parameters", text)
        if dwb is not None:
            info.add_text("dwb", dwb)
        image.save(path, pnginfo=info)
    else:
        image.save(path, exif=exif_parameters(text))
    return str(path)


ATTACKS = {"a 5000-digit Size": (f"{'9' * 5000}x512", "1234", "Size"),
           "a 4000-digit Seed": ("512x768", "9" * 4000, "Seed"),
           "a 5000-digit Seed": ("512x768", "9" * 5000, "Seed"),
           "a 20-digit Seed": ("512x768", "9" * 20, "Seed")}  # past the 2^53 a browser's JSON numbers hold whole


@pytest.mark.parametrize("name", ["a.png", "a.jpg", "a.webp"])
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_png_info_takes_long_digit_strings_as_unreadable_fields_with_a_note(handlers, tmp_path, name, attack):
    size, seed, field = ATTACKS[attack]
    text, values, notes = handlers.png_info(image_with(tmp_path, name, parameters_text(size, seed)))
    assert text == parameters_text(size, seed)
    gr.JSON().postprocess(values)  # what the page receives (orjson raised TypeError on a 4000-digit int)
    kept = {"prompt": "a photo of a cat", "steps": 20, "guidance": 7.0, "sampler": "DPM++ 2M Karras"}
    assert {k: values[k] for k in kept} == kept
    if field == "Size":
        assert values["width"] is None and values["height"] is None and values["seed"] == 1234
    else:
        assert values["seed"] is None and (values["width"], values["height"]) == (512, 768)
    [line] = [n for n in notes.splitlines() if field in n]
    assert "the current one is kept" in line and len(line) < 300, line
    assert not any(words in notes for words in INT_LIMIT_WORDS), notes


def test_png_info_reads_the_text_where_the_dwb_record_holds_a_5000_digit_seed(handlers, tmp_path):
    record = ImageRecord("a red circle", "", "DDIM", 4, 6.0, 16, 24, 21, "tiny", "ab" * 6, "raw")
    chunk = record.pnginfo()["dwb"].replace('"seed": 21', '"seed": ' + "9" * 5000)
    text, values, notes = handlers.png_info(image_with(tmp_path, "a.png", record.parameters(), chunk))
    assert values["seed"] == 21 and values["prompt"] == "a red circle"  # from the parameters text
    [line] = [n for n in notes.splitlines() if "dwb record" in n]
    assert "its parameters text was read instead" in line and len(line) < 300, line
    assert not any(words in notes for words in INT_LIMIT_WORDS), notes


def test_png_info_leaves_out_a_4000_digit_seed_of_a_dwb_record(handlers, tmp_path):
    record = ImageRecord("a red circle", "", "DDIM", 4, 6.0, 16, 24, 21, "tiny", "ab" * 6, "raw")
    chunk = record.pnginfo()["dwb"].replace('"seed": 21', '"seed": ' + "9" * 4000)
    text, values, notes = handlers.png_info(image_with(tmp_path, "a.png", record.parameters(), chunk))
    gr.JSON().postprocess(values)
    assert values["seed"] is None and (values["width"], values["height"], values["steps"]) == (16, 24, 4)
    [line] = [n for n in notes.splitlines() if "Seed" in n]
    assert "the current one is kept" in line and len(line) < 300, line
