"""Scores beside checkpoints and PNG Info, without a server: the results store and a study joined to checkpoints
by content hash, the Scores tab's table, and the parameters of our PNGs and AUTOMATIC1111's."""
import json
import re

import numpy as np
import pytest

from app.handlers import Handlers
from app.png_info import read_parameters, settings_from
from app.service import Service
from evaluate.names import write_metrics_table
from models.checkpoints import content_hash, find_checkpoint
from models.errors import WorkbenchError

BA2, BA4 = "tiny-phase1/ep0-ba2-rank0.pt", "tiny-phase1/ep0-ba4-rank0.pt"


@pytest.fixture(scope="module")
def hashes(tree):
    return {label: content_hash(find_checkpoint(path)) for label, path in ((BA2, tree.ba2), (BA4, tree.ba4))}


@pytest.fixture(scope="module")
def handlers(tree, hashes, tmp_path_factory):
    """Two stores (one beside the run with intervals and evaluate's metrics.json, one given with --results from
    before intervals) and a study whose report has one comparison with the clustered Wilson interval and one
    (from an older report) without it."""
    folder = tmp_path_factory.mktemp("scores")
    beside = tree.ba2.parent / "results.jsonl"
    rows = [dict(checkpoint="/elsewhere/ba2.pt", checkpoint_hash=hashes[BA2], model="tiny", step=2, guidance=5.0,
                 sampler="DDIM", weights="ema", status="ok", fid=310.5, fid_lo=290.25, fid_hi=333.0),
            dict(checkpoint="/elsewhere/ba4.pt", checkpoint_hash=hashes[BA4], model="tiny", step=4, guidance=5.0,
                 scheduler="DDIM", weights="ema", status="ok", fid=280.0, fid_lo=262.0, fid_hi=301.0,
                 clip_score=21.5, clip_score_lo=20.5, clip_score_hi=22.5),  # "scheduler": an older store's word
            dict(checkpoint_hash=hashes[BA4], step=4, status="error", fid=1.0)]  # a failed row is not a score
    beside.write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"torn")
    write_metrics_table(beside.parent)
    (folder / "old").mkdir()
    (folder / "old" / "results.jsonl").write_text(json.dumps(dict(checkpoint_hash=hashes[BA2], step=2, guidance=7.5,
                                                                  fid=300.0)) + "\n")
    study = folder / "study"
    (study / "report").mkdir(parents=True)
    (study / "report" / "results.json").write_text(json.dumps({
        "study": "s1", "model_info": {"m-a": {"checkpoint_hash": hashes[BA4]}, "m-b": {"checkpoint_hash": hashes[BA2]}},
        "comparisons": [{"question": "overall", "model_a": "m-a", "model_b": "m-b", "rate_a": 0.75, "decisive": 40,
                         "wilson": [0.6, 0.86], "two_way": [0.55, 0.9], "clustered_wilson": [0.58, 0.87],
                         "flip": {"count": 6, "votes": [], "exact": True}},
                        {"question": "style", "model_a": "m-a", "model_b": "m-b", "rate_a": 0.45, "decisive": 20,
                         "wilson": [0.26, 0.66], "two_way": [0.3, 0.6]}]}))
    yield Handlers(Service([tree.root], results=[folder / "old"], studies=[study]))
    beside.unlink()
    (beside.parent / "metrics.json").unlink()


def test_checkpoint_note_shows_metrics_with_intervals_and_win_rates_joined_by_hash(handlers):
    note = handlers.checkpoint_note(BA4)[0]
    assert "FID 280 [262, 301]" in note and "CLIP score 21.5 [20.5, 22.5]" in note
    assert "FID 1 " not in note  # the failed row
    assert ("(overall, study s1): this checkpoint over `tiny-phase1/ep0-ba2-rank0.pt`, 75.0 [58.0, 87.0]% of 40 "
            "decisive votes: this checkpoint is preferred, flips without 6 of its votes") in note  # as the report
    assert ("(style, study s1): `tiny-phase1/ep0-ba2-rank0.pt` over this checkpoint, 55.0 [40.0, 70.0]% of 20 "
            "decisive votes (cannot tell yet: the interval holds 50%)") in note  # the preferred one first; two-way
    other = handlers.checkpoint_note(BA2)[0]
    assert "FID 310.5 [290.2, 333]" in other and "(guidance 7.5): FID 300" in other  # both stores; no interval
    assert ("`tiny-phase1/ep0-ba4-rank0.pt` over this checkpoint, 75.0 [58.0, 87.0]% of 40 decisive votes: "
            "`tiny-phase1/ep0-ba4-rank0.pt` is preferred") in other  # the same comparison from model b's side
    assert "scores" not in handlers.checkpoint_note("export-ba4")[0]  # no row has its hash


def test_scores_tab_plots_the_metric_against_step_and_opens_a_checkpoint(handlers, hashes):
    plot, table, note, pages, x_axis = handlers.scores_table("fid", "gpu_hours")
    table = table.data  # the Styler's frame
    assert note == "" and len(table) == 3  # two rows beside the run, one from the older --results store
    assert x_axis["choices"] == [("training step", "step")] and x_axis["value"] == "step"  # no row has a cost
    assert not x_axis["visible"] and "GPU-hours" not in table.columns and "training step</text>" in plot
    ours = table[table["series"].str.contains("DDIM")]  # one series: "sampler" and an older store's "scheduler"
    assert list(ours["step"]) == [2, 4] and list(ours["FID"]) == [310.5, 280.0]
    assert list(ours["95% interval"]) == ["[290.2, 333]", "[262, 301]"] and list(ours["checkpoint"]) == [BA2, BA4]
    assert plot.count('class="point"') == 3 and plot.count('class="error-bar"') == 2  # the older row has no interval
    assert pages["visible"] is False  # no compare pages
    assert handlers.open_in_generate(hashes[BA4])[0]["value"] == BA4
    assert [m.title() for m in handlers.service.scores.measured()] == ["FID (lower is better)",
                                                                        "CLIP score (higher is better)"]
    assert handlers.scores_table("cmmd")[2] == "Pick a metric."  # described by metrics.json, measured by no row


def test_numbers_are_shown_to_four_significant_digits():
    from app.scores import significant

    assert [significant(x) for x in (310.53219876, 280.0000001, 0.3, 12345.6, 0.012345, 2e-7, -1.5)] == \
        ["310.5", "280", "0.3", "12350", "0.01235", "2e-07", "-1.5"]


A1111 = ("a photo of a cat, masterpiece\nNegative prompt: blurry\nSteps: 20, Sampler: DPM++ 2M, Schedule type: "
         "Karras, CFG scale: 7, Seed: 1234, Size: 512x768, Model hash: 6ce0161689, Model: v1-5-pruned-emaonly")


def test_png_info_reads_automatic1111_parameters_and_says_what_it_cannot_carry():
    values, notes = settings_from(A1111, lambda digest: None)
    assert values == dict(prompt="a photo of a cat, masterpiece", negative_prompt="blurry", sampler="DPM++ 2M Karras",
                          steps=20, guidance=7.0, width=512, height=768, seed=1234, checkpoint=None, weights=None,
                          refiner="", refiner_switch=None,  # drawn without a refiner: the field is emptied
                          mode="txt2img", strength=None, mask_blur=None, hires_scale=1.0, hires_steps=0,
                          hires_upscaler=None, clip_skip=1, loras=[],  # from text alone, no hires fix, no LoRA
                          vae="",  # drawn with its checkpoint's own VAE: the field is emptied
                          controlnet="", control_preprocess=None, control_weight=None, control_start=None,
                          control_end=None)  # no ControlNet: the field is emptied
    assert notes == ["no checkpoint under the app's folders has the model hash 6ce0161689 (v1-5-pruned-emaonly); "
                     "the current one is kept"]
    values, notes = settings_from(A1111.replace("DPM++ 2M", "DPM++ SDE"), lambda digest: None)
    assert values["sampler"] is None and "sampler 'DPM++ SDE' is not one of this app's" in notes[0]


def test_png_info_refuses_other_files_in_one_line(tmp_path):
    from PIL import Image

    (tmp_path / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    Image.new("RGB", (8, 8)).save(tmp_path / "bare.png")
    with pytest.raises(WorkbenchError, match="not a readable PNG image"):
        read_parameters(tmp_path / "a.png")
    with pytest.raises(WorkbenchError, match="carries no generation parameters"):
        read_parameters(tmp_path / "bare.png")


def test_png_info_prefers_a_whole_dwb_record_and_reads_the_text_without_one(tmp_path):
    import json

    from PIL import Image, PngImagePlugin

    from app.png_info import read_png_info
    from models.generation import ImageRecord

    record = ImageRecord("a red circle\nNegative prompt: blue", "", "DDIM", 4, 6.0, 16, 24, 21, "tiny", "ab" * 6, "raw")
    broken = {**json.loads(record.pnginfo()["dwb"]), "steps": "4"}  # a string where the record has a number
    for name, dwb, prompt in (("whole", record.pnginfo()["dwb"], record.prompt), ("broken", json.dumps(broken), None),
                              ("not-json", "{", None)):
        info = PngImagePlugin.PngInfo()
        info.add_text("parameters", record.parameters())
        info.add_text("dwb", dwb)
        Image.new("RGB", (8, 8)).save(tmp_path / f"{name}.png", pnginfo=info)
        text, found = read_png_info(tmp_path / f"{name}.png")
        values, _ = settings_from(text, lambda digest: None, found)
        assert (found is not None) == (prompt is not None), name
        assert values["prompt"] == (prompt or "a red circle Negative prompt: blue"), name
        assert (values["steps"], values["guidance"], values["width"], values["height"], values["seed"],
                values["weights"]) == (4, 6.0, 16, 24, 21, "raw"), name


HOSTILE_TEXTS = ["![x](http://attacker.invalid/x.png)", "[link](http://attacker.invalid)", '<img src="http://attacker.invalid">',
                 "`code` **bold** _em_ ~~gone~~ $$x$$ | a | b |", "# heading", "1. item", "- item", "a\\](b)", "``` ` ```",
                 "&lt;img&gt;", "two\nlines\n![y](http://attacker.invalid/y.png)"]


@pytest.mark.parametrize("text", HOSTILE_TEXTS)
def test_user_text_in_markdown_renders_as_itself(text):
    from html import unescape

    from markdown_it import MarkdownIt

    from app.handlers import as_markdown

    md = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    line = " ".join(text.splitlines())
    rendered = md.render(f"note: {as_markdown(text)}")
    assert "<img" not in rendered and "<a " not in rendered and unescape(rendered) == f"<p>note: {line}</p>\n"
    code = md.render(f"note: {as_markdown(text, code=True)}")
    assert code.startswith("<p>note: <code>") and unescape(code).removeprefix("<p>note: <code>") == f"{line}</code></p>\n"


def test_scores_from_files_show_their_words_as_text_in_the_checkpoint_note(tree, hashes, tmp_path):
    from markdown_it import MarkdownIt

    image = "![x](http://attacker.invalid/{}.png)"
    (tmp_path / "results.jsonl").write_text(json.dumps(dict(checkpoint_hash=hashes[BA4], step=4, guidance=5.0, fid=1.5,
                                                            sampler=image.format("sampler"))) + "\n")
    (tmp_path / "study" / "report").mkdir(parents=True)
    (tmp_path / "study" / "report" / "results.json").write_text(json.dumps({
        "study": image.format("study"), "model_info": {"a": {"checkpoint_hash": hashes[BA4]}, "b": {}},
        "comparisons": [{"question": image.format("question"), "model_a": "a", "model_b": image.format("model"),
                         "rate_a": 0.5, "decisive": 2}]}))
    note = Handlers(Service([tree.root], results=[tmp_path], studies=[tmp_path / "study"])).checkpoint_note(BA4)[0]
    rendered = MarkdownIt("commonmark").render(note)
    assert "<img" not in rendered and "attacker.invalid/sampler.png" in rendered
    assert "attacker.invalid/question.png" in rendered and "attacker.invalid/study.png" in rendered


def test_results_files_serves_compare_pages_and_images_inside_the_folders_only(tmp_path):
    """What `/results-files/` answers: a compare page and the images it shows, from a results folder the app
    reads; not the store, not a link out, not a path out, not another folder."""
    from app.results_files import folder_key, page_url, servable

    folder, elsewhere = tmp_path / "eval", tmp_path / "elsewhere"
    for f in (folder / "compare", folder / "samples" / "a", elsewhere):
        f.mkdir(parents=True)
    page = folder / "compare" / "a-vs-b.html"
    page.write_text("<img src='../samples/a/0.png'>")
    (folder / "samples" / "a" / "0.png").write_bytes(b"\x89PNG")
    (folder / "results.jsonl").write_text("{}\n")
    (elsewhere / "secret.png").write_bytes(b"\x89PNG")
    (elsewhere / "x.html").write_text("secret")
    (folder / "compare" / "out.html").symlink_to(elsewhere / "x.html")
    (folder / "samples" / "out").symlink_to(elsewhere)
    (folder / "samples" / "page.html").write_text("not a compare page")
    key = folder_key(folder)
    assert page_url(folder, page) == f"results-files/{key}/compare/a-vs-b.html"
    assert servable([folder], key, "compare/a-vs-b.html") == page.resolve()
    assert servable([folder], key, "compare/../samples/a/0.png") == (folder / "samples/a/0.png").resolve()
    for refused in ("results.jsonl", "compare/../results.jsonl", "compare/out.html", "samples/out/secret.png",
                    "../elsewhere/secret.png", "samples/page.html", "compare", "", "compare/a-vs-b.html\0"):
        assert servable([folder], key, refused) is None, refused
    assert servable([elsewhere], key, "compare/a-vs-b.html") is None  # a folder the app does not read


def test_a_runs_checkpoints_scored_alike_are_one_series():
    """evaluate labels each checkpoint `<run>/<name>` by default (the demo: `phase1/ba2`): one line per run and
    setting, not a point per checkpoint."""
    from app.scores import Metric, points_of

    rows = [dict(checkpoint_hash=f"h{step}{g}", model=f"{run}/ba{step}", step=step, guidance=g, sampler="DDIM",
                 fid=float(step)) for run in ("phase1", "phase2") for step in (2, 4) for g in (3.0, 5.0)]
    rows.append(dict(checkpoint_hash="hub", model="sd2-base", step=0, guidance=3.0, sampler="DDIM", fid=1.0))
    points = points_of(rows, Metric("fid", "FID"), {})
    series = {}
    for p in points:
        series.setdefault(p.series, []).append(p.step)
    assert series == {"phase1 · guidance 3, DDIM": [2, 4], "phase1 · guidance 5, DDIM": [2, 4],
                      "phase2 · guidance 3, DDIM": [2, 4], "phase2 · guidance 5, DDIM": [2, 4],
                      "sd2-base · guidance 3, DDIM": [0]}
    assert {p.model for p in points if p.step == 2} == {"phase1/ba2", "phase2/ba2"}  # compare pages name models


HOURS = {("phase1", 2): 0.0118, ("phase1", 4): 0.0236, ("phase2", 2): 0.0361}  # phase 2 carries phase 1's hours


def cost_rows(usd_per_gpu_hour: float | None = None) -> list[dict]:
    """FID of a two-phase run at two guidance scales, each row with what reaching its checkpoint cost (dollars at
    ``usd_per_gpu_hour``), and a row scored before rows carried the cost."""
    rows = [dict(checkpoint_hash=f"{run}-{step}", model=f"{run}/ba{step}", step=step, guidance=g, sampler="DDIM",
                 fid=300.0 - 10 * step - g, fid_lo=290.0 - 10 * step - g, fid_hi=310.0 - 10 * step - g, gpu_hours=hours,
                 **({"usd": hours * usd_per_gpu_hour} if usd_per_gpu_hour is not None else {}))
            for (run, step), hours in HOURS.items() for g in (3.0, 5.0)]
    return [*rows, dict(checkpoint_hash="older", model="older/ba8", step=8, guidance=3.0, sampler="DDIM", fid=250.0)]


def drawn_x(plot: str) -> tuple[list[tuple[float, float]], list[dict]]:
    """The x ticks (label, pixel) and each point's attributes and tooltip in the plot's SVG."""
    ticks = [(float(label), float(px)) for px, label in
             re.findall(r'<g class="x-tick"><line x1="([-\d.]+)".*?<text [^>]*>([^<]+)</text></g>', plot)]
    points = [{**dict(re.findall(r'([\w-]+)="([^"]*)"', attrs)), "tooltip": tip}
              for attrs, tip in re.findall(r'<circle class="point"([^>]*)><title>([^<]+)</title>', plot)]
    return ticks, points


def test_score_plot_against_gpu_hours_places_each_row_at_its_cost_and_counts_those_left_out():
    from app.score_plot import score_plot
    from app.scores import X_AXES, Metric, points_of, significant

    fid = Metric("fid", "FID", True)
    points = points_of(cost_rows(), fid, {})
    plot = score_plot(points, fid, X_AXES["gpu_hours"])
    assert re.search(r'class="x-title"[^>]*>GPU-hours to reach the checkpoint</text>', plot)
    ticks, drawn = drawn_x(plot)
    assert len(ticks) >= 2 and any(v != int(v) for v, _ in ticks)  # not forced to whole numbers
    value_at = np.poly1d(np.polyfit([px for _, px in ticks], [v for v, _ in ticks], 1))  # through the axis' ticks
    per_pixel = abs(value_at(1) - value_at(0))
    assert len(drawn) == 6  # the older row has no cost
    for point in drawn:
        step, run = int(point["data-step"]), point["data-series"].split(" · ")[0]
        hours = HOURS[(run, step)]
        assert float(point["data-x"]) == hours and abs(value_at(float(point["cx"])) - hours) < per_pixel, point
        assert f"step {step}, {significant(hours)} GPU-hours:" in point["tooltip"]
    assert "1 of 7 rows is left out of the plot: no GPU-hours recorded" in plot

    by_step = score_plot(points, fid)
    assert re.search(r'class="x-title"[^>]*>training step</text>', by_step) and "left out" not in by_step
    ticks, drawn = drawn_x(by_step)
    assert len(drawn) == 7 and all(v == int(v) for v, _ in ticks)
    assert {p["data-x"] for p in drawn} == {"2", "4", "8"}  # data-x: the step


def test_x_axes_offered_are_those_the_rows_have():
    from app.scores import Metric, points_of, x_axes_of

    def offered(rows):
        return [a.choice for a in x_axes_of(points_of(rows, Metric("fid", "FID"), {}))]

    assert offered(cost_rows()[-1:]) == ["training step"]
    assert offered(cost_rows()) == ["training step", "GPU-hours"]  # no run set a price
    assert offered(cost_rows(2.5)) == ["training step", "GPU-hours", "dollars"]  # the older row has neither
    priced_and_not = cost_rows(2.5)[:2] + cost_rows()[2:]
    assert offered(priced_and_not) == ["training step", "GPU-hours"]  # dollars would drop a run GPU-hours place
