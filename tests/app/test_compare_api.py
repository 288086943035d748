"""`dwb app` as users start it on a network, through gradio_client and plain HTTP: the X/Y/Z plot's cells equal
single generations, PNG Info's round trip, and each abuse refused quickly with nothing written or served."""
import io
import os
import re
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError, ValidationError
from PIL import Image, PngImagePlugin

from models.generation import parse_parameters

from ..servers import connect, still_open
from .conftest import AppServer

BA2, BA4 = "tiny-phase1/ep0-ba2-rank0.pt", "tiny-phase1/ep0-ba4-rank0.pt"
UPLOAD_MB, UPLOAD_AGE, CLIENT_UPLOAD_MB, TOTAL_UPLOAD_MB = 1, 2, 4, 6
REQUEST_TIMEOUT, MAX_CONNECTIONS = 2, 100
PROXY = "127.0.0.2"  # any 127.x address reaches the server; the test's sockets choose theirs


@pytest.fixture(scope="module")
def net(tree, tmp_path_factory):
    """One server for this module, as on a network: its own temp and output folders, uploads capped at 1 MB each,
    4 MB a client and 6 MB in all and swept after 2 s, a reverse proxy at 127.0.0.2 (tests connect from there
    to be other clients), requests that must arrive within 2 s, 100 connections at most, and the default
    limits on work."""
    folder = tmp_path_factory.mktemp("net")
    temp, output, partial = folder / "gradio-temp", folder / "output", folder / "tmp"
    partial.mkdir()
    app = AppServer([tree.root], "--host", "127.0.0.1", "--output", str(output), "--max-upload-mb", str(UPLOAD_MB),
                    "--upload-max-age", str(UPLOAD_AGE), "--max-client-upload-mb", str(CLIENT_UPLOAD_MB),
                    "--max-total-upload-mb", str(TOTAL_UPLOAD_MB), "--trusted-proxy", PROXY,
                    "--request-timeout", str(REQUEST_TIMEOUT), "--max-connections", str(MAX_CONNECTIONS),
                    log=folder / "app.log",
                    env={"GRADIO_TEMP_DIR": str(temp), "TMPDIR": str(partial)})
    app.launch().wait_ready()
    app.temp, app.written, app.partial = temp, output, partial  # partial: where uploads are written as they arrive
    yield app
    app.stop()


@pytest.fixture
def api(net, tmp_path):
    return Client(net.url, verbose=False, download_files=str(tmp_path))


def files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


def generate(api, **kw):
    args = dict(checkpoint=BA4, weights="ema", prompt="two blue squares", negative_prompt="", sampler="Euler a",
                steps=3, guidance_scale=5.0, width=16, height=16, seed=7, batch_size=1)
    return api.predict(**{**args, **kw}, api_name="/generate")


def pixels(path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def test_xyz_plot_cells_equal_single_generations(api):
    grids, cells, text = api.predict(
        checkpoint=BA4, weights="ema", prompt="two blue squares", negative_prompt="", sampler="Euler a", steps=3,
        guidance_scale=5.0, width=16, height=16, seed=7, x_type="checkpoint", x_values=f"{BA2}\n{BA4}",
        y_type="seed", y_values="11, 12", z_type="none", z_values="", batch_size=1, api_name="/xyz_plot")
    assert len(grids) == 1 and len(cells) == 4
    assert [c["caption"] for c in cells] == [f"{BA2} | seed 11", f"{BA4} | seed 11", f"{BA2} | seed 12",
                                             f"{BA4} | seed 12"]
    for cell in cells:
        checkpoint, seed = cell["caption"].split(" | seed ")
        alone = generate(api, checkpoint=checkpoint, seed=int(seed))[0][0]
        assert np.array_equal(pixels(cell["image"]), pixels(alone["image"])), cell["caption"]  # bit for bit
    assert "Seed: 11" in text and f"Model: {BA2}" in text
    grid = Image.open(grids[0]["image"])
    assert grid.width > 2 * 128 and grid.height > 2 * 128  # two enlarged cells per side, with labels


def test_png_info_round_trip_regenerates_the_same_image(api, net, tmp_path):
    made = generate(api, prompt="a red circle", negative_prompt="blue", sampler="DDIM", steps=4, guidance_scale=6.0,
                    seed=21)[0][0]["image"]
    marked = tmp_path / "marked.png"
    with Image.open(made) as im:
        info = PngImagePlugin.PngInfo()
        info.add_text("parameters", im.text["parameters"])
        info.add_text("marker", "dwb-upload-marker-8c1f")  # tells this upload apart from the app's own copy
        im.save(marked, pnginfo=info)
    text, values, notes = api.predict(image=handle_file(str(marked)), api_name="/png_info")
    leftovers = [p for p in files(net.temp) if b"dwb-upload-marker-8c1f" in p.read_bytes()]
    assert not leftovers  # the upload was deleted once read (before the sweep's 2 s)
    assert "Seed: 21" in text and values["checkpoint"] == BA4 and "found by its model hash" in notes
    assert (values["prompt"], values["negative_prompt"], values["sampler"], values["steps"], values["guidance"],
            values["seed"], values["weights"]) == ("a red circle", "blue", "DDIM", 4, 6.0, 21, "ema")
    again = generate(api, checkpoint=values["checkpoint"], weights=values["weights"], prompt=values["prompt"],
                     negative_prompt=values["negative_prompt"], sampler=values["sampler"], steps=values["steps"],
                     guidance_scale=values["guidance"], width=values["width"], height=values["height"],
                     seed=values["seed"])[0][0]["image"]
    assert np.array_equal(pixels(again), pixels(made))


def png_with(path: Path, **chunks: str) -> Path:
    """An 8x8 PNG carrying the given text chunks (compressed: a megabyte of text in a small file)."""
    info = PngImagePlugin.PngInfo()
    for key, value in chunks.items():
        info.add_text(key, value, zip=True)
    Image.new("RGB", (8, 8)).save(path, pnginfo=info)
    return path


def test_png_info_reads_any_parameters_text_at_once_and_refuses_long_ones(api, tmp_path):
    spaces = png_with(tmp_path / "spaces.png", parameters="p\n" + " " * 2400)  # took 54 s, stalling every route
    t0 = time.perf_counter()
    text, values, notes = api.predict(image=handle_file(str(spaces)), api_name="/png_info")
    assert time.perf_counter() - t0 < 2.0 and values["prompt"] == "p"

    megabyte = png_with(tmp_path / "megabyte.png", parameters="p\n" + "Steps: 1, " * 100_000)
    t0 = time.perf_counter()
    with pytest.raises(AppError) as e:
        api.predict(image=handle_file(str(megabyte)), api_name="/png_info")
    assert time.perf_counter() - t0 < 2.0
    assert str(e.value) == "this PNG's parameters text is 1,000,002 characters long; at most 65,536 are read"


def test_a_prompt_cannot_inject_parameters_into_png_info(api, tmp_path):
    """A line break in a prompt used to start a "Negative prompt:" (or a settings line) of its own when PNG Info
    read the image back, and Send to Generate made another image."""
    prompt, negative = "a red circle\nNegative prompt: blue square", "green\nSteps: 1, Seed: 99"
    made = generate(api, prompt=prompt, negative_prompt=negative, steps=3, seed=5)[0][0]["image"]
    text, values, notes = api.predict(image=handle_file(made), api_name="/png_info")
    assert (values["prompt"], values["negative_prompt"], values["steps"], values["seed"]) == (prompt, negative, 3, 5)
    shown = parse_parameters(text)  # what AUTOMATIC1111 and other readers of the text see
    assert shown["negative_prompt"] == "green Steps: 1, Seed: 99" and (shown["Steps"], shown["Seed"]) == ("3", "5")
    again = generate(api, prompt=values["prompt"], negative_prompt=values["negative_prompt"], steps=values["steps"],
                     seed=values["seed"])[0][0]["image"]
    assert np.array_equal(pixels(again), pixels(made))


def test_huge_prompts_and_lists_are_refused_at_once_with_nothing_written(api, net):
    before = files(net.temp) | files(net.written)
    cases = [(dict(prompt="x" * 1_000_000), "prompt is 1,000,000 characters long; at most 2,000 are accepted"),
             (dict(negative_prompt="y" * 1_000_000), "negative prompt is 1,000,000 characters long"),
             (dict(prompt=["a red circle", "two blue squares"]), "prompt must be text, got list"),
             (dict(checkpoint=[BA2, BA4]), "a checkpoint is named by one text, got list"),
             (dict(sampler=["DDIM"]), "sampler must be text, got list"),
             (dict(steps=[3]), "steps must be a whole number, got [3]")]
    for change, message in cases:
        t0 = time.perf_counter()
        with pytest.raises(AppError) as e:
            generate(api, **change)
        assert time.perf_counter() - t0 < 1.0, message
        assert message in str(e.value) and "\n" not in str(e.value) and "Traceback" not in str(e.value)
    with pytest.raises(AppError, match="X axis values must be text, got list"):
        api.predict(BA4, "ema", "a", "", "DDIM", 3, 5.0, 16, 16, 7, "seed", ["1", "2"], "none", "", "none", "", 1,
                    api_name="/xyz_plot")
    assert files(net.temp) | files(net.written) == before


def test_messages_name_checkpoints_by_label_never_by_server_path(api, tree):
    with pytest.raises(AppError) as e:
        generate(api, checkpoint=str(tree.root / "tiny-phase1" / "ep0-ba99-rank0.pt"))
    assert "ep0-ba99-rank0.pt" in str(e.value) and str(tree.root) not in str(e.value)
    with pytest.raises(AppError) as e:
        generate(api, checkpoint="broken/ep0-ba9-rank0.pt")
    assert "broken/ep0-ba9-rank0.pt" in str(e.value) and str(tree.root) not in str(e.value)


def test_uploads_are_capped_and_never_kept(net):
    before = files(net.temp)
    big = io.BytesIO(b"\x89PNG" + bytes(UPLOAD_MB * 2**20 + 1))
    r = httpx.post(f"{net.url}/gradio_api/upload", files={"files": ("big.png", big, "image/png")}, timeout=30)
    assert r.status_code == 413
    assert files(net.temp) == before  # nothing of it landed in the temp folder

    r = httpx.post(f"{net.url}/gradio_api/upload", files={"files": ("small.png", b"not read by any event")},
                   timeout=30)
    assert r.status_code == 200
    path = r.json()[0]
    assert httpx.get(f"{net.url}/gradio_api/file={path}", timeout=10).status_code == 200
    deadline = time.monotonic() + 4 * UPLOAD_AGE + 5
    while Path(path).exists():  # an upload no event read is swept after --upload-max-age seconds
        assert time.monotonic() < deadline, "the unread upload was not swept"
        time.sleep(0.25)
    assert httpx.get(f"{net.url}/gradio_api/file={path}", timeout=10).status_code in (403, 404)


def inputs(**kw) -> list:
    """/generate's inputs in order, as plain HTTP sends them."""
    args = dict(checkpoint=BA4, weights="ema", prompt="two blue squares", negative_prompt="", sampler="DDIM", steps=2,
                guidance_scale=5.0, width=16, height=16, seed=7, batch_size=1, parts="", refiner="", refiner_switch=0.8,
                mode="txt2img", init_image=None, editor=None, strength=0.75, mask_blur=4, hires_scale=1, hires_steps=0,
                hires_upscaler="Latent", clip_skip=1, vae="", controlnet="", control_image=None,
                control_preprocess="none", control_weight=1, control_start=0, control_end=1)
    return list({**args, **kw}.values())


def join(net, data: list, source: str = "127.0.0.1", forwarded_for: str | None = None) -> httpx.Response:
    """POST /gradio_api/call/generate from the address ``source``, as a client or a reverse proxy would."""
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30) as http:
        return http.post(f"{net.url}/gradio_api/call/generate", json={"data": data}, headers=headers)


def test_a_request_over_the_work_limit_is_refused_when_it_joins_the_queue(api, net):
    """1024x1024, 150 steps, batch 8 passed each per-setting limit and held the only slot for days (a 1024 px step
    of the tiny model took 338 s): 1,258,291,200 pixel-steps, over the default of 250M on a GPU and 8M on a CPU."""
    import torch

    from app.generate import DEFAULT_PIXEL_STEPS

    device = "gpu" if torch.cuda.is_available() else "cpu"  # what `dwb app --device auto` picks
    before = files(net.written)
    t0 = time.perf_counter()
    job = api.submit(BA4, "ema", "a red circle", "", "DDIM", 150, 5.0, 1024, 1024, 7, 8, api_name="/generate")
    with pytest.raises(ValidationError) as e:
        job.result(timeout=10)
    assert time.perf_counter() - t0 < 5.0
    message = str(e.value).splitlines()[-1]  # gradio_client heads it with a line of its own
    assert message.startswith("- prompt: this request is 1,258,291,200 pixel-steps (width x height x steps, for each "
                              f"image); at most {DEFAULT_PIXEL_STEPS[device]:,} are allowed (dwb app "
                              f"--max-pixel-steps): on this server's {device.upper()} an SD2-size model takes about "
                              ), message
    assert "so it would hold the generation slot for about " in message
    r = join(net, inputs(steps=150, width=1024, height=1024, batch_size=8))
    assert r.status_code == 422 and "--max-pixel-steps" in r.text
    # the route that ran an event directly, past the queue and its check, is closed
    r = httpx.post(f"{net.url}/gradio_api/run/generate", json={"data": inputs()}, timeout=30)
    assert r.status_code == 404
    assert files(net.written) == before  # nothing ran


def test_one_client_cannot_fill_the_queue(net):
    """One client (an address) has at most --max-client-requests (4) waiting or running: the queue (16) keeps room
    for others. X-Forwarded-For names another client only when a trusted proxy (--trusted-proxy) sends it."""
    from gradio_client import Client

    clients = [Client(net.url, verbose=False, download_files=False) for _ in range(5)]
    slow = (BA4, "ema", "a red circle", "", "DDIM", 150, 5.0, 64, 64, 1, 1)
    jobs = [c.submit(*slow, api_name="/generate") for c in clients]
    try:
        _wait_until(lambda: any(j.done() for j in jobs))
        refused = [j for j in jobs if j.done()]
        assert len(refused) == 1
        with pytest.raises(ValidationError, match=r"this client has 4 requests waiting or running; at most 4 at once "
                                                  r"\(dwb app --max-client-requests\)"):
            refused[0].result()
        assert join(net, inputs(), forwarded_for="10.9.9.9").status_code == 422  # not from the proxy: the same client
        assert join(net, inputs(), source=PROXY, forwarded_for="10.9.9.9").status_code == 200  # another client
        assert join(net, inputs(), source="127.0.0.3").status_code == 200  # another address
    finally:
        deadline = time.monotonic() + 60
        while not all(j.done() for j in jobs):  # waiting ones leave the queue, the running one stops
            assert time.monotonic() < deadline, "accepted requests did not end"
            for c, j in zip(clients, jobs):
                if not j.done():
                    j.cancel()
                    httpx.post(f"{c.src_prefixed}run/stop", json={"data": [], "session_hash": c.session_hash})
            time.sleep(0.2)


def _wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def upload(net, *contents: bytes, source: str) -> httpx.Response:
    """POST files to Gradio's upload route from the address ``source``."""
    files = [("files", (f"{i}.png", data, "image/png")) for i, data in enumerate(contents)]
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30) as http:
        return http.post(f"{net.url}/gradio_api/upload", files=files)


def reply_of(s) -> tuple[int, str]:
    """The status and text of the server's answer on socket ``s`` (read up to its Content-Length)."""
    s.settimeout(30)
    reply = b""
    while b"\r\n\r\n" not in reply or len(reply.split(b"\r\n\r\n", 1)[1]) < int(
            re.search(rb"content-length: (\d+)", reply, re.IGNORECASE)[1]):
        chunk = s.recv(65536)
        assert chunk, f"the server closed the connection: {reply!r}"
        reply += chunk
    head, body = reply.decode("latin1").split("\r\n\r\n", 1)
    return int(head.split()[1]), body.strip()


def upload_in_chunks(net, n_files: int, source: str, leave_after: int | None = None) -> tuple[int, str]:
    """``n_files`` files of 0.75 MB in one multipart body sent in chunks, with no Content-Length, from ``source``:
    the status and text of the answer, read as soon as there is one; with ``leave_after``, the client leaves
    after that many bytes (status 0)."""
    import select
    import socket

    body = b"".join(b'--b\r\nContent-Disposition: form-data; name="files"; filename="%d.png"\r\n\r\n%s\r\n'
                    % (i, os.urandom(750_000)) for i in range(n_files)) + b"--b--\r\n"
    with socket.create_connection(("127.0.0.1", net.port), timeout=30, source_address=(source, 0)) as s:
        s.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        for sent in range(0, len(body), 256 * 1024):
            if leave_after is not None and sent >= leave_after:
                return 0, ""
            if select.select([s], [], [], 0.05)[0]:
                break  # the server answered before the whole body
            chunk = body[sent:sent + 256 * 1024]
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        else:
            s.sendall(b"0\r\n\r\n")
        return reply_of(s)


def test_uploads_are_limited_per_client_and_in_all_before_they_are_written(net):
    """Each file was capped, not the whole: 20 files of 7 MB in one request and 20 more requests wrote 280 MiB.
    Here (1 MB files, 4 MB a client, 6 MB in all): a request over its client's limit is refused by its
    Content-Length before its body is sent; one without it, as it passes the limit; neither leaves a byte."""
    import socket

    one_mb = 1_000_000  # under --max-upload-mb
    before = files(net.temp) | files(net.partial)
    with socket.create_connection(("127.0.0.1", net.port), timeout=30, source_address=("127.0.0.4", 0)) as s:
        s.sendall(f"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                  f"Content-Length: {20 * one_mb + 4000}\r\n\r\n".encode())  # the headers, and no byte of the body
        status, text = reply_of(s)
    assert status == 413 and text == ("this client's uploads on the server would come to 19.1 MiB; at most 4 MiB at "
                                      "once (dwb app --max-client-upload-mb)")

    status, text = upload_in_chunks(net, 10, source="127.0.0.6")  # no Content-Length: counted as it comes
    assert status == 413 and text.endswith("at most 4 MiB at once (dwb app --max-client-upload-mb)")
    assert upload_in_chunks(net, 2, source="127.0.0.7", leave_after=one_mb)[0] == 0  # leaves mid-body
    time.sleep(0.5)
    assert not files(net.partial) - before and not files(net.temp) - before  # neither left a byte behind

    answers = [upload(net, os.urandom(one_mb), source="127.0.0.4") for _ in range(20)]
    refused = [r for r in answers if r.status_code == 413]
    kept = [Path(r.json()[0]) for r in answers if r.status_code == 200]
    assert refused and all("(dwb app --max-client-upload-mb)" in r.text for r in refused)
    assert len(kept) >= 3 and sum(p.stat().st_size for p in kept if p.exists()) <= CLIENT_UPLOAD_MB * 2**20
    others = [upload(net, os.urandom(one_mb), source="127.0.0.5") for _ in range(4)]  # another client, until the total
    assert others[0].status_code == 200 and others[-1].status_code == 413
    assert "at most 6 MiB at once (dwb app --max-total-upload-mb)" in others[-1].text
    assert sum(p.stat().st_size for p in files(net.temp) - before) <= TOTAL_UPLOAD_MB * 2**20

    deadline = time.monotonic() + 4 * UPLOAD_AGE + 5  # swept after --upload-max-age: the client may upload again
    while upload(net, os.urandom(one_mb), source="127.0.0.4").status_code != 200:
        assert time.monotonic() < deadline, "the client's limit was not given back"
        time.sleep(0.5)


def test_requests_not_sent_in_time_are_closed_and_connections_are_capped(net):
    """Runs last in this module: it fills the server's connections. 1,500 half-sent requests stayed open for good
    (one file descriptor each; under a limit of 1,024 open files the app then answered nobody)."""
    half_sent = [connect(net.port, head) for head in (b"GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: slo",
                                                      b"GET /gradio_api/info HTTP/1.1\r\nHost: x\r\n") * 30]
    try:
        assert httpx.get(net.url + "/gradio_api/info", timeout=10).status_code == 200  # others are served meanwhile
        assert len(still_open(half_sent, 0.2)) == 60  # not cut before the timeout
        assert not still_open(half_sent, REQUEST_TIMEOUT + 3)
    finally:
        for sock in half_sent:
            sock.close()

    idle = [connect(net.port) for _ in range(2 * MAX_CONNECTIONS)]
    try:
        held = still_open(idle, 0.5)
        assert 0 < len(held) <= MAX_CONNECTIONS
        assert not still_open(held, REQUEST_TIMEOUT + 3)
    finally:
        for sock in idle:
            sock.close()
    assert httpx.get(net.url + "/gradio_api/info", timeout=10).status_code == 200
