"""A rater in a real headless Chromium: mouse and keyboard, resume after a reload, escaped prompts, stored votes."""
import sqlite3
from pathlib import Path

import pytest

from human_eval.samples import read_manifest
from human_eval.study import build_study, load_study

from .conftest import Server, serving, write_samples
from ..conftest import CHROMIUM, CHROMIUM_ARGS as ARGS, needs_chromium

pytestmark = needs_chromium
HOSTILE = '<b>bold</b> {n} cats <script>window.pwned=1</script><img src=x onerror="window.pwned=2"> & "quotes"'


@pytest.fixture(scope="module")
def markup_study(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    prompts = [(HOSTILE.format(n=n), "Colors") for n in range(4)]
    samples = read_manifest(write_samples(root / "alpha", "alpha", prompts, 1, size=64, seed=1))
    samples += read_manifest(write_samples(root / "beta", "beta", prompts, 1, size=64, seed=2))
    build_study(samples, root / "study", progress=False)
    return root / "study"


def rate_with_ties(browser, url: str, problems: list[str]) -> None:
    """A study whose ties are good_bad: both good and both bad by mouse and keyboard, no "no preference"."""
    page = browser.new_context().new_page()
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.goto(f"{url}/?rater=tina")
    page.wait_for_selector("#rate:not([hidden])")
    buttons = page.eval_on_selector_all(".question[data-question=quality] button",
                                        "bs => bs.map(b => [b.dataset.answer, b.textContent])")
    assert buttons == [["A", "Image A"], ["good", "Both good"], ["bad", "Both bad"], ["B", "Image B"]]
    assert "both good" in page.inner_text("#keys") and "no preference" not in page.inner_text("#keys")
    before = page.inner_text("#progress-text")
    page.click(".question[data-question=quality] button[data-answer=good]")  # the mouse
    page.wait_for_selector(".question.active[data-question=alignment]")
    page.keyboard.press("n")  # no preference is not offered here: nothing is sent
    page.keyboard.press("ArrowDown")  # this study's down arrow: both bad
    page.wait_for_function("p => document.querySelector('#progress-text').textContent !== p", arg=before)
    page.wait_for_selector(".question.active[data-question=quality]")
    page.keyboard.press("ArrowUp")  # both good
    page.wait_for_selector(".question.active[data-question=alignment]")
    page.click(".question[data-question=alignment] button[data-answer=bad]")
    page.wait_for_function("p => document.querySelector('#progress-text').textContent === 'Pair 3 of 4'")
    assert page.is_hidden("#error")


class Rater:
    """One rater's page of a study: what pair it shows, and answers by mouse or key, each recorded as (pair shown,
    question, answer, model on the chosen side)."""

    def __init__(self, page, study):
        self.page, self.study = page, study
        self.done: list[tuple[str, str, str, str]] = []

    def current(self) -> dict:
        page = self.page
        page.wait_for_selector("#rate:not([hidden])")
        left, right = (page.get_attribute(sel, "src").removeprefix("/img/") for sel in ("#img-left", "#img-right"))
        pair = next(q for q in self.study.pairs if {q.a, q.b} == {left, right})
        return {"pair": pair.id, "left": self.study.images[left].model, "right": self.study.images[right].model,
                "progress": page.inner_text("#progress-text")}

    def answered(self, before: str) -> None:
        self.page.wait_for_function("p => document.querySelector('#progress-text').textContent !== p "
                                    "|| !document.querySelector('#done').hidden", arg=before)

    def record(self, state: dict, question: str, answer: str) -> None:
        side = {"A": state["left"], "B": state["right"], "none": ""}[answer]
        self.done.append((state["pair"], question, answer, side))

    def click(self, state: dict, question: str, answer: str) -> None:
        self.page.click(f".question[data-question={question}] button[data-answer={answer}]")
        self.record(state, question, answer)

    def key(self, state: dict, key: str, question: str, answer: str) -> None:
        self.page.wait_for_selector(f".question.active[data-question={question}]")
        self.page.keyboard.press(key)
        self.record(state, question, answer)


def rate_by_mouse_then_by_keyboard(r: Rater, prompts: set[str]) -> None:
    """Pair 1 by the mouse only, its prompt shown exactly as written (markup as text); pair 2 by the keyboard only."""
    page = r.page
    s = r.current()
    assert s["progress"] == "Pair 1 of 4"
    assert page.text_content("#prompt") in prompts
    assert page.evaluate("document.querySelector('#prompt').children.length") == 0
    assert page.evaluate("[...document.images].every(i => i.complete && i.naturalWidth === 64)")
    r.click(s, "quality", "A")
    page.wait_for_selector(".question.active[data-question=alignment]")
    r.click(s, "alignment", "none")
    r.answered(s["progress"])
    s = r.current()
    assert s["progress"] == "Pair 2 of 4"
    r.key(s, "ArrowRight", "quality", "B")
    r.key(s, "n", "alignment", "none")
    r.answered(s["progress"])


def resume_after_a_reload_and_finish(r: Rater) -> None:
    """Pair 3: one answer, then a reload; the rater resumes on the same pair with the same sides. Pair 4: mouse and
    keyboard mixed, then the end, no script of the prompts run."""
    page = r.page
    s = r.current()
    r.key(s, "a", "quality", "A")
    page.wait_for_selector(".question.active[data-question=alignment]")
    page.reload()
    assert page.input_value("#rater-input") == "alice"  # remembered
    page.click("#start-button")
    assert r.current() == s
    assert page.is_disabled(".question[data-question=quality] button[data-answer=B]")
    assert "chosen" in page.get_attribute(".question[data-question=quality] button[data-answer=A]", "class")
    r.key(s, "ArrowLeft", "alignment", "A")
    r.answered(s["progress"])
    s = r.current()
    assert s["progress"] == "Pair 4 of 4"
    r.click(s, "quality", "B")
    r.key(s, "b", "alignment", "B")
    page.wait_for_selector("#done:not([hidden])")
    assert page.evaluate("window.pwned") is None


def check_the_name_and_the_link(browser, url: str, folder: Path, study) -> None:
    """Another browser typing "alice" is a new rater, not alice; alice's link is alice in any browser."""
    other = browser.new_context().new_page()
    other.goto(url)
    other.fill("#rater-input", "alice")
    other.click("#start-button")
    other.wait_for_selector("#rate:not([hidden])")
    assert other.inner_text("#progress-text") == "Pair 1 of 4"
    with sqlite3.connect(folder / "votes.sqlite") as conn:
        (alice,) = conn.execute("SELECT id FROM raters WHERE label='alice' ORDER BY created_at LIMIT 1").fetchone()
    link = browser.new_context().new_page()
    link.goto(f"{url}/?rater={alice}&key={study.rater_key(alice)}")
    link.wait_for_selector("#done:not([hidden])")  # alice has rated every pair
    assert "key=" not in link.url  # the key leaves the address bar once used


def check_stored_votes(folder: Path, study, done: list[tuple[str, str, str, str]]) -> None:
    """alice's 8 votes as stored: each answer, its time, and the model whose image was on the chosen side."""
    assert len({pair for pair, *_ in done}) == 4
    with sqlite3.connect(folder / "votes.sqlite") as conn:
        rows = conn.execute("SELECT pair_id, question, answer, choice, client_ms FROM votes "
                            "WHERE rater_id IN (SELECT id FROM raters WHERE label='alice')").fetchall()
    assert len(rows) == 8  # the second "alice" voted nothing
    stored = {(pair, q): (answer, choice, ms) for pair, q, answer, choice, ms in rows}
    for pair_id, question, answer, model in done:
        got_answer, choice, ms = stored[(pair_id, question)]
        pair = study.by_id[pair_id]
        assert got_answer == answer and ms is not None and ms >= 0
        chosen = {"a": study.images[pair.a].model, "b": study.images[pair.b].model, "none": ""}[choice]
        assert chosen == model  # the model whose image was on the clicked side


def test_rater_rates_with_mouse_and_keyboard(markup_study, good_bad_study):
    from playwright import sync_api
    study = load_study(markup_study)
    problems: list[str] = []

    with Server(markup_study) as server, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        page = browser.new_page()
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
        page.goto(server.url)
        page.fill("#rater-input", "alice")
        page.click("#start-button")  # the mouse
        rater = Rater(page, study)
        rate_by_mouse_then_by_keyboard(rater, {q.text for q in study.prompts})
        resume_after_a_reload_and_finish(rater)
        check_the_name_and_the_link(browser, server.url, markup_study, study)
        with serving(good_bad_study) as url:
            rate_with_ties(browser, url, problems)
        browser.close()

    assert not problems, problems
    with sqlite3.connect(good_bad_study / "votes.sqlite") as conn:
        ties = conn.execute("SELECT question, answer, choice FROM votes ORDER BY id").fetchall()
    assert ties == [("quality", "good", "good"), ("alignment", "bad", "bad"), ("quality", "good", "good"),
                    ("alignment", "bad", "bad")]
    check_stored_votes(markup_study, study, rater.done)
