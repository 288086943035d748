"""Several `dwb human-eval serve` instances on one PostgreSQL database (a private cluster on 127.0.0.1)."""
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest

from .conftest import Server, cast_tie_votes, check_tie_round_trip, free_port, start_rater


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


@pytest.fixture(scope="module")
def postgres_url():
    """initdb + pg_ctl in a temporary folder (as the postgres user when run as root); torn down after."""
    pg = _pg_bin()
    if pg is None:
        pytest.skip("PostgreSQL server binaries not installed (Debian package postgresql)")
    pytest.importorskip("psycopg")
    root = Path(tempfile.mkdtemp(prefix="dwb-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    port = free_port()
    data = root / "data"
    subprocess.run([*as_user, str(pg / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"],
                   check=True, capture_output=True)
    subprocess.run([*as_user, str(pg / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w", "-o",
                    f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
                   check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(pg / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_two_instances_on_postgres_share_votes_and_report(two_model_study, postgres_url, tmp_path):
    with Server(two_model_study, "--db", postgres_url) as one, Server(two_model_study, "--db", postgres_url) as two:
        with httpx.Client(base_url=one.url) as c1, httpx.Client(base_url=two.url) as c2:
            for label in ("r1", "r2", "r3"):
                rater = start_rater(c1, label)
                c2.headers["X-Rater-Key"] = c1.headers["X-Rater-Key"]
                for step in range(4):  # alternate instances mid-study
                    client = c1 if step % 2 else c2
                    p = client.get("/api/next", params={"rater": rater}).json()
                    for q in ("quality", "alignment"):
                        r = client.post("/api/vote", json={"rater": rater, "pair": p["pair"], "question": q,
                                                           "answer": "A" if step % 2 else "none"})
                        assert r.status_code == 200, r.text
                    # a retried vote on the other instance is idempotent; a changed one is refused
                    other = c2 if client is c1 else c1
                    again = other.post("/api/vote", json={"rater": rater, "pair": p["pair"], "question": "quality",
                                                          "answer": "A" if step % 2 else "none"})
                    assert again.status_code == 200
                    changed = other.post("/api/vote", json={"rater": rater, "pair": p["pair"], "question": "quality",
                                                            "answer": "B"})
                    assert changed.status_code == 409
            votes = c1.get("/admin/votes.json", headers={"Authorization": f"Bearer {one.token}"})
            assert votes.status_code == 200
            rows = votes.json()
            rows = rows["votes"] if isinstance(rows, dict) else rows
            assert len(rows) == 3 * 4 * 2  # every vote once, whichever instance took it

    # Votes cannot be edited behind the server's back either (trigger on the table).
    import sqlalchemy as sa

    engine = sa.create_engine(postgres_url)
    with pytest.raises(sa.exc.DBAPIError, match="append-only"):
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE votes SET answer = 'B'"))
    engine.dispose()

    from ..conftest import run_dwb

    out = tmp_path / "report"
    r = run_dwb("human-eval", "report", str(two_model_study), "--db", postgres_url, "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "results.json").is_file() and (out / "preference.png").is_file()


def another_database(url: str, name: str) -> str:
    """A new database in the same cluster (a database holds one study's votes), as a SQLAlchemy URL."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return url.rsplit("/", 1)[0] + f"/{name}"


@pytest.mark.slow  # with the test above: they share the cluster, whose start is most of the time
def test_both_good_and_both_bad_round_trip_through_postgres(good_bad_study, postgres_url, tmp_path):
    from human_eval.store import Store
    from human_eval.study import load_study

    study = load_study(good_bad_study)
    url = another_database(postgres_url, "ties")
    store = Store(url, study.id)
    cast = cast_tie_votes(store, study)
    store.close()
    reopened = Store(url, study.id, create=False)
    results = check_tie_round_trip(study, reopened, cast, tmp_path / "report")
    assert results["ties"] == "good_bad" and results["both_bad"]["quality"]["prompts"]
    reopened.close()
