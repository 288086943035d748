"""Building studies: pairing, gold and repeated pairs, the folder format, metadata-free images, bad input."""
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from human_eval import HumanEvalError
from human_eval.images import PIXEL_CHUNKS, clean_image, png_chunk_types, strip_png_metadata
from human_eval.samples import read_folder, read_manifest
from human_eval.study import GOLD_MODEL, build_study, load_study

from .conftest import DRAWBENCH, drawbench, model_secrets, write_samples


def pixels(path_or_bytes) -> np.ndarray:
    src = io.BytesIO(path_or_bytes) if isinstance(path_or_bytes, bytes) else path_or_bytes
    with Image.open(src) as im:
        return np.asarray(im.convert("RGB"))


def test_pairs_are_matched_by_prompt_and_image_index(tmp_path):
    prompts = drawbench(6)
    a = read_manifest(write_samples(tmp_path / "a", "a", prompts, 2, seed=1))
    b = read_manifest(write_samples(tmp_path / "b", "b", prompts[1:], 3, seed=2, first_index=1))  # no prompt 0, image 2
    study, summary = build_study(a + b, tmp_path / "study", progress=False)
    assert study.models == [model_secrets("a")["model"], model_secrets("b")["model"]]
    assert summary["pairs"] == len(study.pairs) == 5 * 2
    assert summary["unmatched_images"] == {study.models[0]: 2, study.models[1]: 5}
    source = {(s.model, s.prompt_index, s.image_index): s for s in a + b}
    for pair in study.pairs:
        prompt = study.prompts[pair.prompt]
        assert prompt.text != prompts[0][0] and prompt.text == prompts[prompt.index][0] and pair.image_index in (0, 1)
        assert study.models_of(pair) == tuple(study.models)
        for token, model in ((pair.a, study.models[0]), (pair.b, study.models[1])):
            original = source[(model, prompt.index, pair.image_index)]
            assert np.array_equal(pixels(study.folder / study.images[token].file), pixels(original.path))
    assert {p.text: p.category for p in study.prompts} == dict(prompts[1:]) | {prompts[0][0]: prompts[0][1]}


def test_three_models_give_every_model_pair(tmp_path):
    prompts = drawbench(4)
    samples = []
    for i, name in enumerate(("x", "y", "z")):
        samples += read_manifest(write_samples(tmp_path / name, name, prompts, 1, seed=i))
    study, summary = build_study(samples, tmp_path / "study", progress=False)
    combos = {study.models_of(p) for p in study.pairs}
    assert len(combos) == 3 and all(study.models.index(a) < study.models.index(b) for a, b in combos)
    assert len(study.pairs) == 3 * 4 and list(summary["pairs_per_model_pair"].values()) == [4, 4, 4]


def test_study_images_hold_pixels_only(two_model_study):
    secrets = [s.encode() for name in ("alpha", "beta") for s in model_secrets(name).values()]
    files = sorted((two_model_study / "images").iterdir())
    assert files
    for f in files:
        data = f.read_bytes()
        assert set(png_chunk_types(data)) <= PIXEL_CHUNKS
        assert not any(s in data for s in secrets)
    names = " ".join(f.name for f in files)
    assert "alpha" not in names and "beta" not in names  # file names are content hashes


def test_strip_png_metadata_removes_text_exif_and_icc(tmp_path):
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", "model: secret-model")
    info.add_text("comment", "compressed secret-model", zip=True)
    info.add_itxt("Software", "secret-model")
    exif = Image.Exif()
    exif[0x0131] = "secret-model"
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8))
    buf = io.BytesIO()
    image.save(buf, "PNG", pnginfo=info, exif=exif, icc_profile=b"\0" * 200)
    data = buf.getvalue()
    assert {b"tEXt", b"zTXt", b"iTXt", b"eXIf", b"iCCP"} <= set(png_chunk_types(data))
    clean = strip_png_metadata(data)
    assert set(png_chunk_types(clean)) <= PIXEL_CHUNKS and b"secret-model" not in clean
    assert np.array_equal(pixels(clean), pixels(data))
    with pytest.raises(ValueError):
        strip_png_metadata(b"GIF89a....")
    jpeg = tmp_path / "x.jpg"
    image.save(jpeg, "JPEG", exif=exif, quality=95)
    out = clean_image(jpeg)
    assert b"secret-model" not in out and set(png_chunk_types(out)) <= PIXEL_CHUNKS
    assert np.array_equal(pixels(out), pixels(jpeg))  # the decoded JPEG's pixels, losslessly


def test_gold_and_repeated_pairs(two_model_study):
    study = load_study(two_model_study)
    kinds = [p.kind for p in study.pairs]
    assert kinds.count("main") == 24 and kinds.count("gold") == 2 and kinds.count("repeat") == 2
    real_files = {study.images[t].file for p in study.pairs if p.kind == "main" for t in (p.a, p.b)}
    for pair in study.pairs:
        if pair.kind == "gold":
            assert pair.gold == "a" and study.images[pair.b].model == GOLD_MODEL
            assert study.images[pair.a].file in real_files and study.images[pair.b].file not in real_files
            decoy = pixels(study.folder / study.images[pair.b].file).astype(float)
            assert np.abs(np.diff(decoy, axis=1)).mean() != pytest.approx(0)  # a real, noisy image
        elif pair.kind == "repeat":
            original = study.by_id[pair.repeat_of]
            assert original.kind == "main" and {pair.a, pair.b}.isdisjoint({original.a, original.b})  # new tokens
            assert [study.images[t].file for t in (pair.a, pair.b)] == [study.images[t].file for t in (original.a, original.b)]
    assert len({p.id for p in study.pairs}) == len(study.pairs)


def test_each_rater_gets_a_stable_random_order(two_model_study):
    study = load_study(two_model_study)
    ids = sorted(p.id for p in study.pairs)
    first = study.order_for("ann")
    assert sorted(first) == ids and study.order_for("ann") == first
    assert load_study(two_model_study).order_for("ann") == first  # the same after a restart
    others = [study.order_for(f"r{i}") for i in range(5)]
    assert all(o != first for o in others) and len({o[0] for o in others + [first]}) > 2


def test_folder_and_prompt_csv(tmp_path):
    prompts = drawbench()
    for model, seed in (("sd2-base", 1), ("ours", 2)):
        folder = tmp_path / model
        folder.mkdir()
        rng = np.random.default_rng(seed)
        for i, k in ((0, 0), (0, 1), (17, 0), (199, 0)):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(folder / f"{i:03d}_{k}.png")
        (folder / "notes.txt").write_text("ignored")
        Image.new("RGB", (4, 4)).save(folder / "cover.png")  # not <prompt>_<image>: ignored
    a, b = read_folder(tmp_path / "sd2-base", DRAWBENCH), read_folder(tmp_path / "ours", DRAWBENCH, model="mine")
    assert {s.model for s in a} == {"sd2-base"} and {s.model for s in b} == {"mine"}
    assert {(s.prompt_index, s.image_index) for s in a} == {(0, 0), (0, 1), (17, 0), (199, 0)}
    assert next(s for s in a if s.prompt_index == 17).prompt == prompts[17][0]
    assert next(s for s in a if s.prompt_index == 199).category == prompts[199][1]
    study, _ = build_study(a + b, tmp_path / "study", progress=False)
    assert len(study.pairs) == 4


def test_a_repeated_csv_row_is_its_own_prompt(tmp_path):
    csv_file = tmp_path / "prompts.csv"
    csv_file.write_text("prompt,category\ntwo blue circles,a\none red square,a\ntwo blue circles,b\n")
    for model, seed in (("x", 1), ("y", 2)):
        (tmp_path / model).mkdir()
        rng = np.random.default_rng(seed)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / model / f"{i}_0.png")
    samples = read_folder(tmp_path / "x", csv_file) + read_folder(tmp_path / "y", csv_file)
    study, summary = build_study(samples, tmp_path / "study", progress=False)
    assert summary["pairs"] == 3 and [(p.index, p.text, p.category) for p in study.prompts] == [
        (0, "two blue circles", "a"), (1, "one red square", "a"), (2, "two blue circles", "b")]
    for pair in study.pairs:  # the image of row 2 is paired with row 2's, not row 0's
        index = study.prompts[pair.prompt].index
        for token in (pair.a, pair.b):
            model = study.images[token].model
            assert np.array_equal(pixels(study.folder / study.images[token].file), pixels(tmp_path / model / f"{index}_0.png"))


def test_manifest_details(tmp_path):
    manifest = write_samples(tmp_path / "m", "m", drawbench(2), 1, absolute=True)
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    for row in rows:
        del row["model"]  # the label falls back to the checkpoint's file stem
        row["unknown_future_key"] = {"nested": True}
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    samples = read_manifest(manifest)
    assert {s.model for s in samples} == {"ep3-ba800k-rank0"}
    assert samples[0].settings == {"guidance": 7.5, "sampler": model_secrets("m")["scheduler"], "steps": 50,
                                   "width": 32, "height": 32}
    assert read_manifest(manifest, model="label")[0].model == "label"


def _bad(tmp_path: Path, edit) -> Path:
    manifest = write_samples(tmp_path / "bad", "bad", drawbench(3), 1)
    lines = manifest.read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    out = edit(rows, lines)
    manifest.write_text("\n".join(out) + "\n")
    return manifest


@pytest.mark.parametrize("edit, needle", [
    (lambda rows, lines: lines[:1] + ["{not json"] + lines[2:], "manifest.jsonl:2: not valid JSON"),
    (lambda rows, lines: lines[:2] + [json.dumps({k: v for k, v in rows[2].items() if k != "path"})],
     "manifest.jsonl:3: missing key 'path'"),
    (lambda rows, lines: [json.dumps({**rows[0], "path": "samples/missing.png"})], "image not found"),
    (lambda rows, lines: [json.dumps({**rows[0], "image_index": "0"})], "'image_index' must be an integer"),
    (lambda rows, lines: [json.dumps({k: v for k, v in rows[0].items() if k not in ("model", "checkpoint")})],
     "needs 'model' or 'checkpoint'"),
    (lambda rows, lines: [lines[0], lines[0]], "a second image of model"),
    (lambda rows, lines: ["[1, 2]"], "expected a JSON object"),
])
def test_bad_manifests_are_named(tmp_path, edit, needle):
    with pytest.raises(HumanEvalError) as e:
        read_manifest(_bad(tmp_path, edit))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bad_studies_are_refused(tmp_path):
    prompts = drawbench(3)
    a = read_manifest(write_samples(tmp_path / "a", "a", prompts, 1))
    with pytest.raises(HumanEvalError, match="two or more models"):
        build_study(a, tmp_path / "s1", progress=False)
    with pytest.raises(HumanEvalError, match="two images of model"):
        build_study(a + a, tmp_path / "s2", progress=False)
    other = read_manifest(write_samples(tmp_path / "c", "c", drawbench(6)[3:], 1, first_index=3))
    with pytest.raises(HumanEvalError, match="no prompt and image_index in common"):
        build_study(a + other, tmp_path / "s3", progress=False)
    shifted = read_manifest(write_samples(tmp_path / "d", "d", drawbench(6)[3:], 1))  # other texts at indices 0-2
    with pytest.raises(HumanEvalError, match="prompt 0 of prompt set .* reads 'A red colored car.' .* but"):
        build_study(a + shifted, tmp_path / "s3", progress=False)
    b = read_manifest(write_samples(tmp_path / "b", "b", prompts, 1))
    build_study(a + b, tmp_path / "s4", progress=False)
    with pytest.raises(HumanEvalError, match="already holds a study"):
        build_study(a + b, tmp_path / "s4", progress=False)
    with pytest.raises(HumanEvalError, match="more than the 3 pairs"):
        build_study(a + b, tmp_path / "s5", repeats=4, progress=False)
    with pytest.raises(HumanEvalError, match="no study in"):
        load_study(tmp_path / "s5")
