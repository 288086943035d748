"""The rating server's edges under attack: forged client addresses, the admin cookie behind a proxy, image sizes
that name the model, image paths that leave the study, and requests that are never finished.

One `dwb human-eval serve` takes the attacks over real sockets: a study of a 16 px and a 32 px model, 127.0.0.2
as its reverse proxy, 5 new raters a minute, a 2 s request timeout and a cap of 100 connections. All of
127.0.0.0/8 is loopback, so a client bound to 127.0.0.2 or 127.0.0.3 reaches it from another address.
"""
import json
import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from human_eval.images import PIXEL_CHUNKS, png_chunk_types
from human_eval.samples import read_manifest
from human_eval.study import build_study

from ..servers import ServerExited, connect, still_open
from .conftest import Server, cookie_attributes, drawbench, start_rater, write_samples
from .test_blind import ihdr
from .test_cli import one_line_error

PROXY, OUTSIDER = "127.0.0.2", "127.0.0.3"
REQUEST_TIMEOUT, MAX_CONNECTIONS = 2, 100


@pytest.fixture(scope="module")
def mixed_study(tmp_path_factory) -> Path:
    """A 16 px model against a 32 px model on 4 prompts (4 pairs)."""
    root = tmp_path_factory.mktemp("mixed")
    samples = read_manifest(write_samples(root / "small", "small", drawbench(4), size=16, seed=1))
    samples += read_manifest(write_samples(root / "big", "big", drawbench(4), size=32, seed=2))
    build_study(samples, root / "study", progress=False)
    return root / "study"


@pytest.fixture(scope="module")
def server(mixed_study):
    with Server(mixed_study, "--trusted-proxy", PROXY, "--new-raters-per-minute", "5",
                "--request-timeout", str(REQUEST_TIMEOUT), "--max-connections", str(MAX_CONNECTIONS)) as s:
        yield s


def client(server: Server, address: str = "127.0.0.1") -> httpx.Client:
    """An HTTP client whose connections come from `address`."""
    return httpx.Client(base_url=server.url, transport=httpx.HTTPTransport(local_address=address))


def test_forwarded_for_counts_only_from_a_trusted_proxy(server):
    def new_rater(c: httpx.Client, forwarded: str) -> int:
        return c.post("/api/session", json={"rater": None}, headers={"X-Forwarded-For": forwarded}).status_code

    with client(server, PROXY) as proxy, client(server, OUTSIDER) as outsider:
        assert [new_rater(proxy, "203.0.113.7") for _ in range(6)] == [200] * 5 + [429]  # one rater behind the proxy
        # what that rater writes into the header before the proxy appends their address changes nothing
        assert new_rater(proxy, "198.51.100.1, 203.0.113.7") == 429
        assert new_rater(proxy, "203.0.113.8") == 200  # another rater behind the same proxy has their own limit
        # a client that is not a listed proxy: its header is ignored, it gets 5 however it varies the header
        assert [new_rater(outsider, f"198.51.100.{i}") for i in range(8)] == [200] * 5 + [429] * 3


def test_the_admin_cookie_is_secure_behind_an_https_proxy(server):
    with client(server, PROXY) as proxy:
        r = proxy.get("/admin", params={"token": server.token}, headers={"X-Forwarded-Proto": "https"},
                      follow_redirects=False)
    assert r.status_code == 303
    cookie = cookie_attributes(r.headers["set-cookie"])
    assert "secure" in cookie and "httponly" in cookie and cookie["samesite"].lower() == "strict"
    assert server.token not in cookie["value"]


@pytest.mark.parametrize("expiry", [b"9" * 5000, b"\xb2", b"-1", b""])
def test_a_cookie_of_any_make_is_no_session(server, expiry):
    """An expiry of 5,000 digits (past int()'s 4,300) or a superscript two (the header's byte 0xb2, which str.isdigit
    passes and int refuses) answered 500; like any other bad cookie, each is simply not a session."""
    with client(server) as c:
        r = c.get("/admin", headers={"Cookie": b"dwb_admin=" + expiry + b".0123abcd"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert c.get("/healthz").status_code == 200


def test_every_image_a_rater_sees_has_the_studys_size(server, mixed_study):
    sizes, pairs = set(), 0
    with client(server) as c:
        rater = start_rater(c)
        while not (p := c.get("/api/next", params={"rater": rater}).json())["done"]:
            for url in p["images"]:
                data = c.get(url).content
                sizes.add(ihdr(data)[:2])
                assert set(png_chunk_types(data)) <= PIXEL_CHUNKS
            for q in p["questions"]:
                c.post("/api/vote", json={"rater": rater, "pair": p["pair"], "question": q["id"], "answer": "none"})
            pairs += 1
    assert pairs == 4 and sizes == {(32, 32)}
    assert json.loads((mixed_study / "study.json").read_text())["image_size"] == [32, 32]  # the largest image's


def test_create_takes_the_image_size_it_is_given(mixed_study, tmp_path, dwb):
    manifests = [str(mixed_study.parent / name / "manifest.jsonl") for name in ("small", "big")]
    r = dwb("human-eval", "create", str(tmp_path / "s"), "--samples", manifests[0], "--samples", manifests[1],
            "--image-size", "24")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "s" / "study.json").read_text())["image_size"] == [24, 24]
    assert {ihdr(f.read_bytes())[:2] for f in (tmp_path / "s" / "images").iterdir()} == {(24, 24)}
    bad = dwb("human-eval", "create", str(tmp_path / "t"), "--samples", manifests[0], "--samples", manifests[1],
              "--image-size", "0")
    assert bad.returncode == 2 and "--image-size" in bad.stderr and not (tmp_path / "t").exists()


@pytest.mark.parametrize("escape", ["symlink", "absolute", "parent"])
def test_images_outside_the_study_are_refused_at_serve(mixed_study, tmp_path, escape):
    study = tmp_path / "study"
    shutil.copytree(mixed_study, study, ignore=shutil.ignore_patterns("votes.sqlite*", "admin_token"))
    data = json.loads((study / "study.json").read_text())
    image = next(iter(data["images"].values()))
    private = tmp_path / "private.png"  # any PNG elsewhere on the server's disk
    shutil.copy(study / image["file"], private)
    if escape == "symlink":  # as a study unpacked from an archive may hold
        (study / image["file"]).unlink()
        (study / image["file"]).symlink_to(private)
    else:
        image["file"] = str(private) if escape == "absolute" else os.path.relpath("/etc/hostname", study)
        (study / "study.json").write_text(json.dumps(data))
    try:
        with Server(study):
            said = "served"
    except ServerExited as e:
        said = e.output.strip()
    lines = said.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and image["file"] in lines[0], said
    assert "Traceback" not in said


def test_create_writes_nothing_outside_the_study(mixed_study, tmp_path, dwb):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "images").symlink_to(elsewhere)
    manifests = [str(mixed_study.parent / name / "manifest.jsonl") for name in ("small", "big")]
    one_line_error(dwb("human-eval", "create", str(tmp_path / "s"), "--samples", manifests[0], "--samples", manifests[1]),
                   f"{tmp_path / 's' / 'images'}")
    assert not list(elsewhere.iterdir()) and not (tmp_path / "s" / "study.json").exists()


HALF_SENT = (
    b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: slo",  # a head cut mid-line
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n",  # a head without its closing blank line
    b"POST /api/vote HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 90\r\n\r\n{\"rater\"",
)


def test_requests_not_sent_in_time_are_closed_and_connections_are_capped(server):
    """Runs last in this module: it fills the server's connections."""
    half_sent = [connect(server.port, HALF_SENT[i % 3]) for i in range(90)]
    try:
        assert httpx.get(server.url + "/healthz").status_code == 200  # raters are served meanwhile
        with connect(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n") as slow:  # slow, but in time
            time.sleep(0.5)
            slow.sendall(b"Connection: close\r\n\r\n")
            assert slow.recv(65536).startswith(b"HTTP/1.1 200")
        assert len(still_open(half_sent, 0.2)) == 90  # not cut before the timeout
        assert not still_open(half_sent, REQUEST_TIMEOUT + 3)
    finally:
        for sock in half_sent:
            sock.close()

    started = time.monotonic()
    idle = [connect(server.port) for _ in range(3 * MAX_CONNECTIONS)]
    try:
        held = still_open(idle, 0.5)
        assert time.monotonic() - started < REQUEST_TIMEOUT  # counted before the timeout closes any
        assert 0 < len(held) <= MAX_CONNECTIONS
        assert not still_open(held, REQUEST_TIMEOUT + 3)
    finally:
        for sock in idle:
            sock.close()
    assert httpx.get(server.url + "/healthz").status_code == 200
