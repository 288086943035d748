"""The rating server as raters meet it: a real `dwb human-eval serve` process on 127.0.0.1 and its SQLite file."""
import re
import socket
import sqlite3
from collections import Counter

import httpx
import pytest

from human_eval.images import PIXEL_CHUNKS, png_chunk_types
from human_eval.study import load_study

from .conftest import Server, cookie_attributes, model_secrets, start_rater


@pytest.fixture(scope="module")
def server(two_model_study):
    with Server(two_model_study, "--per-rater", "6") as s:
        yield s


def db_rows(study, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(f"file:{study / 'votes.sqlite'}?mode=ro", uri=True) as conn:
        return conn.execute(sql, args).fetchall()


def raw(port: int, request: bytes) -> tuple[int, bytes]:
    """One request byte for byte (no client-side path normalisation); (status, whole response)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_rater_resumes_where_they_left_off_and_stops_at_the_cap(server, two_model_study):
    study = load_study(two_model_study)
    with httpx.Client(base_url=server.url) as c:
        ann = start_rater(c, "ann")
        first = c.get("/api/next", params={"rater": ann}).json()
        assert first["done"] is False and first["progress"] == {"completed": 0, "total": 6}
        assert [q["id"] for q in first["questions"]] == ["quality", "alignment"]
        assert c.post("/api/vote", json={"rater": ann, "pair": first["pair"], "question": "quality", "answer": "A",
                                         "response_ms": 900}).json() == {"recorded": True}
        again = c.get("/api/next", params={"rater": ann}).json()  # a reload shows the same pair, same sides
        assert (again["pair"], again["images"], again["answered"]) == (first["pair"], first["images"], {"quality": "A"})
        key = c.headers["X-Rater-Key"]
        assert c.post("/api/session", json={"rater": ann, "key": key}).json() == {"rater": ann, "label": "ann",
                                                                                  "key": key, "resumed": True}
        c.post("/api/vote", json={"rater": ann, "pair": first["pair"], "question": "alignment", "answer": "none"})
        seen = [first["pair"]]
        for n in range(1, 7):
            p = c.get("/api/next", params={"rater": ann}).json()
            assert p["progress"]["completed"] == n
            if p["done"]:
                break
            assert p["pair"] not in seen
            seen.append(p["pair"])
            for q in ("quality", "alignment"):
                assert c.post("/api/vote", json={"rater": ann, "pair": p["pair"], "question": q, "answer": "B"}).status_code == 200
        assert p == {"done": True, "progress": {"completed": 6, "total": 6}}
        assert seen == study.order_for(ann)[:6]  # the rater's own random order
        random_id = start_rater(c)
        assert re.fullmatch(r"r-[0-9a-f]{12}", random_id) and random_id != start_rater(c)
    rows = db_rows(two_model_study, "SELECT question, answer, client_ms FROM votes WHERE rater_id=? ORDER BY id", ann)
    assert len(rows) == 12 and rows[0] == ("quality", "A", 900) and rows[1][:2] == ("alignment", "none")


def test_sides_are_random_per_impression_and_logged(server, two_model_study):
    study = load_study(two_model_study)
    firsts, sides = Counter(), Counter()
    with httpx.Client(base_url=server.url) as c:
        for i in range(24):
            rater = start_rater(c, f"side{i}")
            p = c.get("/api/next", params={"rater": rater}).json()
            pair = study.by_id[p["pair"]]
            left, right = (u.removeprefix("/img/") for u in p["images"])
            assert {left, right} == {pair.a, pair.b}
            swapped = left == pair.b
            (logged,) = db_rows(two_model_study, "SELECT swapped FROM impressions WHERE rater_id=? AND pair_id=?",
                                rater, pair.id)
            assert bool(logged[0]) == swapped
            # "A" is the left image: the stored choice names the pair's image that was on the left
            c.post("/api/vote", json={"rater": rater, "pair": pair.id, "question": "quality", "answer": "A"})
            (choice,) = db_rows(two_model_study, "SELECT choice FROM votes WHERE rater_id=? AND question='quality'", rater)
            assert choice[0] == ("b" if swapped else "a")
            firsts[pair.id] += 1
            sides[swapped] += 1
    assert sides[True] >= 4 and sides[False] >= 4  # P(fewer than 4 of 24 on one side) is about 1e-4
    assert len(firsts) >= 8  # raters start at different pairs


def test_bad_input_and_abuse_get_4xx_and_store_nothing(server, two_model_study):
    study = load_study(two_model_study)
    with httpx.Client(base_url=server.url) as c:
        mallory = start_rater(c, "mallory")
        p = c.get("/api/next", params={"rater": mallory}).json()
        other = next(q.id for q in study.pairs if q.id != p["pair"])
        vote = {"rater": mallory, "pair": p["pair"], "question": "quality", "answer": "A"}
        before = db_rows(two_model_study, "SELECT count(*) FROM votes")[0][0]

        def status(method, url, **kw) -> int:
            r = c.request(method, url, **kw)
            assert "Traceback" not in r.text
            return r.status_code

        assert status("GET", "/api/next", params={"rater": "nobody"}) == 401  # mallory's key is not nobody's
        assert status("GET", "/api/next") == 422
        assert status("POST", "/api/vote", json={**vote, "rater": "nobody"}) == 401
        assert status("POST", "/api/vote", json={**vote, "pair": "no-such-pair"}) == 404
        assert status("POST", "/api/vote", json={**vote, "pair": other}) == 409  # never shown to this rater
        assert status("POST", "/api/vote", json={**vote, "answer": "C"}) == 422
        assert status("POST", "/api/vote", json={**vote, "answer": "a"}) == 422
        assert status("POST", "/api/vote", json={**vote, "question": "style"}) == 422
        assert status("POST", "/api/vote", json={**vote, "response_ms": -5}) == 422
        assert status("POST", "/api/vote", json={**vote, "model": "x"}) == 422  # unknown fields refused
        assert status("POST", "/api/vote", content=b"{not json", headers={"content-type": "application/json"}) == 422
        assert status("POST", "/api/vote", json={**vote, "pad": "x" * 5000}) == 413
        assert status("POST", "/api/session", json={"rater": "<script>alert(1)</script>"}) == 422
        assert status("POST", "/api/session", json={"rater": "x" * 65}) == 422
        assert db_rows(two_model_study, "SELECT count(*) FROM votes")[0][0] == before

        assert c.post("/api/vote", json=vote).json() == {"recorded": True}
        assert c.post("/api/vote", json=vote).json() == {"recorded": False}  # a re-send is idempotent
        r = c.post("/api/vote", json={**vote, "answer": "B"})  # a replay with another answer
        assert r.status_code == 409 and "cannot be changed" in r.json()["detail"]
        rows = db_rows(two_model_study, "SELECT answer FROM votes WHERE rater_id=?", mallory)
        assert rows == [("A",)]

        token = next(iter(study.images))
        for path in ("/img/../study.json", "/img/..%2Fstudy.json", "/img/%2e%2e%2fstudy.json", "/static/../study.json",
                     "/static/..%2F..%2Fstudy.json", "/img/..%2F..%2F..%2F..%2Fetc%2Fpasswd", "/../../etc/passwd",
                     f"/img/{token}/../../study.json", "/img/" + "A" * 65, "/static/rate.js%00.png",
                     "/img/votes.sqlite", "/static/study.json", "/images/" + study.images[token].file.split("/")[-1]):
            code, body = raw(server.port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            assert 400 <= code < 500, path
            assert study.secret.encode() not in body and b"root:" not in body and b"SQLite" not in body

        code, _ = raw(server.port, b"POST /api/vote HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                                   b"Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        assert code == 411
        code, _ = raw(server.port, b"POST /api/vote HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n"
                                   b"Connection: close\r\n\r\n{}")
        assert code == 413

        for path in ("/admin", "/admin/results.json", "/admin/results.csv", "/admin/votes.csv", "/admin/votes.json",
                     "/admin/chart.png"):
            assert c.get(path).status_code == 401
            assert c.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert c.get(path, cookies={"dwb_admin": "admin-secret-tokeN"}).status_code == 401
        assert c.get("/admin", params={"token": "wrong"}).status_code == 401
        assert c.get("/openapi.json").status_code == 404 and c.get("/docs").status_code == 404

        assert c.get("/healthz").json() == {"ok": True}  # still serving
        assert db_rows(two_model_study, "SELECT count(*) FROM votes")[0][0] == before + 1
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        with sqlite3.connect(two_model_study / "votes.sqlite") as conn:
            conn.execute("UPDATE votes SET answer='B'")


def test_admin_token_opens_the_dashboard(server, two_model_study):
    with httpx.Client(base_url=server.url) as c:
        r = c.get("/admin", params={"token": server.token}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/admin"
        cookie = cookie_attributes(r.headers["set-cookie"])
        assert "httponly" in cookie and cookie["samesite"].lower() == "strict" and server.token not in cookie["value"]
        assert "secure" not in cookie  # served over plain http: a browser would not send a Secure cookie back
        page = c.get("/admin")  # the cookie from the redirect
        assert page.status_code == 200 and "Preference" in page.text
        results = c.get("/admin/results.json", headers={"Authorization": f"Bearer {server.token}"}).json()
        assert results["counts"]["votes"] == db_rows(two_model_study, "SELECT count(*) FROM votes")[0][0]
        chart = c.get("/admin/chart.png")
        assert chart.content.startswith(b"\x89PNG")
        votes = c.get("/admin/votes.json").json()
        assert len(votes) == results["counts"]["votes"] and {v["model_a"] for v in votes} <= set(load_study(two_model_study).models)
        assert c.get("/admin/votes.csv").text.count("\n") == len(votes) + 1


def test_no_model_identifier_in_any_rater_facing_byte(two_model_study, tmp_path):
    """Crawl everything a rater can reach, for every pair, and look for anything that names a model."""
    study = load_study(two_model_study)
    # one image file on disk picks up a text chunk after the study was built: serving must still strip it
    from PIL import Image, PngImagePlugin

    victim = study.folder / study.images[study.pairs[0].a].file
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", f"model: {model_secrets('alpha')['model']}")
    with Image.open(victim) as im:
        im.save(victim, pnginfo=info)

    needles = {s for name in ("alpha", "beta") for s in model_secrets(name).values()}
    needles |= {m for m in study.models} | {"ep3-ba800k-rank0", "secretckpt", "SecretScheduler", "modelname", "gold",
                                            "decoy", "repeat", "checkpoint", "scheduler", "sampler", "guidance", "manifest", "seed"}
    needles |= {info_["source"] for info_ in study.model_info.values()} | {img.source for img in study.images.values()}
    needles |= {img.file for img in study.images.values()} | {study.secret, str(study.folder)}
    allowed_keys = {"done", "pair", "prompt", "images", "questions", "id", "text", "answers", "answered", "progress", "completed",
                    "total", "rater", "label", "key", "resumed", "recorded", "detail", "ok"}
    bodies: list[tuple[str, bytes]] = []

    def keep(r: httpx.Response) -> httpx.Response:
        headers = "\n".join(f"{k}: {v}" for k, v in r.headers.items()).encode()
        bodies.append((str(r.url), headers + b"\n\n" + r.content))
        if r.headers.get("content-type", "").startswith("application/json"):
            stack = [r.json()]
            while stack:
                x = stack.pop()
                if isinstance(x, dict):
                    assert set(x) <= allowed_keys | {q.id for q in study.questions}, (r.url, set(x))
                    stack += list(x.values())
                elif isinstance(x, list):
                    stack += x
        return r

    with Server(two_model_study) as server, httpx.Client(base_url=server.url) as c:
        for path in ("/", "/static/rate.js", "/static/rate.css", "/healthz", "/static/missing.js", "/img/unknowntoken1"):
            keep(c.get(path))
        s = keep(c.post("/api/session", json={"rater": "crawler"})).json()
        crawler, c.headers["X-Rater-Key"] = s["rater"], s["key"]
        keep(c.post("/api/session", json={"rater": crawler, "key": s["key"]}))  # a returning rater's answer too
        keep(c.get("/api/next", params={"rater": "nobody"}))
        images = set()
        while True:
            p = keep(c.get("/api/next", params={"rater": crawler})).json()
            if p["done"]:
                break
            for url in p["images"]:
                if url not in images:
                    images.add(url)
                    r = keep(c.get(url))
                    assert r.headers["content-type"] == "image/png"
                    assert set(png_chunk_types(r.content)) <= PIXEL_CHUNKS
            for q in p["questions"]:
                keep(c.post("/api/vote", json={"rater": crawler, "pair": p["pair"], "question": q["id"], "answer": "A"}))
            keep(c.post("/api/vote", json={"rater": crawler, "pair": p["pair"], "question": "quality", "answer": "B"}))
        assert len(images) == len(study.images)  # every image was served and checked
    assert len(bodies) > 3 * len(study.pairs)
    for url, body in bodies:
        lower = body.lower()
        for needle in needles:
            assert needle.lower().encode() not in lower, (url, needle)
