"""The comparison page in a real headless Chromium: the verdict table, A's and B's images of the same prompt and
seed side by side in order of their per-image difference, raters' votes beside the right pairs, prompts as text.

Two tiny checkpoints scored on 4 prompts at guidance 3 and 5 (CLIP score per image), a study of
their guidance-5 images with a few votes, reported by `dwb human-eval report`, then `dwb evaluate compare
--study`; the page is opened from a copy of the results folder."""
import csv
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import unquote, urlparse

import pytest

from evaluate.layout import comparison_file, comparison_page
from evaluate.run import EvalConfig, evaluate_checkpoints

from ..conftest import CHROMIUM, CHROMIUM_ARGS, needs_chromium

HOSTILE = '<b>bold</b> cats <script>window.pwned=1</script><img src=x onerror="window.pwned=2"> & "quotes"'
PROMPTS = ["a red circle", HOSTILE, "two blue squares left of a green triangle", "one small yellow square"]
VOTERS = {  # study pair (prompt index, image index) -> each rater's choice of the study's image a or b, or none
    (0, 0): ["a", "a", "none"], (1, 0): ["b", "b", "b"], (3, 0): ["none", "a"]}


def _manifest(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _cast_votes(study_dir: Path) -> dict:
    """VOTERS' answers to both questions of their pairs, and one answer on the repeated pair, which must not count;
    returns the expected counts by (prompt index, image index, model) -> question -> A/B/neither by model label."""
    from human_eval.store import Store, database_url
    from human_eval.study import load_study

    study = load_study(study_dir)
    store = Store(database_url(study_dir / "votes.sqlite"), study.id)
    expected = {}
    for pair in study.pairs:
        prompt = study.prompts[pair.prompt].index
        if pair.kind == "repeat":
            store.show("r0", pair.id, swapped=False)
            store.vote("r0", pair.id, "quality", "A", None)
            continue
        choices = VOTERS.get((prompt, pair.image_index), [])
        for rater, choice in enumerate(choices):
            store.show(f"r{rater}", pair.id, swapped=bool(rater % 2))  # which side image a was shown on
            answer = "none" if choice == "none" else ("A" if (choice == "a") != bool(rater % 2) else "B")
            for question in ("quality", "alignment"):
                store.vote(f"r{rater}", pair.id, question, answer, None)
        if choices:
            models = [study.images[pair.a].model, study.images[pair.b].model]
            counts = {m: choices.count(c) for m, c in zip(models, "ab")}
            expected[prompt, pair.image_index] = {**counts, "neither": choices.count("none")}
    return expected


@pytest.fixture(scope="module")
def compared(tiny_run, shapes_data, inception_weights, tiny_clip, tmp_path_factory):
    from dwb import main
    from human_eval.samples import read_manifest
    from human_eval.study import build_study

    root = tmp_path_factory.mktemp("compare-page")
    prompt_file = root / "prompts.csv"
    with prompt_file.open("w", newline="") as f:
        csv.writer(f).writerows([("prompt", "category"), *((p, "shapes") for p in PROMPTS)])
    out = root / "eval"
    cfg = EvalConfig(out=str(out), reference=str(shapes_data / "eval/32"), inception_weights=str(inception_weights),
                     inception_features=64, clip=str(tiny_clip), prompts=str(prompt_file), n_per_prompt=1,
                     n_reference=16, guidance=(3.0, 5.0), steps=2, size=16, batch_size=8, kid_subsets=2,
                     kid_subset_size=4, bootstrap=20, device="cpu", progress=False)
    a, b = tiny_run / "ep0-ba2-rank0.pt", tiny_run / "ep0-ba4-rank0.pt"
    rows = {(r["checkpoint"], r["guidance"]): r for r in evaluate_checkpoints(cfg, [a, b])}
    row_a, row_b = rows[str(a), 5.0], rows[str(b), 5.0]
    study = root / "study"
    samples = [s for r in (row_b, row_a) for s in read_manifest(out / r["samples"] / "manifest.jsonl")]  # B first: image a
    build_study(samples, study, repeats=1, progress=False)
    by_model = _cast_votes(study)
    assert main(["human-eval", "report", str(study), "--bootstrap", "20"]) == 0
    assert main(["evaluate", "compare", str(a), str(b), "--out", str(out), "--bootstrap", "50", "--study", str(study)]) == 0
    labels = {row_a["model"]: "A", row_b["model"]: "B"}
    votes = {key: {labels.get(m, m): n for m, n in counts.items()} for key, counts in by_model.items()}
    return SimpleNamespace(out=out, a=a, b=b, rows=rows, study=study, votes=votes,
                           page=comparison_page(out, row_a["model"], row_b["model"]))


def _pair_on_page(figure, copy: Path) -> dict:
    """The figure's prompt, seed and keys, and the files its A and B images point to, relative to the copy."""
    files = {}
    for side in ("a", "b"):
        img = figure.query_selector(f"img.{side}")
        url = urlparse(img.evaluate("i => i.src"))
        assert url.scheme == "file" and img.evaluate("i => i.complete && i.naturalWidth") == 16
        files[side] = Path(unquote(url.path)).relative_to(copy)
    return {"prompt": figure.query_selector("p.prompt").text_content(), "files": files,
            "key": tuple(int(figure.get_attribute(k)) for k in ("data-prompt-index", "data-image-index", "data-seed")),
            "votes": {tr.get_attribute("data-question"): {td.get_attribute("data-choice"): int(td.text_content())
                                                            for td in tr.query_selector_all("td[data-choice]")}
                      for tr in figure.query_selector_all("table.votes tr[data-question]")}}


@needs_chromium
def test_the_page_shows_verdicts_then_pairs_by_difference_with_their_votes(compared, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    copy = tmp_path / "elsewhere"  # the results folder copied: the page's links are relative
    shutil.copytree(compared.out, copy)
    page_file = copy / compared.page.relative_to(compared.out)
    problems = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(page_file.as_uri())
        page.wait_for_load_state("load")
        sections = {}
        for s in page.query_selector_all("section.guidance"):
            page.evaluate("s => s.querySelectorAll('img').forEach(i => i.loading = 'eager')", s)
            page.wait_for_function("s => [...s.querySelectorAll('img')].every(i => i.complete)", arg=s)
            sections[float(s.get_attribute("data-guidance"))] = {
                "metrics": [(tr.get_attribute("data-metric"), tr.query_selector("td.sentence").text_content())
                            for tr in s.query_selector_all("table.verdict tr[data-metric]")],
                "pairs": [_pair_on_page(f, copy) for f in s.query_selector_all("figure.pair")]}
        prompts = [(e.text_content(), e.evaluate("e => e.children.length")) for e in page.query_selector_all("p.prompt")]
        pwned = page.evaluate("window.pwned")
        browser.close()

    assert not problems and pwned is None
    assert list(sections) == [3.0, 5.0]
    for guidance, shown in sections.items():
        row_a, row_b = (compared.rows[str(c), guidance] for c in (compared.a, compared.b))
        comparison = json.loads(comparison_file(compared.out, row_a["model"], row_b["model"], guidance).read_text())
        assert shown["metrics"] == [(m["metric"], m["sentence"]) for m in comparison["metrics"]]

        lines = {side: {Path(r["samples"]) / m["path"]: m for m in _manifest(compared.out / r["samples"] / "manifest.jsonl")}
                 for side, r in (("a", row_a), ("b", row_b))}
        assert len(shown["pairs"]) == 4
        differences = []
        for pair in shown["pairs"]:
            a, b = (lines[side][pair["files"][side]] for side in ("a", "b"))  # the files the <img> tags point to
            assert (a["prompt_index"], a["image_index"], a["seed"]) == pair["key"] == (
                b["prompt_index"], b["image_index"], b["seed"])
            assert a["prompt"] == b["prompt"] == pair["prompt"] == PROMPTS[a["prompt_index"]]
            differences.append(abs(b["clip_score"] - a["clip_score"]))
            expected = compared.votes.get(pair["key"][:2]) if guidance == 5.0 else None
            assert pair["votes"] == ({q: expected for q in ("quality", "alignment")} if expected else {})
        assert differences == sorted(differences, reverse=True)  # the pairs that differ most first
    assert sum(bool(p["votes"]) for p in sections[5.0]["pairs"]) == len(VOTERS)
    assert (HOSTILE, 0) in prompts and all(children == 0 for _, children in prompts)  # markup shown as text
    report = (compared.out / "report" / "index.html").read_text()
    assert f"../compare/{compared.page.name}" in report


def test_the_page_caps_its_pairs_and_a_study_of_other_checkpoints_is_refused(compared, dwb, tmp_path):
    from evaluate.compare_page import write_compare_page

    results = [json.loads(p.read_text()) for p in sorted((compared.out / "compare").glob("*.json"))]
    copy = tmp_path / "eval"
    shutil.copytree(compared.out, copy)
    text = write_compare_page(copy, str(compared.a), str(compared.b), results, max_pairs=2).read_text()
    assert text.count("<figure class='pair'") == 4 and text.count("(2 of 4 pairs)") == 2
    written = compared.page.read_text()  # every pair: the prompt with markup is there, escaped
    assert HOSTILE not in written and "&lt;script&gt;window.pwned=1&lt;/script&gt;" in written

    other = tmp_path / "other-study"
    shutil.copytree(compared.study, other)
    study = json.loads((other / "study.json").read_text())
    for info in study["model_info"].values():
        info["checkpoint_hash"] = "0123456789ab"
    (other / "study.json").write_text(json.dumps(study))
    args = ["evaluate", "compare", str(compared.a), str(compared.b), "--out", str(copy), "--bootstrap", "40"]
    r = dwb(*args, "--study", str(other))
    assert r.returncode != 0 and "is a study of other checkpoints" in r.stderr and "0123456789ab" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    shutil.rmtree(other / "report")
    r = dwb(*args, "--study", str(other))
    assert r.returncode != 0 and "run `dwb human-eval report" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_verdict_table_takes_readable_names_and_an_overall_verdict_where_the_comparison_has_them():
    from evaluate.compare_page import verdict_table

    metric = {"metric": "clip_score", "a": 20.0, "b": 21.5, "difference": 1.5, "lo": 0.5, "hi": 2.5, "p": 0.01,
              "better": "B", "sentence": "B is better on CLIP score by 1.5 [0.5, 2.5], p = 0.01"}
    plain = verdict_table({"metrics": [metric]})
    assert "<td>clip_score</td>" in plain and plain.startswith("<table")  # no verdict line without a verdict
    named = verdict_table({"metrics": [{**metric, "name": "CLIP <score>"}], "verdict": "B is better <overall>"})
    assert "<td>CLIP &lt;score&gt;</td>" in named and "<p class='verdict'>B is better &lt;overall&gt;</p>" in named
    assert "<tr class='better-B' data-metric='clip_score'>" in named and "+1.5 [+0.5, +2.5]" in named
