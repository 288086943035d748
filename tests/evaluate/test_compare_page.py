"""The comparison page in a real headless Chromium: the verdict table, A's and B's images of the same prompt and
seed side by side in order of their per-image difference, raters' votes beside the right pairs, prompts as text.

Two tiny checkpoints scored on 4 prompts at guidance 3 and 5 (CLIP score per image), a study of
their guidance-5 images with a few votes, reported by `dwb human-eval report`, then `dwb evaluate compare
--study`; the page is opened from a copy of the results folder."""
import csv
import json
import re
import shutil
from pathlib import Path
from html.parser import HTMLParser
from types import SimpleNamespace
from urllib.parse import unquote, urlparse

import pytest

from evaluate.layout import comparison_file, comparison_page
from evaluate.run import EvalConfig, evaluate_checkpoints
from evaluate.verdict import flip_shown

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
    from playwright import sync_api
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
                "flips": [tr.query_selector("td.flip").text_content()
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
        # the prompts that would flip each verdict, beside its interval: the JSON's count, as the printed line gives it
        assert shown["flips"] == [flip_shown(m) for m in comparison["metrics"]]
        assert all(f in m["sentence"] for f, m in zip(shown["flips"], comparison["metrics"]))

        lines = {side: {Path(r["samples"]) / m["path"]: m for m in _manifest(compared.out / r["samples"] / "manifest.jsonl")}
                 for side, r in (("a", row_a), ("b", row_b))}
        assert len(shown["pairs"]) == 4
        differences, voted = [], []
        for pair in shown["pairs"]:
            a, b = (lines[side][pair["files"][side]] for side in ("a", "b"))  # the files the <img> tags point to
            assert (a["prompt_index"], a["image_index"], a["seed"]) == pair["key"] == (
                b["prompt_index"], b["image_index"], b["seed"])
            assert a["prompt"] == b["prompt"] == pair["prompt"] == PROMPTS[a["prompt_index"]]
            differences.append(abs(b["clip_score"] - a["clip_score"]))
            expected = compared.votes.get(pair["key"][:2]) if guidance == 5.0 else None
            assert pair["votes"] == ({q: expected for q in ("quality", "alignment")} if expected else {})
            voted.append(bool(pair["votes"]))
        assert voted == sorted(voted, reverse=True)  # the pairs raters voted on first
        for group in (True, False):  # then, within each, the pairs that differ most first
            part = [d for d, v in zip(differences, voted) if v == group]
            assert part == sorted(part, reverse=True)
    assert sum(bool(p["votes"]) for p in sections[5.0]["pairs"]) == len(VOTERS)
    assert (HOSTILE, 0) in prompts and all(children == 0 for _, children in prompts)  # markup shown as text
    report = (compared.out / "report" / "index.html").read_text()
    assert f"../compare/{compared.page.name}" in report


def test_the_page_caps_its_pairs_and_a_study_of_other_checkpoints_is_refused(compared, dwb, tmp_path):
    from evaluate.compare_page import write_compare_page

    from evaluate.study_votes import read_study

    results = [json.loads(p.read_text()) for p in sorted((compared.out / "compare").glob("*.json"))]
    copy = tmp_path / "eval"
    shutil.copytree(compared.out, copy)
    text = write_compare_page(copy, str(compared.a), str(compared.b), results, max_pairs=2).read_text()
    assert text.count("<figure class='pair'") == 4 and text.count("(2 of 4 pairs)") == 2
    # with a study, the pairs raters voted on come first: 3 of the 4 at guidance 5 have votes, and the one without
    # differs more than two of them, so ordered by difference alone it took one of 3 places
    text = write_compare_page(copy, str(compared.a), str(compared.b), results, [read_study(compared.study)],
                              max_pairs=len(VOTERS)).read_text()
    guidance_5 = text.split("data-guidance='5'")[1]
    assert guidance_5.count("<figure class='pair'") == len(VOTERS) and "no votes on this pair" not in guidance_5
    written = compared.page.read_text()  # every pair: the prompt with markup is there, escaped
    assert HOSTILE not in written and "&lt;script&gt;window.pwned=1&lt;/script&gt;" in written
    # the app serves this page: no server path on it (checkpoints by file name, the study by its folder's name)
    assert str(compared.a.parent) not in written and str(compared.study.parent) not in written
    assert compared.a.name in written and f"study folder {compared.study.name}" in written

    # beside the metrics' verdict, what the raters preferred, in the human-eval report's own words and digits
    from html import unescape

    from human_eval.report import summary

    said = summary(json.loads((compared.study / "report" / "results.json").read_text()))
    shown = [unescape(re.sub(r"<[^>]+>", "", li)) for li in re.findall(r"<li class='preference'[^>]*>(.*?)</li>",
                                                                      written)]
    assert len(shown) == 2  # quality and alignment, at guidance 5 (the study's)
    share = r"share of \d+ decisive votes ([0-9.]+ \[[0-9.]+, [0-9.]+\]%) \(95%.*?\), (p [=<]+ [0-9.e-]+)"
    for line in shown:
        question = line.split(":")[0]
        [report_line] = [r for r in said.splitlines() if r.strip().startswith(f"{question}  ") and "share of" in r]
        assert re.search(share, line).groups() == re.search(share, report_line).groups()

    broken = tmp_path / "broken-study"  # a report whose numbers are markup: one line, naming the file
    shutil.copytree(compared.study, broken)
    results = json.loads((broken / "report" / "results.json").read_text())
    results["comparisons"][0]["rate_a"] = "<script>window.pwned=1</script>"
    (broken / "report" / "results.json").write_text(json.dumps(results))
    r = dwb("evaluate", "compare", str(compared.a), str(compared.b), "--out", str(copy), "--bootstrap", "40",
            "--study", str(broken))
    assert r.returncode != 0 and "results.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1

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


class VerdictRows(HTMLParser):
    """A verdict table as a browser's parser reads it: per metric, its row's class and each cell's text by class;
    and the text of each family's line."""

    def __init__(self, text: str):
        super().__init__()
        self.rows, self.families, self.row, self.cell, self.family = {}, [], None, None, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and "data-metric" in attrs:
            self.row = self.rows[attrs["data-metric"]] = {"class": attrs["class"]}
        elif tag == "td" and self.row is not None:
            self.cell = attrs.get("class")
            self.row[self.cell] = ""
        elif tag == "li" and attrs.get("class") == "family":
            self.families.append("")
            self.family = True

    def handle_endtag(self, tag):
        self.cell = None if tag == "td" else self.cell
        self.row = None if tag == "tr" else self.row
        self.family = None if tag == "li" else self.family

    def handle_data(self, data):
        if self.row is not None and self.cell is not None:
            self.row[self.cell] += data
        if self.family:
            self.families[-1] += data


def test_the_verdict_table_reads_as_the_printed_lines_after_holms_adjustment():
    """FID with p = 0.048 beside a KID that differs in nothing: Holm's adjustment over the two makes it 0.096, and
    `compare` prints "cannot tell" first; the row was still green, its p column the unadjusted "0.048", and the
    family verdicts the text prints were not on the page. A lone CLIP score with p = 0.0496 printed "0.05" (`:.2g`)
    beside a green row."""
    from evaluate.compare_page import verdict_table
    from evaluate.verdict import overall, with_verdicts

    def measured(key, diff, lo, hi, p):
        return {"metric": key, "a": 1.0, "b": 1.0 + diff, "difference": diff, "lo": lo, "hi": hi, "p": p,
                "replicates": 200, "defined": 200}

    metrics = with_verdicts([measured("fid", -2.0, -3.9, -0.1, 0.048), measured("kid_mean", 0.0, -0.01, 0.01, 0.6),
                             measured("clip_score", 1.5, 0.002, 3.0, 0.0496)])
    fid = next(m for m in metrics if m["metric"] == "fid")
    page = VerdictRows(verdict_table({"metrics": metrics, "overall": overall(metrics)}))
    rows = page.rows
    assert rows["fid"]["class"] == "better-none" and fid["better"] == "B"  # alone, B would be better
    assert rows["fid"]["p"] == "p = 0.096" and rows["fid"]["own-p"] == "p = 0.048"
    assert rows["fid"]["verdict"] == "cannot tell" and rows["fid"]["sentence"].startswith("cannot tell on FID after Holm")
    assert rows["clip_score"]["class"] == "better-B" and rows["clip_score"]["p"] == "p < 0.05"
    for m in metrics:  # each row's sentence is the printed line, and its p cells are the p values that line prints
        row = rows[m["metric"]]
        assert row["sentence"] == m["sentence"] and row["p"] in m["sentence"] and row["own-p"] in m["sentence"]
    assert page.families == [f["sentence"] for f in overall(metrics)["families"]]
    assert page.families[0].startswith("image quality: cannot tell")
    assert page.families[1].startswith("text alignment: B is better")
    named = verdict_table({"metrics": [{**metrics[2], "name": "CLIP <score>"}]})
    assert "<td class='name'>CLIP &lt;score&gt;</td>" in named and "<div class='overall'>" not in named
