"""One preference, one interval: the admin page, `dwb human-eval report` and its joined.html give the same share,
95% interval, p and "settled after N" for the same votes, to the printed digit.

They disagreed: the admin page resampled 1,000 times, the report 2,000, and joined.html took a design effect from
prompts alone, each under the label "Wilson on effective votes" ([50.8, 86.3]%, [51.1, 86.1]% and [55.8, 83.7]%
for one vote set)."""
import random
import re
from html import unescape
from pathlib import Path

import httpx
import pytest

from human_eval.store import Store, database_url
from human_eval.study import load_study

from .conftest import Server

PREFERS = (0.9, 0.85, 0.8, 0.55, 0.5, 0.45)  # each rater's chance of choosing the study's first model
SHARE = r"([0-9.]+ \[[0-9.]+, [0-9.]+\])%"  # "64.0 [50.8, 86.3]%"
P = r"(p (?:=|<|<=) [0-9.e-]+)"


@pytest.fixture(scope="module")
def voted(two_model_study) -> Path:
    """Six raters on every main pair, both questions, some of them much keener on the first model than others
    (votes cluster by rater, so the design effect is above 1)."""
    study = load_study(two_model_study)
    store = Store(database_url(two_model_study / "votes.sqlite"), study.id)
    rng = random.Random(3)
    first = study.models[0]
    for r, keen in enumerate(PREFERS):
        rater = f"rater{r}"
        store.add_rater(rater)
        for pair in (p for p in study.pairs if p.kind == "main"):
            swapped = rng.random() < 0.5
            store.show(rater, pair.id, swapped)
            for q in study.question_ids:
                wants_first = rng.random() < keen
                choice = "none" if rng.random() < 0.1 else ("a" if (study.models_of(pair)[0] == first) == wants_first
                                                             else "b")
                answer = "none" if choice == "none" else ("A" if (choice == "a") != swapped else "B")
                store.vote(rater, pair.id, q, answer, 900)
    store.close()
    return two_model_study


def _line(text: str, question: str) -> tuple[str, str, str]:
    """The winner, its share with interval, and p of a question's preference line."""
    found = re.search(rf"{question}\s+(\S+) vs \S+: \S+'s share of \d+ decisive votes {SHARE} \(95%[^)]*\), {P}", text)
    assert found, text
    return found.groups()


def _settled(text: str) -> str:
    return re.search(r"(every comparison was settled after \d+|not every comparison is settled after \d+)",
                     text).group(1)


def test_the_admin_page_the_report_and_the_joined_page_agree_to_the_digit(voted, dwb, tmp_path):
    study = load_study(voted)
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "results.jsonl").write_text("")  # no scores: joined.html still gives each model's win rate
    report = dwb("human-eval", "report", str(voted), "--results", str(tmp_path / "eval"), "--out", str(tmp_path / "r"))
    assert report.returncode == 0, report.stderr
    with Server(voted) as server:
        admin = unescape(httpx.get(server.url + "/admin", headers={"Authorization": f"Bearer {server.token}"},
                                   timeout=60).text)
    joined = unescape((tmp_path / "r" / "joined.html").read_text())

    assert _settled(admin) == _settled(report.stdout)
    for q in study.question_ids:
        winner, share, p = _line(report.stdout, q)
        assert winner == study.models[0]  # the keen raters' model, model a of the comparison
        assert _line(admin, q) == (winner, share, p)  # the summary on the admin page
        interval = share.split(" ", 1)[1]
        row = re.search(rf"<tr><td>{q}</td><td>{winner}</td>.*?</tr>", admin).group(0)  # the admin table's row
        assert f"<td>{interval}%</td>" in row and f"<td>{p}</td>" in row
        section = joined.split(f"<h2>{q}:")[1].split("<h2>")[0]
        model_row = re.search(rf"<tr><td>{re.escape(winner)}</td>.*?</tr>", section).group(0)
        assert f"<td>{share}%</td>" in model_row and f"<td>{p}</td>" in model_row
        flips = re.search(rf"{q}\s+{re.escape(winner)} vs .*?: {re.escape(winner)} is preferred, (flips without \d+ of "
                          rf"its votes);", report.stdout)
        assert flips, report.stdout  # the votes that would flip it, beside the interval, the same on every surface
        assert f"<td>{flips.group(1)}</td>" in row and f"<td>{flips.group(1)}</td>" in model_row
        assert flips.group(1) in admin.split("<pre>")[1]  # the admin page's summary prints the report's line
