"""The app in a real headless Chromium: pick a checkpoint, generate, see the image, read its parameters,
compare checkpoints, stop a generation, and the messages bad input gets."""
import io
import re
import time
from urllib.parse import urljoin

import numpy as np
import pytest
import torch
from PIL import Image

from models.generation.png import parse_parameters
from models.generation.prompts import read_prompt_table

from ..conftest import CHROMIUM, CHROMIUM_ARGS as ARGS, needs_chromium

pytestmark = needs_chromium
HOSTILE = '<img src=x onerror="window.pwned=1">'


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, server, request, tmp_path):
    """A fresh tab on the app, after its page load has listed the checkpoints (a screenshot if the test fails)."""
    problems: list[str] = []
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.set_default_timeout(60_000)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.goto(server.url)
    page.locator("#checkpoint-note", has_text=re.compile(r"\S")).wait_for()
    yield page
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        page.screenshot(path=str(tmp_path / "failure.png"))
        print(f"screenshot of the failure: {tmp_path / 'failure.png'}")
    page.close()
    assert not problems


def pick(page, dropdown: str, label: str) -> None:
    page.click(f"{dropdown} input")
    page.locator(dropdown).get_by_role("option", name=label, exact=True).click()  # another's list may be open
    if dropdown == "#checkpoint":  # picking one sets the default size: wait for it before setting a size
        page.locator("#checkpoint-note", has_text=label).wait_for()


def type_path(page, dropdown: str, text: str) -> None:
    page.fill(f"{dropdown} input", text)
    page.press(f"{dropdown} input", "Enter")


def set_number(page, selector: str, value) -> None:
    page.fill(selector, str(value))
    page.press(selector, "Tab")


def error_toast(page, contains: str) -> str:
    toast = page.locator(".toast-body", has_text=contains).first
    toast.wait_for()
    text = toast.inner_text()
    page.locator(".toast-close").first.click()  # close it, so the next one is told apart
    return text


def test_generate_see_the_image_and_read_its_parameters(page, tree, pipe):
    pick(page, "#checkpoint", "tiny-phase1/ep0-ba4-rank0.pt")
    page.locator("#checkpoint-note", has_text="trained at 16 px").wait_for()
    assert "EMA and raw weights" in page.inner_text("#checkpoint-note")
    for side in ("width", "height"):  # the checkpoint's training resolution
        assert page.input_value(f"#{side} input[type=number]") == "16"
    # the guidance and steps its run's previews drew with, which it recommends (configs/tiny-phase1.yaml)
    assert "guidance 3, 20 steps: the checkpoint's recommended settings" in page.inner_text("#checkpoint-note")
    page.wait_for_function("document.querySelector('#guidance input[type=number]').value === '3'")
    assert page.input_value("#steps input[type=number]") == "20"
    page.fill("#prompt textarea", "two blue squares")
    page.fill("#negative textarea", "red")
    set_number(page, "#steps input[type=number]", 6)
    set_number(page, "#seed input", 7)
    set_number(page, "#batch input[type=number]", 2)
    page.click("#generate")
    page.locator("#gallery img").nth(1).wait_for()
    page.wait_for_function("[...document.querySelectorAll('#gallery img')].every(i => i.complete && i.naturalWidth === 16)")
    assert "seed 8" in page.inner_text("#gallery")  # each image shows its own seed

    text = page.input_value("#parameters textarea")
    shown = parse_parameters(text)
    assert (shown["prompt"], shown["negative_prompt"], shown["Seed"], shown["Steps"]) == (
        "two blue squares", "red", "7", "6")
    src = page.get_attribute("#gallery img >> nth=0", "src")
    png = page.request.get(src)
    assert png.ok
    image = Image.open(io.BytesIO(png.body()))
    assert image.text["parameters"] == text  # the PNG carries what the page shows
    # The same batch of two through load_pipeline gives the same pixels. (Alone, an image can differ by
    # float rounding in batched kernels: measured, one channel value of 768 by 1.)
    gens = [torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)]
    ref = pipe(["two blue squares"] * 2, negative_prompt=["red"] * 2, num_inference_steps=6, guidance_scale=3,
               width=16, height=16, generator=gens, output_type="pil").images[0]
    assert np.array_equal(np.asarray(image.convert("RGB")), np.asarray(ref))

    page.click("#randomize")
    page.wait_for_function("document.querySelector('#seed input').value !== '7'")
    assert 0 <= int(page.input_value("#seed input")) < 2**32


def test_the_image_to_image_tab_draws_from_an_upload_and_records_its_strength(page, tmp_path):
    pick(page, "#checkpoint", "tiny-phase1/ep0-ba4-rank0.pt")
    page.fill("#prompt textarea", "a red circle")
    set_number(page, "#steps input[type=number]", 4)
    Image.new("RGB", (16, 16), (200, 30, 30)).save(tmp_path / "init.png")
    page.get_by_role("tab", name="Image to image").click()
    page.set_input_files("#init-image input[type=file]", str(tmp_path / "init.png"))
    page.locator("#init-image img").first.wait_for()
    page.click("#generate")
    page.wait_for_function("document.querySelector('#parameters textarea').value.includes('Denoising strength: 0.75')")
    page.locator("#gallery img").first.wait_for()


def test_bad_input_shows_a_message_and_the_app_keeps_working(page, tree):
    page.fill("#prompt textarea", "")
    page.click("#generate")
    assert "the prompt is empty" in error_toast(page, "prompt is empty")

    page.fill("#prompt textarea", "a red circle")
    type_path(page, "#checkpoint", str(tree.outside / "ep0-ba4-rank0.pt"))
    page.locator("#checkpoint-note", has_text="outside the allowed checkpoint folders").wait_for()
    page.click("#generate")
    error_toast(page, "outside the allowed checkpoint folders")

    type_path(page, "#checkpoint", str(tree.broken))  # not listed (not a checkpoint), but typed
    page.click("#generate")
    assert str(tree.root) not in error_toast(page, "corrupt, not a PyTorch file")  # named by label, not path

    type_path(page, "#checkpoint", HOSTILE)
    page.click("#generate")
    assert HOSTILE in error_toast(page, "checkpoint not found")  # markup shown as text, never run
    assert page.evaluate("window.pwned") is None

    pick(page, "#checkpoint", "tiny-phase1/ep0-ba2-rank0.pt")
    set_number(page, "#steps input[type=number]", 2)
    page.click("#generate")
    page.locator("#gallery img").first.wait_for()
    assert "Seed: " in page.input_value("#parameters textarea")


def test_compare_tab_shows_checkpoints_side_by_side(page):
    page.get_by_role("tab", name="Compare").click()
    for label in ("tiny-phase1/ep0-ba2-rank0.pt", "tiny-phase1/ep0-ba4-rank0.pt", "export-ba4"):
        pick(page, "#compare-checkpoints", label)
    page.fill("#compare-prompt textarea", "three yellow triangles")
    for name, value in (("steps", 5), ("width", 16), ("height", 16)):
        set_number(page, f"#compare-{name} input[type=number]", value)
    set_number(page, "#compare-seed input", 5)
    page.click("#compare")
    page.locator("#compare-gallery img").nth(2).wait_for()
    captions = page.inner_text("#compare-gallery")
    for label in ("ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt", "export-ba4"):
        assert label in captions
    assert "Seed: 5" in page.input_value("#compare-parameters textarea")
    page.locator("#compare-gallery img").nth(2).click()  # the selected image's parameters are shown
    page.locator("#compare-parameters textarea").wait_for()
    page.wait_for_function("document.querySelector('#compare-parameters textarea').value.includes('Model: export-ba4')")


def test_stop_button_ends_the_generation(page, server):
    page.fill("#prompt textarea", "two red circles")
    pick(page, "#checkpoint", "tiny-phase1/ep0-ba4-rank0.pt")
    for name, value in (("steps", 150), ("width", 64), ("height", 64)):
        set_number(page, f"#{name} input[type=number]", value)
    page.click("#generate")
    page.locator("#gallery", has_text=re.compile(r"\d+/150")).wait_for()  # the per-step progress bar
    page.click("#stop")
    page.wait_for_function("!/\\d+\\/150/.test(document.querySelector('#gallery').innerText)")
    # the server itself stopped early, not only the page: its log says after how many steps
    deadline = time.monotonic() + 60
    while not (stopped := re.findall(r"stopped after (\d+) of 150 steps", server.output())):
        assert time.monotonic() < deadline, "the server did not report the stop"
        time.sleep(0.1)
    assert int(stopped[-1]) < 150
    set_number(page, "#steps input[type=number]", 2)
    page.click("#generate")
    page.locator("#gallery img").first.wait_for()


def test_xyz_plot_tab_draws_a_labelled_2x2_grid(page):
    page.get_by_role("tab", name="X/Y/Z plot").click()
    page.fill("#xyz-prompt textarea", "two blue squares")
    for name, value in (("steps", 3), ("width", 16), ("height", 16)):
        set_number(page, f"#xyz-{name} input[type=number]", value)
    pick(page, "#xyz-x-type", "checkpoint")
    page.fill("#xyz-x-values textarea", "tiny-phase1/ep0-ba2-rank0.pt\ntiny-phase1/ep0-ba4-rank0.pt")
    pick(page, "#xyz-y-type", "seed")
    page.fill("#xyz-y-values textarea", "1, 2")
    page.click("#xyz-plot")
    page.locator("#xyz-gallery img").nth(3).wait_for()
    captions = page.inner_text("#xyz-gallery")
    assert "tiny-phase1/ep0-ba2-rank0.pt | seed 2" in captions and "tiny-phase1/ep0-ba4-rank0.pt | seed 1" in captions
    # each caption whole and inside its cell (Gradio cut them to one line), the grid whole (it was cropped square)
    assert page.evaluate("""() => [...document.querySelectorAll('#xyz-gallery .caption-label, #xyz-grids .caption-label')]
        .filter(c => c.scrollWidth > c.clientWidth || c.scrollHeight > c.clientHeight
                     || c.getBoundingClientRect().bottom > c.closest('.thumbnail-item').getBoundingClientRect().bottom + 1)
        .map(c => c.textContent)""") == []
    fit, box, image, inside = page.evaluate("""() => {
        const i = document.querySelector('#xyz-grids img'), r = i.getBoundingClientRect(),
              wrap = i.closest('.grid-wrap').getBoundingClientRect();
        return [getComputedStyle(i).objectFit, r.width / r.height, i.naturalWidth / i.naturalHeight,
                wrap.top <= r.top && r.bottom <= wrap.bottom]; }""")
    assert (fit == "contain" or abs(box - image) < 0.01) and inside
    grid = Image.open(io.BytesIO(page.request.get(page.get_attribute("#xyz-grids img >> nth=0", "src")).body()))
    cell = Image.open(io.BytesIO(page.request.get(page.get_attribute("#xyz-gallery img >> nth=3", "src")).body()))
    assert cell.size == (16, 16) and parse_parameters(cell.text["parameters"])["Seed"] == "2"  # a cell's own PNG
    g = np.asarray(grid.convert("RGB"))
    cw = 128  # 16 px cells enlarged pixel for pixel
    top, left = g.shape[0] - 2 * cw, g.shape[1] - 2 * cw
    assert top > 0 and left > 0 and (g[:top, left:] < 128).any() and (g[top:, :left] < 128).any()  # labels
    last = g[top + cw:, left + cw:][::8, ::8]  # the bottom-right cell: ba4, seed 2
    assert np.array_equal(last, np.asarray(cell.convert("RGB")))


def test_drop_a_png_and_send_it_to_generate(page, server, tmp_path):
    from gradio_client import Client

    made = Client(server.url, verbose=False, download_files=str(tmp_path)).predict(
        "tiny-phase1/ep0-ba2-rank0.pt", "raw", "three yellow triangles", "green", "Euler a", 4, 6.5, 16, 16, 31, 1,
        api_name="/generate")[0][0]["image"]
    page.get_by_role("tab", name="PNG Info").click()
    page.set_input_files("#png-file input[type=file]", made)
    page.wait_for_function("document.querySelector('#png-parameters textarea').value.includes('Seed: 31')")
    page.locator("#png-notes", has_text="found by its model hash").wait_for()
    page.click("#png-send")
    page.wait_for_function("document.querySelector('#prompt textarea').value === 'three yellow triangles'")
    assert page.input_value("#negative textarea") == "green" and page.input_value("#seed input") == "31"
    assert page.input_value("#sampler input") == "Euler a" and page.input_value("#steps input[type=number]") == "4"
    assert page.input_value("#checkpoint input") == "tiny-phase1/ep0-ba2-rank0.pt"
    assert page.is_checked("#weights input[value=raw]")
    page.click("#generate")
    page.locator("#gallery img").first.wait_for()
    again = Image.open(io.BytesIO(page.request.get(page.get_attribute("#gallery img >> nth=0", "src")).body()))
    assert np.array_equal(np.asarray(again.convert("RGB")), np.asarray(Image.open(made).convert("RGB")))


def test_a_lora_picked_is_its_tag_in_the_prompt_and_its_hash_in_the_parameters(page, tree, pipe):
    import copy

    from models.families import family_of_pipeline

    from ..adapters.test_applying import _write_diffusers_lora

    (tree.root / "loras").mkdir(exist_ok=True)
    _write_diffusers_lora(family_of_pipeline(pipe).name, copy.deepcopy(pipe.unet), tree.root / "loras", "tiny-style")
    page.click("#refresh")  # lists the file written since the page loaded
    pick(page, "#checkpoint", "tiny-phase1/ep0-ba4-rank0.pt")
    page.fill("#prompt textarea", "two blue squares")
    pick(page, "#lora-pick", "loras/tiny-style.safetensors")
    set_number(page, "#lora-strength input[type=number]", 0.5)
    page.click("#lora-add")
    page.wait_for_function("document.querySelector('#prompt textarea').value === "
                           "'two blue squares <lora:tiny-style:0.5>'")
    set_number(page, "#steps input[type=number]", 2)
    page.click("#generate")
    page.wait_for_function("document.querySelector('#parameters textarea').value.includes('Lora hashes')")
    shown = parse_parameters(page.input_value("#parameters textarea"))
    assert shown["prompt"] == "two blue squares <lora:tiny-style:0.5>" and shown["Lora hashes"].startswith("tiny-style: ")


def test_a_prompt_file_or_set_fills_the_first_free_axis_with_its_prompts(page, tmp_path):
    """PartiPrompts' TSV dropped on the X/Y/Z tab: its prompts, in file order and cut to the plot's cell limit,
    become the first free axis (Z: X and Y hold seed and guidance); a file without a prompt column is one
    message that names no server path; DrawBench chosen by name then fills the same axis."""
    import csv

    from ..conftest import PROMPT_SETS

    parti = PROMPT_SETS / "parti_prompts.tsv"
    with open(parti, newline="", encoding="utf-8") as f:
        expected = [row["Prompt"].strip() for row in csv.DictReader(f, delimiter="\t")][:100]  # --max-cells' default
    page.get_by_role("tab", name="X/Y/Z plot").click()
    page.set_input_files("#xyz-prompt-file input[type=file]", parti)
    page.wait_for_function("document.querySelector('#xyz-z-values textarea').value.length > 0")
    assert page.input_value("#xyz-z-values textarea").split("\n") == expected
    assert page.input_value("#xyz-z-type input") == "prompt"
    assert page.input_value("#xyz-x-type input") == "seed" and page.input_value("#xyz-y-type input") == "guidance"

    no_prompts = tmp_path / "scores.csv"
    no_prompts.write_text("model,fid\na,1.0\n")
    page.set_input_files("#xyz-prompt-file input[type=file]", no_prompts)
    shown = error_toast(page, "no prompt column")
    assert "prompt file upload has no prompt column (header: model, fid)" in shown
    assert "/tmp" not in shown and str(tmp_path) not in shown

    # a shipped set by name replaces the prompt axis' values the same way
    drawbench = [p.text for p in read_prompt_table("drawbench")][:100]
    page.click("#xyz-prompt-set input")
    page.get_by_role("option", name="DrawBench (200 prompts)").click()
    page.wait_for_function("document.querySelector('#xyz-z-values textarea').value.startsWith('A red colored car.')")
    assert page.input_value("#xyz-z-values textarea").split("\n") == drawbench
    assert page.input_value("#xyz-z-type input") == "prompt"


def test_markdown_in_a_png_or_a_typed_name_fetches_nothing(page, tmp_path):
    """Notes render as Markdown: a PNG's Model field or a typed checkpoint holding a Markdown image made every
    viewer's browser fetch its URL. Now they show as text, and no request leaves for the URL."""
    from PIL import PngImagePlugin

    fetched = []
    page.route("**/attacker.invalid/**", lambda route: (fetched.append(route.request.url), route.abort()))
    image = "![x](http://attacker.invalid/{}.png)"
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", f"a red circle\nSteps: 4, Sampler: {image.format('sampler')}, Seed: 1, Size: 16x16, "
                                f"Model hash: 0123456789, Model: {image.format('model')}")
    Image.new("RGB", (8, 8)).save(tmp_path / "hostile.png", pnginfo=info)
    page.get_by_role("tab", name="PNG Info").click()
    page.set_input_files("#png-file input[type=file]", str(tmp_path / "hostile.png"))
    notes = page.locator("#png-notes", has_text="0123456789")
    notes.wait_for()
    assert image.format("model") in notes.inner_text() and image.format("sampler") in notes.inner_text()

    page.get_by_role("tab", name="Generate").click()
    type_path(page, "#checkpoint", image.format("checkpoint"))
    note = page.locator("#checkpoint-note", has_text="Cannot use this checkpoint")
    note.wait_for()
    assert image.format("checkpoint") in note.inner_text()
    page.fill("#prompt textarea", "a red circle")
    page.click("#generate")
    assert image.format("checkpoint") in error_toast(page, "attacker.invalid/checkpoint.png")

    page.wait_for_timeout(500)  # time for an image's request to leave, were there one
    assert page.locator("img[src*='attacker.invalid']").count() == 0
    assert fetched == []


def test_settings_carry_across_the_tabs(page):
    """Prompt, negative prompt, sampler, steps, guidance, size and seed set in one tab are what the others show."""
    page.locator("#prompt textarea").press_sequentially("two red circles")
    page.fill("#negative textarea", "blue")  # pasted, as it were: no key pressed
    pick(page, "#sampler", "Euler a")
    set_number(page, "#steps input[type=number]", 7)
    set_number(page, "#seed input", 42)
    page.get_by_role("tab", name="Compare").click()
    assert page.input_value("#compare-prompt textarea") == "two red circles"
    assert page.input_value("#compare-negative textarea") == "blue" and page.input_value("#compare-sampler input") == "Euler a"
    assert page.input_value("#compare-steps input[type=number]") == "7" and page.input_value("#compare-seed input") == "42"
    set_number(page, "#compare-guidance input[type=number]", 4)
    set_number(page, "#compare-width input[type=number]", 24)
    page.fill("#compare-prompt textarea", "a green square")
    page.get_by_role("tab", name="X/Y/Z plot").click()
    assert page.input_value("#xyz-prompt textarea") == "a green square" and page.input_value("#xyz-negative textarea") == "blue"
    assert page.input_value("#xyz-guidance input[type=number]") == "4" and page.input_value("#xyz-width input[type=number]") == "24"
    page.click("#xyz-randomize")
    page.wait_for_function("document.querySelector('#xyz-seed input').value !== '42'")
    seed = page.input_value("#xyz-seed input")
    page.get_by_role("tab", name="Generate").click()
    assert page.input_value("#prompt textarea") == "a green square" and page.input_value("#seed input") == seed
    assert page.input_value("#guidance input[type=number]") == "4" and page.input_value("#width input[type=number]") == "24"
    assert page.input_value("#steps input[type=number]") == "7" and page.input_value("#sampler input") == "Euler a"


def test_an_unknown_checkpoint_name_gets_the_names_there_are(page, tree):
    type_path(page, "#checkpoint", "tiny-phase1/ep0-ba7-rank0.pt")
    note = page.locator("#checkpoint-note", has_text="checkpoint not found")
    note.wait_for()
    assert "checkpoint not found: tiny-phase1/ep0-ba7-rank0.pt; the app's checkpoints: tiny-phase1/ep0-ba2-rank0.pt, " \
           "tiny-phase1/ep0-ba4-rank0.pt, " in note.inner_text()
    page.fill("#prompt textarea", "a red circle")
    page.click("#generate")
    shown = error_toast(page, "checkpoint not found")
    assert "the app's checkpoints: tiny-phase1/ep0-ba2-rank0.pt" in shown and str(tree.root) not in shown


# -- Scores --------------------------------------------------------------------------------------------------------

SCORED = ("tiny-phase1/ep0-ba2-rank0.pt", "tiny-phase1/ep0-ba4-rank0.pt")
FID_POINTS = [(2, 310.53219876, 290.25, 333.0), (4, 280.0000001, 262.0, 301.0),  # (step, FID, low, high) of the rows
              (2, 340.1, 320.0, 365.2), (4, 0.3, 0.1, 0.9), (1000, 150.0, 140.0, 160.0)]


@pytest.fixture(scope="module")
def scored(tree, base):
    """The server's --results folder: FID of the tiny run in two series (guidance 5 and 7.5), with the GPU-hours its
    checkpoints record (as evaluate writes them; the run set no price), and of a run not under the app's folders
    (no cost), with intervals; CLIP score, precision and a column evaluate does not describe (with an
    interval) of one row; FD-DINOv2 of a hub model, at no step; a failed row; evaluate's metrics.json (describing
    CMMD and others that no row measured); compare pages and a sample they show."""
    import json
    import shutil

    from evaluate.names import write_metrics_table
    from evaluate.store import checkpoint_cost_columns
    from models.checkpoints import content_hash, find_checkpoint

    ba2, ba4 = (content_hash(find_checkpoint(p)) for p in (tree.ba2, tree.ba4))
    tiny = [dict(checkpoint_hash=h, model="tiny-phase1", step=step, guidance=g, sampler="DDIM", weights="ema", fid=fid,
                 fid_lo=lo, fid_hi=hi) for h, g, (step, fid, lo, hi) in zip((ba2, ba4, ba2, ba4), (5.0, 5.0, 7.5, 7.5),
                                                                            FID_POINTS)]
    for row, path in zip(tiny, (tree.ba2, tree.ba4, tree.ba2, tree.ba4)):
        row.update(checkpoint_cost_columns(path))
    tiny[0].update(clip_score=20.123456, clip_score_lo=19.5, clip_score_hi=20.9, precision=0.61234, house_score=21.0,
                   house_score_lo=20.5, house_score_hi=21.5)
    rows = [*tiny, dict(checkpoint_hash="0123456789ab", model="other-run", step=1000, guidance=5.0, fid=150.0,
                        fid_lo=140.0, fid_hi=160.0),
            dict(checkpoint_hash="fedcba987654", model="hub-model", guidance=5.0, fd_dinov2=812.3),
            dict(checkpoint_hash=ba4, step=4, status="error", kid_mean=1.0)]
    folder = base / "results"
    (folder / "compare").mkdir(parents=True)
    write_metrics_table(folder)  # as every append to a results store writes it
    (folder / "compare" / "tiny-phase1-vs-other-run.html").write_text("<h1>tiny-phase1 vs other-run</h1>"
                                                                      "<img src='../samples/a.png'>")
    (folder / "samples").mkdir()
    Image.new("RGB", (8, 8), "red").save(folder / "samples" / "a.png")
    (folder / "compare" / "tiny-phase10-vs-another.html").write_text("<h1>another run</h1>")
    (folder / "compare" / "tiny-phase1-vs-secret.html").symlink_to("/etc/hostname")  # a link could point anywhere
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    yield rows
    shutil.rmtree(folder)


def scores_tab(page) -> None:
    page.get_by_role("tab", name="Scores").click()
    page.locator("#scores-plot circle.point").first.wait_for()


def choose_metric(page, name: str) -> None:
    page.click("#scores-metric input")
    page.get_by_role("option", name=name, exact=True).click()
    page.wait_for_function("n => document.querySelector('#scores-metric input').value === n", arg=name)


def plot_as_drawn(page) -> dict:
    """The Scores plot's elements where the browser drew them: the plot area, the ticks (value, pixel), each point's
    and each error bar's box, and the number of points of each series' line."""
    return page.evaluate("""() => {
        const box = e => { const r = e.getBoundingClientRect(); return {l: r.left, r: r.right, t: r.top, b: r.bottom}; };
        const svg = document.querySelector('#scores-plot svg');
        return {area: box(svg.querySelector('.plot-area')),
                y: [...svg.querySelectorAll('.y-tick')].map(t => [parseFloat(t.textContent), box(t.querySelector('line')).t]),
                x: [...svg.querySelectorAll('.x-tick')].map(t => [parseFloat(t.textContent), box(t.querySelector('line')).l]),
                points: [...svg.querySelectorAll('circle.point')].map(box),
                bars: [...svg.querySelectorAll('.error-bar .bar')].map(box),
                lines: [...svg.querySelectorAll('polyline.line')].map(l => l.points.numberOfItems)};
    }""")


def axis(ticks: list) -> np.poly1d:
    """Pixel as a function of value, fitted through the ticks (a straight line: the axis is linear)."""
    assert len(ticks) >= 2, ticks
    return np.poly1d(np.polyfit([v for v, _ in ticks], [p for _, p in ticks], 1))


def test_scores_tab_plots_each_row_with_its_interval_inside_the_axes(page, scored):
    """Points sat on the plot's edge, without lines or error bars; metrics never measured were offered, and after
    an empty one the plot stayed broken."""
    scores_tab(page)
    page.click("#scores-metric input")
    page.get_by_role("option").first.wait_for()
    offered = [o.split("\n")[-1] for o in page.get_by_role("option").all_inner_texts()]
    assert sorted(offered) == ["CLIP score (higher is better)", "FD-DINOv2 (lower is better)",
                               "FID (lower is better)", "house_score", "precision (higher is better)"]
    page.click("#scores-metric input")  # closed again

    for attempt in ("first", "after an empty metric"):
        drawn = plot_as_drawn(page)
        area, x, y = drawn["area"], axis(drawn["x"]), axis(drawn["y"])
        assert len(drawn["points"]) == len(FID_POINTS) and sorted(drawn["lines"]) == [1, 2, 2], attempt
        for p in drawn["points"]:  # each whole point inside the plot area
            assert area["l"] < p["l"] and p["r"] < area["r"] and area["t"] < p["t"] and p["b"] < area["b"], (attempt, p)
        centres = [((p["l"] + p["r"]) / 2, (p["t"] + p["b"]) / 2) for p in drawn["points"]]
        ends = [((b["l"] + b["r"]) / 2, b["t"], b["b"]) for b in drawn["bars"]]
        for step, fid, lo, hi in FID_POINTS:  # a point at each row's step and value, its bar's ends at its interval
            assert any(abs(cx - x(step)) < 1 and abs(cy - y(fid)) < 1 for cx, cy in centres), (attempt, step, fid)
            assert any(abs(bx - x(step)) < 1 and abs(top - y(hi)) < 1 and abs(bottom - y(lo)) < 1
                       for bx, top, bottom in ends), (attempt, step, lo, hi)
            assert area["t"] < y(hi) and y(lo) < area["b"]
        choose_metric(page, "FD-DINOv2 (lower is better)")  # measured, but at no training step
        page.locator("#scores-note", has_text="FD-DINOv2 was measured only for checkpoints with no training step")\
            .wait_for()
        assert page.locator("#scores-plot circle.point").count() == 0
        assert page.locator("#scores-plot .plot-area").count() == 1
        choose_metric(page, "FID (lower is better)")
        page.locator("#scores-plot circle.point").nth(len(FID_POINTS) - 1).wait_for()
        assert page.inner_text("#scores-note").strip() == ""

    step_x = axis(plot_as_drawn(page)["x"])
    assert page.locator("#scores-x label").all_inner_texts() == ["training step", "GPU-hours"]  # no price: no dollars
    page.locator("#scores-x label", has_text="GPU-hours").click()
    page.locator("#scores-plot .x-title", has_text="GPU-hours to reach the checkpoint").wait_for()
    drawn = plot_as_drawn(page)
    x, y = axis(drawn["x"]), axis(drawn["y"])
    costed = scored[:4]  # the tiny run's rows: the other run's checkpoint records no cost
    assert len(drawn["points"]) == len(costed) and all(r["gpu_hours"] > 0 for r in costed)
    centres = [((p["l"] + p["r"]) / 2, (p["t"] + p["b"]) / 2) for p in drawn["points"]]
    for r in costed:  # each point at its checkpoint's GPU-hours
        assert any(abs(cx - x(r["gpu_hours"])) < 1 and abs(cy - y(r["fid"])) < 1 for cx, cy in centres), r
    assert max(abs(x(r["gpu_hours"]) - step_x(r["step"])) for r in costed) > 300  # ba4's points moved across
    assert page.inner_text("#scores-plot .score-left-out") == ("1 of 5 rows is left out of the plot: no GPU-hours "
                                                               "recorded (only checkpoints dwb train wrote record "
                                                               "them, and only rows scored since evaluate writes "
                                                               "them carry them).")


def test_scores_table_is_read_only_and_a_row_opens_its_checkpoint_when_asked(page, scored):
    """The table showed 13 decimals and its cells took edits; clicking a row switched Generate's checkpoint
    without a word."""
    scores_tab(page)
    table = page.locator("#scores-table")

    def cell(text: str):
        return table.get_by_role("button", name=text, exact=True)

    cell("310.5").wait_for()
    assert page.is_disabled("#scores-open")  # until a row is selected
    shown = table.locator("[data-editable]").all_inner_texts()
    for value in ("280", "[290.2, 333]", "[262, 301]", "340.1", "0.3", "[0.1, 0.9]", "150"):
        assert value in shown, value
    assert not [v for v in shown if "310.53" in v or "280.0" in v]
    cell("310.5").dblclick()
    page.keyboard.type("777.77")  # a decimal point: the hex hashes the table shows may hold any run of digits
    page.keyboard.press("Enter")
    page.wait_for_timeout(300)
    assert "777.77" not in table.inner_text() and table.locator("input:visible, textarea:visible").count() == 0

    cell("150").click()  # a row of a checkpoint not under the app's folders
    page.locator("#scores-selected", has_text="not under the app's folders").wait_for()
    assert page.is_disabled("#scores-open")
    cell("280").click()
    selected = page.locator("#scores-selected", has_text=SCORED[1])
    selected.wait_for()
    assert "step 4, FID 280 [262, 301]" in selected.inner_text()
    assert page.inner_text("#scores-open") == f"Open {SCORED[1]} in Generate" and page.is_enabled("#scores-open")
    links = page.locator("#scores-compare-pages a")
    assert links.all_inner_texts() == ["tiny-phase1-vs-other-run.html"]  # neither the link nor tiny-phase10's page
    served = page.request.get(urljoin(page.url, links.first.get_attribute("href")))
    assert served.ok and "<h1>tiny-phase1 vs other-run</h1>" in served.text()
    assert served.headers["content-security-policy"].startswith("sandbox")  # no script of the page runs as the app
    image = page.request.get(urljoin(served.url, "../samples/a.png"))  # the page's images, relative to it
    assert image.ok and Image.open(io.BytesIO(image.body())).size == (8, 8)
    folder = served.url.rsplit("/compare/", 1)[0]
    for outside in ("results.jsonl", "compare/tiny-phase1-vs-secret.html", "compare/%2e%2e/results.jsonl",
                    "compare/..%2f..%2fresults.jsonl", "../../etc/hostname"):
        assert page.request.get(f"{folder}/{outside}").status == 404, outside

    page.click("#scores-open")
    page.locator("#checkpoint-note", has_text="FID 280 [262, 301]").wait_for()
    assert page.input_value("#checkpoint input") == SCORED[1]
    assert page.get_by_role("tab", name="Generate").get_attribute("aria-selected") == "true"


def test_buttons_show_only_glyphs_the_browser_has_and_the_dice_its_icon(page):
    """The dice button's emoji was an empty box in a Chromium without an emoji font. Each character of every
    button's text is drawn on a canvas in the button's font and compared with a character no font holds (drawn
    as that empty box), and the dice button of each tab shows its icon."""
    missing = page.evaluate("""() => {
        const canvas = document.createElement('canvas'); canvas.width = canvas.height = 64;
        const ctx = canvas.getContext('2d', {willReadFrequently: true});
        const drawn = (ch, family) => { ctx.clearRect(0, 0, 64, 64); ctx.font = `40px ${family}`;
                                        ctx.fillText(ch, 4, 48); return ctx.getImageData(0, 0, 64, 64).data.join(); };
        const absent = (ch, family) => /\\s/.test(ch) || (drawn(ch, family) !== drawn('\\uE001', family)
                                                          && /[1-9]/.test(drawn(ch, family))) ? null : ch;
        const family = getComputedStyle(document.querySelector('#generate')).fontFamily;
        const found = [...document.querySelectorAll('button')].flatMap(b => [...b.innerText]
            .filter(ch => ch.codePointAt(0) > 127).map(ch => absent(ch, getComputedStyle(b).fontFamily)))
            .filter(ch => ch);
        return {found: [...new Set(found)], control: absent('\\uE002', family)};
    }""")
    assert missing["control"] == "\ue002"  # the check tells an absent glyph
    assert missing["found"] == []
    for tab, prefix in (("Generate", ""), ("Compare", "compare-"), ("X/Y/Z plot", "xyz-")):
        page.get_by_role("tab", name=tab).click()  # a tab's controls are drawn when it is first shown
        icon = page.locator(f"#{prefix}randomize img")
        assert icon.evaluate("i => i.complete && i.naturalWidth > 0"), prefix
        assert page.inner_text(f"#{prefix}randomize").strip() == "Random"


def test_the_jobs_tab_lists_my_request_and_asks_the_server_only_while_shown(page, tree):
    """A page polls nothing until the Jobs tab is shown; there it lists the page's own request with its prompt, and
    once another tab is shown it stops asking."""
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url))
    pick(page, "#checkpoint", "tiny-phase1/ep0-ba4-rank0.pt")
    page.fill("#prompt textarea", "one green circle")
    set_number(page, "#steps input[type=number]", 2)
    page.click("#generate")
    page.locator("#gallery img").first.wait_for()
    before = len(asked)
    page.wait_for_timeout(2500)
    assert len(asked) == before  # the Jobs tab is not shown: nothing polls
    page.get_by_role("tab", name="Jobs").click()
    page.wait_for_function("document.querySelector('#jobs').innerText.includes('one green circle')")
    shown = page.inner_text("#jobs")  # the table as seen (the Dataframe's hidden sizing row left out)
    assert "one green circle" in shown and "tiny-phase1/ep0-ba4-rank0.pt" in shown  # this page's own request
    page.wait_for_timeout(2500)
    assert len(asked) > before  # refreshed while shown
    page.get_by_role("tab", name="Generate").first.click()
    page.wait_for_timeout(1500)
    settled = len(asked)
    page.wait_for_timeout(2500)
    assert len(asked) == settled
