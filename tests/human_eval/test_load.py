"""50 raters at once, 40 votes each, with the server killed and restarted half-way: no vote lost or doubled."""
import asyncio
import sqlite3
import time
import zlib

import httpx
import pytest

from human_eval.samples import read_manifest
from human_eval.study import build_study

from .conftest import Server, drawbench, write_samples

RATERS, PAIRS_EACH = 50, 20  # x 2 questions = 40 votes per rater, 2000 in all
ANSWERS = ("A", "B", "none")


@pytest.fixture(scope="module")
def load_study_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("load")
    samples = []
    for i, name in enumerate(("alpha", "beta", "gamma")):
        samples += read_manifest(write_samples(root / name, name, drawbench(10), 1, size=16, seed=i))
    build_study(samples, root / "study", progress=False)  # 3 model pairs x 10 prompts = 30 pairs
    return root / "study"


def test_concurrent_raters_and_a_restart_lose_and_double_nothing(load_study_dir):
    server = Server(load_study_dir, "--per-rater", str(PAIRS_EACH)).start()
    intended: dict[tuple[str, str, str], str] = {}
    stats = {"ok": 0, "retries": 0, "acknowledged_again": 0, "at_kill": None}
    t0 = time.monotonic()
    deadline = t0 + 120

    async def call(client: httpx.AsyncClient, method: str, url: str, **kw) -> httpx.Response:
        """Retry through the restart until the server answers (every request here is safe to repeat)."""
        while True:
            assert time.monotonic() < deadline, "load test took over 120 s"
            try:
                r = await client.request(method, url, **kw)
            except httpx.TransportError:
                stats["retries"] += 1
                await asyncio.sleep(0.05)
                continue
            assert r.status_code == 200, (url, r.status_code, r.text)
            return r

    async def rater(i: int) -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:  # one connection per rater, like a browser
            await rate(client, f"load{i:02d}")

    async def rate(client: httpx.AsyncClient, label: str) -> None:
        s = (await call(client, "POST", "/api/session", json={"rater": label})).json()
        rid, client.headers["X-Rater-Key"] = s["rater"], s["key"]  # the rater's key goes with every request
        while True:
            p = (await call(client, "GET", "/api/next", params={"rater": rid})).json()
            if p["done"]:
                return
            for q in p["questions"]:
                key = (rid, p["pair"], q["id"])
                if q["id"] in p["answered"]:
                    assert p["answered"][q["id"]] == intended[key]
                    continue
                answer = ANSWERS[zlib.crc32(repr(key).encode()) % 3]
                intended[key] = answer
                r = await call(client, "POST", "/api/vote", json={"rater": rid, "pair": p["pair"], "question": q["id"],
                                                                  "answer": answer, "response_ms": 100})
                stats["ok"] += 1
                stats["acknowledged_again"] += not r.json()["recorded"]

    async def restart_half_way() -> None:
        while stats["ok"] < RATERS * PAIRS_EACH:  # half of the 2000 votes
            await asyncio.sleep(0.01)
        stats["at_kill"] = stats["ok"]
        server.kill()  # SIGKILL: requests in flight are cut off
        await asyncio.get_running_loop().run_in_executor(None, server.start)

    async def main() -> None:
        restart = asyncio.create_task(restart_half_way())
        await asyncio.gather(*(rater(i) for i in range(RATERS)))
        await restart

    try:
        asyncio.run(main())
    finally:
        server.stop()
    elapsed = time.monotonic() - t0

    assert elapsed < 120
    assert stats["at_kill"] is not None and stats["at_kill"] < 2 * RATERS * PAIRS_EACH  # killed mid-run
    assert stats["retries"] > 0  # raters met the dead server and carried on
    assert len(intended) == 2 * RATERS * PAIRS_EACH
    with sqlite3.connect(load_study_dir / "votes.sqlite") as conn:
        stored = conn.execute("SELECT rater_id, pair_id, question, answer FROM votes").fetchall()
        doubled = conn.execute("SELECT count(*) FROM (SELECT 1 FROM votes GROUP BY rater_id, pair_id, question "
                               "HAVING count(*) > 1)").fetchone()[0]
        shown = conn.execute("SELECT rater_id, count(*) FROM impressions GROUP BY rater_id").fetchall()
    assert len(stored) == len(intended) and doubled == 0
    assert {(r, p, q): a for r, p, q, a in stored} == intended  # every vote, exactly as sent
    assert sorted(n for _, n in shown) == [PAIRS_EACH] * RATERS  # the cap held across the restart
