"""The Jobs tab of `dwb app` as users start it: its ``/jobs`` list shows this server's queued and running requests
with their step progress, and how they ended; a client sees its own prompts and checkpoints, and of another client's
requests only their state, progress and size: no prompt, no checkpoint, no server path."""
from __future__ import annotations

import re
import time

import httpx
from gradio_client import Client
from gradio_client.utils import Status

from app.jobs import COLUMNS, OTHERS

from .test_api import _wait_until, press_stop

PROMPT, LABEL = "a secret red circle", "tiny-phase1/ep0-ba4-rank0.pt"


def jobs_of(client) -> list[dict]:
    """The Jobs tab's rows as ``client`` sees them (the tab's timer event, outside the queue), by column."""
    r = httpx.post(f"{client.src_prefixed}run/jobs", json={"data": [], "session_hash": client.session_hash},
                   timeout=30)
    assert r.status_code == 200, r.text
    table = r.json()["data"][0]
    return [dict(zip(COLUMNS, row)) for row in table["data"]]


def test_the_job_list_shows_queued_and_running_requests_and_no_one_elses_prompt(server, tree):
    mine, other = (Client(server.url, verbose=False, download_files=False) for _ in range(2))
    slow = (LABEL, "ema", PROMPT, "", "DDIM", 150, 5.0, 64, 64, 1, 1)
    running = mine.submit(*slow, api_name="/generate")
    _wait_until(lambda: (s := running.status()).code == Status.PROGRESS and s.progress_data
                and (s.progress_data[0].index or 0) >= 1)
    # one request runs at a time: the other client's waits behind it
    waiting = other.submit(LABEL, "ema", "another secret", "", "DDIM", 150, 5.0, 32, 32, 1, 2, api_name="/generate")
    _wait_until(lambda: any(row["state"] == "queued" for row in jobs_of(mine)))
    try:
        rows = jobs_of(mine)
        ran = next(row for row in rows if row["state"] == "running")
        assert re.fullmatch(r"step \d+ of 150", ran["progress"]) and ran["size"] == "64x64 x 1"
        assert (ran["prompt"], ran["checkpoint"]) == (PROMPT, LABEL)
        queued = next(row for row in rows if row["state"] == "queued")
        assert (queued["progress"], queued["size"], queued["request"]) == ("next", "32x32 x 2", "Generate")
        assert (queued["prompt"], queued["checkpoint"]) == (OTHERS, "")  # the other client's
        seen = jobs_of(other)
        assert [(row["state"], row["prompt"]) for row in seen if row["state"] in ("queued", "running")] == [
            ("queued", "another secret"), ("running", OTHERS)]
        shown = repr(seen) + repr(rows)
        assert "a secret" not in repr(seen) and "another secret" not in repr(rows)
        assert str(tree.root) not in shown and str(tree.root.parent) not in shown
    finally:  # each client's request stopped (a waiting one may start before its cancel lands)
        waiting.cancel()
        deadline = time.monotonic() + 60
        while any(row["state"] in ("running", "queued") for row in jobs_of(mine)):
            assert time.monotonic() < deadline, jobs_of(mine)
            press_stop(mine)
            press_stop(other)
            time.sleep(0.2)
    ended = next(row for row in jobs_of(mine) if row["prompt"] == PROMPT)
    assert ended["state"] == "stopped" and re.fullmatch(r"in \d+\.\d s", ended["progress"])


def test_what_a_waiting_request_sent_is_shown_bounded(tmp_path):
    """A request's raw inputs are listed before its own checks run: a hostile one's size is "?", its million-character
    prompt is cut for its sender and hidden from everyone else, and the list still answers."""
    from types import SimpleNamespace

    from app.handlers import Handlers
    from app.service import Service

    handlers = Handlers(Service([tmp_path]))
    sent = [[b"x", 1], "ema", "p" * 10**6, "", "Euler", 2, 5.0, "9" * 10**6, {"a": 1}, 1, True]
    handlers.waiting = lambda: [("them", handlers.generate, sent)]
    (seen,) = handlers.job_list(SimpleNamespace(session_hash="me"))
    assert dict(zip(COLUMNS, seen)) == {"#": "", "request": "Generate", "state": "queued", "progress": "next",
                                        "size": "?", "prompt": OTHERS, "checkpoint": ""}
    (own,) = handlers.job_list(SimpleNamespace(session_hash="them"))
    assert len(repr(own)) < 500 and own[5] == "p" * 80
