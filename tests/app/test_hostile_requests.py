"""`dwb app` among hostile checkpoints and files, and hostile requests to it: a safetensors header nested 5,000
deep, a checkpoint whose pickle inflates to 3 GiB, a results line and a PNG record nested 5,000 deep, a 1 MB
checkpoint name, a request that would hold a CPU for hours. The app starts, lists the good checkpoints, and
answers each in one line, at once."""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError, ValidationError
from PIL import Image, PngImagePlugin
from safetensors.torch import save_file

from app.generate import DEFAULT_PIXEL_STEPS, MAX_CHECKPOINT_CHARS, Limits, LimitError, check_pixel_steps
from app.handlers import Handlers
from app.service import Runtime, Service

from ..checkpoints.test_hostile_checkpoints import _pickle_of, deflated, with_pickle_replaced
from ..checkpoints.test_hostile_sharded import write_hostile_sharded
from ..conftest import DWB, REPO
from ..servers import ServerProcess, free_port
from ..train.test_sharded_checkpoints import write_sharded

GOOD = "run/ep0-ba4-rank0.pt"
DEEP = 5000
DATA_LIMIT = 3 << 30  # bytes of data memory the app runs with (RLIMIT_DATA): the bomb's 3.2 GB would not fit


def deep_json(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


def single_file_keys() -> dict[str, torch.Tensor]:
    """The fewest tensors the door reads as an SD 2.x single file (its keys and the UNet's input channels)."""
    return {"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(8, 4, 3, 3),
            "first_stage_model.quant_conv.weight": torch.zeros(8, 8, 1, 1),
            "cond_stage_model.model.token_embedding.weight": torch.zeros(8, 4)}


def write_hostile_root(root: Path, good: Path) -> dict[str, Path]:
    """Under ``root``: a good Composer checkpoint, a safetensors file whose header nests 5,000 deep, one whose spec
    metadata does (its header is fine: it is listed, and refused when opened), and a checkpoint whose pickle
    inflates to 3 GiB."""
    (root / "run").mkdir(parents=True)
    shutil.copy2(good, root / GOOD)
    header = json.dumps({"__metadata__": {"format": "pt"}}).encode()[:-1] + f', "x": {deep_json()}}}'.encode()
    deep = root / "deep-header.safetensors"
    deep.write_bytes(len(header).to_bytes(8, "little") + header)
    spec = root / "deep-spec.safetensors"
    save_file(single_file_keys(), str(spec), metadata={"format": "pt", "dwb.spec": deep_json()})
    (root / "bomb").mkdir()
    raw, crc, size = deflated(_pickle_of(good), 3 * 1024)
    bomb = with_pickle_replaced(good, root / "bomb" / "ep0-ba9-rank0.pt", raw, crc, size)
    return {"deep": deep, "spec": spec, "bomb": bomb}


class LimitedApp(ServerProcess):
    """`dwb app` as users start it, with its data memory held under ``DATA_LIMIT`` (``prlimit --data``)."""

    def __init__(self, root: Path, results: Path, log: Path):
        port = free_port()
        super().__init__(["prlimit", f"--data={DATA_LIMIT}", DWB, "app", "--checkpoints", root, "--results", results,
                          "--port", port, "--device", "cpu"], port=port, ready_path="/gradio_api/info",
                         timeout=180.0, log=log, cwd=REPO, env={"GRADIO_ANALYTICS_ENABLED": "False"})


@pytest.fixture(scope="module")
def hostile(tiny_run, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile-app")
    root, results = folder / "checkpoints", folder / "results"
    files = write_hostile_root(root, tiny_run / "ep0-ba4-rank0.pt")
    files.update(write_hostile_sharded(root, write_sharded(tiny_run / "ep0-ba4-rank0.pt", folder / "sharded" / "ep0")))
    outside = Path(shutil.copy2(tiny_run / "ep0-ba4-rank0.pt", folder / "outside.pt"))  # a checkpoint not under root
    results.mkdir()
    app = LimitedApp(root, results, folder / "app.log")
    app.start()
    app.root, app.results, app.files, app.outside = root, results, files, outside
    yield app
    app.stop()


@pytest.fixture
def client(hostile, tmp_path):
    return Client(hostile.url, verbose=False, download_files=str(tmp_path))


def generate(client, **kw):
    args = dict(checkpoint=GOOD, weights="ema", prompt="two blue squares", negative_prompt="", sampler="Euler a",
                steps=2, guidance_scale=5.0, width=16, height=16, seed=7, batch_size=1)
    return client.predict(**{**args, **kw}, api_name="/generate")


def test_the_app_starts_among_hostile_checkpoints_and_lists_the_good_ones(hostile, client):
    """A safetensors header nested 5,000 deep raised RecursionError in the listing: the app would not start. The
    3 GiB pickle took the listing past 2 GiB. Here the app starts with its data memory under 3 GiB, says why each
    file is not listed in one line, lists the others, and serves them."""
    log = hostile.output()
    assert "dwb app: 2 checkpoint(s) under" in log, log  # the good one, and the deep spec's (its header is fine)
    assert "not listed: cannot read deep-header.safetensors: its safetensors header: JSON nested deeper than 64 " \
           "levels" in log, log
    assert re.search(r"not listed: cannot read checkpoint bomb/ep0-ba9-rank0.pt: its compressed zip members would "
                     r"inflate to at least 3,2\d\d,\d{3},\d{3} bytes .* over the limit of 268,435,456", log), log
    assert "RecursionError" not in log and "Traceback" not in log
    handlers = Handlers(Service([hostile.root], runtime=Runtime("cpu", torch.float32)))  # what a page load lists
    assert [label for label, _ in handlers.choices()[0]] == ["deep-spec.safetensors", GOOD]
    gallery, parameters = generate(client)
    assert "Model: run/ep0-ba4-rank0.pt" in parameters and len(gallery) == 1
    with pytest.raises(AppError) as e:
        generate(client, checkpoint="deep-spec.safetensors")
    [line] = str(e.value).splitlines()
    assert "deep-spec.safetensors's metadata: its dwb.spec metadata: JSON nested deeper than 64 levels" in line, line
    for name in ("deep-header.safetensors", "bomb/ep0-ba9-rank0.pt"):
        with pytest.raises(AppError) as e:
            generate(client, checkpoint=name)
        assert "\n" not in str(e.value) and str(hostile.root) not in str(e.value)
    assert hostile.proc.poll() is None


def test_a_poisoned_sharded_index_among_the_checkpoints_changes_no_check_of_the_app(hostile, client):
    """A sharded folder whose 123-byte index sets pathlib's ``is_relative_to``, ``relative_to`` and ``is_symlink``
    (pickle's BUILD on a class it names) was read by the app's listing in the server process: from then on a
    checkpoint outside ``--checkpoints`` was drawn from, and ``/etc`` answered "a folder, not a checkpoint". F7's
    folder (a value inflating to 3 GiB) kept the app from starting. Both are left out of the listing in one line,
    the outside checkpoint is refused, and ``/etc`` is answered as a path that does not exist."""
    log = hostile.output()
    assert "not listed: cannot read sharded checkpoint poisoned/ep0-ba1: the index's BUILD opcode would set " \
           "attributes of pathlib.PosixPath, not of a record it made" in log, log
    assert re.search(r"not listed: cannot read sharded checkpoint value-bomb/ep0-ba9: state.run_name is corrupt .*"
                     r"zip member \S+/data.pkl is compressed", log), log
    answers = {}
    for name in (str(hostile.outside), "/etc", "/no-such-folder"):
        with pytest.raises(AppError) as e:
            generate(client, checkpoint=name)
        [answers[name]] = str(e.value).splitlines()
    assert answers[str(hostile.outside)].endswith("is outside the allowed checkpoint folders"), answers
    assert answers["/etc"].replace("/etc", "PATH") == answers["/no-such-folder"].replace("/no-such-folder", "PATH")
    assert hostile.proc.poll() is None


def test_a_checkpoint_note_for_a_deep_spec_is_one_line(hostile):
    """Once the deep spec was the newest checkpoint, every page load (which describes the newest) listed none."""
    handlers = Handlers(Service([hostile.root], runtime=Runtime("cpu", torch.float32)))
    (hostile.files["spec"]).touch()
    update, _, _, note, *_ = handlers.on_load(None)
    assert update["value"] == "deep-spec.safetensors" and [c for c, _ in update["choices"]] == [
        "deep-spec.safetensors", GOOD]
    assert note.startswith("**Cannot use this checkpoint:**") and "JSON nested deeper than 64 levels" in note
    assert "\n" not in note


def test_a_png_record_nested_5000_deep_is_one_line_in_png_info(client, tmp_path):
    """PNG Info raised a raw error on a ``dwb`` chunk nested 5,000 deep; it now reads the parameters text and says
    in one note why the record was not read."""
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", "a red circle\nSteps: 3, Sampler: DDIM, CFG scale: 5, Seed: 9, Size: 16x16")
    info.add_text("dwb", deep_json())
    Image.new("RGB", (16, 16)).save(tmp_path / "deep.png", pnginfo=info)
    text, values, notes = client.predict(handle_file(str(tmp_path / "deep.png")), api_name="/png_info")
    assert text.startswith("a red circle")
    assert (values["prompt"], values["steps"], values["seed"]) == ("a red circle", 3, 9)
    assert notes.splitlines()[0] == ("- this PNG's dwb record: JSON nested deeper than 64 levels; its parameters text "
                                     "was read instead")


def test_a_results_line_nested_5000_deep_is_skipped_and_said(hostile, tmp_path):
    """A results.jsonl line nested 5,000 deep made the Scores tab answer 500; the row is skipped, the tab says so,
    and the other rows are plotted."""
    from models.checkpoints import content_hash, find_checkpoint

    digest = content_hash(find_checkpoint(hostile.root / GOOD))
    good = dict(checkpoint_hash=digest, model="run/ep0-ba4-rank0", step=4, guidance=5.0, sampler="DDIM", status="ok",
                fid=12.5, fid_lo=11.0, fid_hi=14.0)
    (tmp_path / "results.jsonl").write_text(json.dumps(good) + "\n" + deep_json() + "\n")
    handlers = Handlers(Service([hostile.root], runtime=Runtime("cpu", torch.float32), results=[tmp_path]))
    metric, plot, table, note, *_ = handlers.scores_view(None)
    assert metric["value"] == "fid" and len(table.data) == 1
    assert note == ("Skipped 1 unreadable results row: results.jsonl line 2: JSON nested deeper than 64 levels.")
    assert "scores" in handlers.checkpoint_note(GOOD)[0]  # the checkpoint note reads the good row too


def test_a_1_mb_checkpoint_name_is_refused_at_once_and_no_one_waits(hostile, client):
    """A 1 MB checkpoint name held the generation slot for 10 s (another client waited 10.8 s): 500,000 "a/" parts
    took 48 s to resolve. Names longer than a path can be are refused before any filesystem work, in every handler
    that takes one (an X/Y/Z axis's values are capped at 200,100 characters: a name of 100,000 there)."""
    generate(client)  # the good checkpoint loaded: what follows times requests, not a load
    other = Client(hostile.url, verbose=False, download_files=False)
    base = dict(weights="ema", prompt="two blue squares", negative_prompt="", sampler="Euler a", steps=2,
                guidance_scale=5.0, width=16, height=16, seed=7)
    plot = dict(checkpoint=GOOD, x_type="checkpoint", y_type="none", y_values="", z_type="none", z_values="",
                batch_size=1)
    for api, name, kw in (("/generate", "a/" * 500_000, lambda name: dict(checkpoint=name, batch_size=1)),
                          ("/compare", "a/" * 500_000, lambda name: dict(checkpoints=[GOOD, name])),
                          ("/xyz_plot", "a/" * 50_000, lambda name: dict(**plot, x_values=f"{GOOD}\n{name}"))):
        t0 = time.perf_counter()
        job = client.submit(**base, **kw(name), api_name=api)
        waiting = other.submit(**base, checkpoint=GOOD, batch_size=1, api_name="/generate")
        with pytest.raises(AppError) as e:
            job.result(timeout=120)
        refused = time.perf_counter() - t0
        assert str(e.value).endswith(f"a checkpoint name of {len(name):,} characters; at most "
                                     f"{MAX_CHECKPOINT_CHARS:,} are accepted (no longer path can be opened)"), api
        waiting.result(timeout=120)
        # the slot was not held: resolving the 1 MB name alone took 48 s (on a machine busy with other tests, the
        # other client's generation took up to 7 s)
        assert refused < 3.0 and time.perf_counter() - t0 < 20.0, (api, refused)


def test_a_request_of_hours_on_the_cpu_is_refused_with_its_estimated_time(client):
    """On a CPU, 1024x1024 at 150 steps (157M pixel-steps) was under the 250M cap and held the only slot for about
    14 h. The app's default cap is chosen by its device (8M on a CPU), and the refusal says how long it would take."""
    job = client.submit(GOOD, "ema", "a red circle", "", "DDIM", 150, 5.0, 1024, 1024, 7, 1, api_name="/generate")
    with pytest.raises(ValidationError) as e:
        job.result(timeout=30)
    message = str(e.value).splitlines()[-1]
    assert message == ("- prompt: this request is 157,286,400 pixel-steps (width x height x steps, for each image); "
                       f"at most {DEFAULT_PIXEL_STEPS['cpu']:,} are allowed (dwb app --max-pixel-steps): on this "
                       "server's CPU an SD2-size model takes about 75 s a million, so it would hold the generation "
                       "slot for about 3.3 h")
    gallery, _ = generate(client, width=256, height=256, steps=2)  # an ordinary CPU request still runs
    assert len(gallery) == 1


def test_the_pixel_step_defaults_follow_the_device():
    cpu, gpu = Limits.for_device("cpu"), Limits.for_device("cuda:1")
    assert (cpu.max_pixel_steps, cpu.max_client_pixel_steps) == (8_000_000, 16_000_000)
    assert (gpu.max_pixel_steps, gpu.max_client_pixel_steps) == (250_000_000, 500_000_000) == \
        (Limits().max_pixel_steps, Limits().max_client_pixel_steps)
    assert Limits.for_device("cpu", max_pixel_steps=50_000_000).max_client_pixel_steps == 100_000_000
    check_pixel_steps(512 * 512 * 25, cpu)  # one SD2-size image at the default steps fits a CPU's default
    with pytest.raises(LimitError, match="about 16 min"):  # 13.1M at 75 s a million
        check_pixel_steps(512 * 512 * 50, cpu)
