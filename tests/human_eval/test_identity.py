"""Who may vote as whom: server-issued rater keys, no id probing, rate-limited new raters, admin tokens.

Each test tries an attack on a real `dwb human-eval serve` process the way an outsider would.
"""
import shutil
import stat
from pathlib import Path

import httpx
import pytest

from human_eval.study import load_study

from ..conftest import run_dwb
from ..servers import ServerExited
from .conftest import Server, cookie_attributes

KEY = "X-Rater-Key"


@pytest.fixture(scope="module")
def server(two_model_study):
    with Server(two_model_study, "--per-rater", "6", "--secure-cookie") as s:
        yield s


def session(client: httpx.Client, rater: str | None = None, key: str | None = None) -> dict:
    r = client.post("/api/session", json={"rater": rater, "key": key} if key else {"rater": rater})
    assert r.status_code == 200, r.text
    return r.json()


def vote(client: httpx.Client, s: dict, pair: str, question: str, answer: str, key: str | None = None) -> httpx.Response:
    return client.post("/api/vote", json={"rater": s["rater"], "pair": pair, "question": question, "answer": answer},
                       headers={KEY: key if key is not None else s["key"]})


def votes_of(study: Path, rater: str) -> list[tuple]:
    import sqlite3

    with sqlite3.connect(f"file:{study / 'votes.sqlite'}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT pair_id, question, answer FROM votes WHERE rater_id=? ORDER BY id", (rater,)).fetchall()


def test_typing_another_raters_id_gives_a_new_rater_not_theirs(server, two_model_study):
    with httpx.Client(base_url=server.url) as bob_browser, httpx.Client(base_url=server.url) as mallory:
        bob = session(bob_browser, "bob")
        assert bob["label"] == "bob" and bob["resumed"] is False
        p = bob_browser.get("/api/next", params={"rater": bob["rater"]}, headers={KEY: bob["key"]}).json()
        assert vote(bob_browser, bob, p["pair"], "quality", "A").json() == {"recorded": True}

        fake = session(mallory, "bob")  # the same typed id from another browser
        assert fake["rater"] != bob["rater"] and fake["resumed"] is False and fake["key"] != bob["key"]
        assert fake["label"] == "bob"
        fake_by_id = session(mallory, bob["rater"])  # typing bob's server id does not help either
        assert fake_by_id["rater"] not in (bob["rater"], fake["rater"]) and fake_by_id["resumed"] is False

        # without bob's key, nothing of bob's is readable or writable
        for key in (None, "", fake["key"], bob["key"][:-1] + ("A" if bob["key"][-1] != "A" else "B")):
            headers = {} if key is None else {KEY: key}
            r = mallory.get("/api/next", params={"rater": bob["rater"]}, headers=headers)
            assert r.status_code == 401 and p["pair"] not in r.text
            r = mallory.post("/api/vote", json={"rater": bob["rater"], "pair": p["pair"], "question": "alignment",
                                                "answer": "B"}, headers=headers)
            assert r.status_code == 401
        r = mallory.post("/api/session", json={"rater": bob["rater"], "key": fake["key"]})
        assert r.status_code == 403  # a key that is not bob's does not open bob's session

        # bob, with his key, continues where he left off
        again = session(bob_browser, bob["rater"], bob["key"])
        assert again == {**bob, "resumed": True}
        resumed = bob_browser.get("/api/next", params={"rater": bob["rater"]}, headers={KEY: bob["key"]}).json()
        assert (resumed["pair"], resumed["images"], resumed["answered"]) == (p["pair"], p["images"], {"quality": "A"})
    assert votes_of(two_model_study, bob["rater"]) == [(p["pair"], "quality", "A")]


def test_session_does_not_tell_whether_an_id_exists(server):
    with httpx.Client(base_url=server.url) as c:
        carol = session(c, "carol")
    with httpx.Client(base_url=server.url) as prober:
        answers = [session(prober, name) for name in ("carol", "nobody-here-1", carol["rater"], "r-000000000000")]
        for a in answers:
            assert set(a) == {"rater", "label", "key", "resumed"} and a["resumed"] is False
        assert len({a["rater"] for a in answers} | {carol["rater"]}) == 5  # always a new rater
        # the rater routes answer an unknown and a known id alike without the key
        known = prober.get("/api/next", params={"rater": carol["rater"]})
        unknown = prober.get("/api/next", params={"rater": "r-123456789abc"})
        assert known.status_code == unknown.status_code == 401 and known.json() == unknown.json()


def test_rater_ids_with_a_newline_or_other_control_characters_are_refused(server):
    with httpx.Client(base_url=server.url) as c:
        s = session(c, "nina")
        for bad in (s["rater"] + "\n", s["rater"] + "\r\n", "nina\n"):
            r = c.get("/api/next", params={"rater": bad}, headers={KEY: s["key"]})
            assert r.status_code == 422, (bad, r.status_code)
        r = c.post("/api/session", json={"rater": "eve\n", "key": "x" * 22})
        assert r.status_code == 422
        assert session(c, " nina ")["label"] == "nina"  # spaces typed around an id are trimmed
    from human_eval.raters import valid_rater_id

    assert valid_rater_id("bob") and not valid_rater_id("bob\n") and not valid_rater_id("bob\r")


def test_new_raters_are_rate_limited_per_address(two_model_study):
    with Server(two_model_study, "--new-raters-per-minute", "5") as s, httpx.Client(base_url=s.url) as c:
        made = [session(c, f"burst{i}") for i in range(5)]
        r = c.post("/api/session", json={"rater": "burst5"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert session(c, made[0]["rater"], made[0]["key"])["resumed"] is True  # returning raters are not limited
        before = len(made)
        # a varied X-Forwarded-For is no new address: without --trusted-proxy nobody's header is read
        forged = [c.post("/api/session", json={"rater": f"forged{i}"}, headers={"X-Forwarded-For": f"203.0.113.{i}"})
                  for i in range(8)]
        assert [r.status_code for r in forged] == [429] * 8
    import sqlite3

    with sqlite3.connect(two_model_study / "votes.sqlite") as conn:
        labels = [row[0] for row in conn.execute("SELECT label FROM raters WHERE label LIKE 'burst%'")]
        assert not conn.execute("SELECT count(*) FROM raters WHERE label LIKE 'forged%'").fetchone()[0]
    assert len(labels) == before


def test_the_admin_cookie_is_secure_when_asked_and_is_not_the_token(server):
    r = httpx.get(server.url + "/admin", params={"token": server.token}, follow_redirects=False)
    assert r.status_code == 303
    cookie = cookie_attributes(r.headers["set-cookie"])
    assert "secure" in cookie and "httponly" in cookie and cookie["samesite"].lower() == "strict"
    assert server.token not in cookie["value"]
    url = server.url + "/admin/votes.json"
    assert httpx.get(url, cookies={"dwb_admin": cookie["value"]}).status_code == 200
    assert httpx.get(url, headers={"Authorization": f"Bearer {cookie['value']}"}).status_code == 401  # not a token
    assert httpx.get(url, cookies={"dwb_admin": server.token}).status_code == 401  # the token is not a cookie


def test_the_start_up_line_does_not_show_the_token(server):
    said = server.output()
    assert "--admin-token" in said and server.token not in said


def test_rater_links_open_the_raters_session(server, two_model_study):
    study = load_study(two_model_study)
    r = run_dwb("human-eval", "links", str(two_model_study), "worker-17", "worker-18",
                "--base-url", "https://rate.example.org")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0] == "rater,url" and len(lines) == 3
    rater, url = lines[1].split(",")
    assert rater == "worker-17" and url.startswith("https://rate.example.org/?rater=worker-17&key=")
    key = url.split("key=")[1]
    assert key == study.rater_key("worker-17") and key != study.rater_key("worker-18")
    with httpx.Client(base_url=server.url) as c:
        first = session(c, "worker-17", key)
        assert first == {"rater": "worker-17", "label": "worker-17", "key": key, "resumed": False}
        p = c.get("/api/next", params={"rater": "worker-17"}, headers={KEY: key}).json()
        assert vote(c, first, p["pair"], "quality", "B").json() == {"recorded": True}
        assert session(c, "worker-17", key)["resumed"] is True
    bad = run_dwb("human-eval", "links", str(two_model_study), "bad\nid")
    assert bad.returncode == 1 and "rater id" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def outcome(server: Server) -> str:
    """'exited: <output>' when the server refused to start, else what /admin/votes.json gives without a token."""
    try:
        with server:
            return f"served {httpx.get(server.url + '/admin/votes.json', timeout=5).status_code}"
    except ServerExited as e:
        return "exited: " + e.output.strip()


@pytest.mark.parametrize("source, token, needle", [
    ("file", "", "at least 16 characters"),  # an empty token file used to open the admin pages to anyone
    ("option", "short-token-15c", "at least 16 characters"),
    ("environment", "x" * 15, "at least 16 characters"),
    ("option", " " * 16, "blank"),  # sixteen spaces used to be a token
    ("environment", "aaaaaaaabbbbbbbb", "different characters"),
    ("option", "correct horse battery", "spaces"),
])
def test_short_blank_or_weak_admin_tokens_are_refused(two_model_study, tmp_path, source, token, needle):
    study = tmp_path / "study"
    shutil.copytree(two_model_study, study, ignore=shutil.ignore_patterns("votes.sqlite*", "admin_token"))
    args, env = [], {"DWB_HUMAN_EVAL_TOKEN": ""}
    if source == "file":
        (study / "admin_token").write_text(token)
    elif source == "option":
        args = ["--admin-token", token]
    else:
        env = {"DWB_HUMAN_EVAL_TOKEN": token}
    got = outcome(Server(study, *args, token=None, env=env))
    assert got.startswith("exited: error: ") and needle in got, got
    assert len(got.splitlines()) == 1 and "Traceback" not in got


def test_a_new_admin_token_file_is_private_and_long(two_model_study, tmp_path):
    study = tmp_path / "study"
    shutil.copytree(two_model_study, study, ignore=shutil.ignore_patterns("votes.sqlite*", "admin_token"))
    with Server(study, token=None, env={"DWB_HUMAN_EVAL_TOKEN": ""}) as server:
        assert httpx.get(server.url + "/admin/votes.json").status_code == 401
        said = server.output()
    path = study / "admin_token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(path.read_text().strip()) >= 32
    assert path.read_text().strip() not in said and str(path) in said  # the start-up line says where, not what
    assert not [p for p in study.iterdir() if p.name.startswith("admin_token") and p != path]  # no temporary left
    from human_eval import HumanEvalError
    from human_eval.server import create_app

    with pytest.raises(HumanEvalError, match="at least 16"):
        create_app(load_study(two_model_study), None, "")


def test_a_store_from_before_rater_labels_gains_the_column(tmp_path):
    import sqlite3

    from human_eval.store import Store, database_url

    path = tmp_path / "votes.sqlite"
    with sqlite3.connect(path) as conn:  # the raters table as earlier versions created it
        conn.execute("CREATE TABLE raters (id VARCHAR(64) PRIMARY KEY, created_at FLOAT NOT NULL, user_agent VARCHAR(256))")
        conn.execute("INSERT INTO raters VALUES ('ann', 0, '')")
    store = Store(database_url(path), "study-1")
    assert store.labels() == {"ann": "ann"} and store.add_rater("r-000000000001", "bob")
    assert store.labels() == {"ann": "ann", "r-000000000001": "bob"} and store.label_of("r-000000000001") == "bob"
    store.close()
