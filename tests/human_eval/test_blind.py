"""Nothing but the pixels tells models apart: one PNG encoding for every source, gold decoys of ordinary size."""
import io
import json
import struct

import numpy as np
import pytest
from PIL import Image

from human_eval.images import ImageCache, clean_image, png_chunk_types
from human_eval.samples import read_manifest
from human_eval.study import build_study, load_study

from .conftest import drawbench, photo_like


def ihdr(data: bytes) -> tuple[int, int, int, int, int, int, int]:
    """(width, height, bit depth, colour type, compression, filter, interlace) of a PNG."""
    assert data[12:16] == b"IHDR"
    return struct.unpack(">IIBBBBB", data[16:29])


SAVERS = {  # the same grey pixels written the ways generators and tools write images
    "RGB": lambda g: Image.fromarray(np.repeat(g[..., None], 3, -1)),
    "RGBA": lambda g: Image.fromarray(np.dstack([np.repeat(g[..., None], 3, -1), np.full_like(g, 255)])),
    "L": lambda g: Image.fromarray(g),
    "LA": lambda g: Image.fromarray(np.dstack([g, np.full_like(g, 255)]), "LA"),
    "P": lambda g: Image.fromarray(g).convert("P", palette=Image.Palette.ADAPTIVE, colors=256),
    "I;16": lambda g: Image.fromarray(g.astype(np.uint16) * 257),
}


def test_every_source_format_becomes_the_same_png(tmp_path):
    g = (np.add.outer(np.arange(24), np.arange(20)) * 5 % 200).astype(np.uint8)  # (24, 20), under 256 levels
    outputs = {}
    for mode, make in SAVERS.items():
        image = make(g)
        assert image.mode == mode
        image.save(tmp_path / f"{mode.replace(';', '')}.png")
        outputs[mode] = clean_image(tmp_path / f"{mode.replace(';', '')}.png")
    assert len(set(outputs.values())) == 1, {m: ihdr(d) for m, d in outputs.items()}
    assert ihdr(outputs["RGB"]) == (20, 24, 8, 2, 0, 0, 0)  # 8-bit RGB, not interlaced
    with Image.open(io.BytesIO(outputs["RGBA"])) as im:
        assert np.array_equal(np.asarray(im), np.repeat(g[..., None], 3, -1))
    Image.fromarray(np.repeat(g[..., None], 3, -1)).convert("CMYK").save(tmp_path / "cmyk.jpg", quality=95)
    assert ihdr(clean_image(tmp_path / "cmyk.jpg"))[2:4] == (8, 2)
    half = Image.fromarray(np.dstack([np.repeat(g[..., None], 3, -1), np.full_like(g, 0)]))
    half.save(tmp_path / "clear.png")
    with Image.open(io.BytesIO(clean_image(tmp_path / "clear.png"))) as im:
        flat = np.asarray(im)
        assert im.mode == "RGB" and (flat == flat[0, 0]).all()  # fully transparent: the page's backdrop only


def write_mode_samples(folder, name: str, prompts, mode: str, seed: int):
    """A manifest whose images are all saved in one PNG mode (RGBA for one model, RGB for another)."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    lines = []
    for i, (prompt, category) in enumerate(prompts):
        pixels = photo_like(rng, 48)
        image = Image.fromarray(pixels)
        if mode == "RGBA":
            image = Image.fromarray(np.dstack([pixels, np.full(pixels.shape[:2], 255, np.uint8)]))
        elif mode == "JPEG":
            image.save(folder / f"{i}.jpg", quality=92)
        if mode != "JPEG":
            image.save(folder / f"{i}.png")
        lines.append(json.dumps({"prompt": prompt, "prompt_index": i, "category": category, "image_index": 0,
                                 "model": name, "path": f"{i}.{'jpg' if mode == 'JPEG' else 'png'}"}))
    (folder / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "manifest.jsonl"


def test_served_images_have_one_mode_and_encoder_whatever_the_model(tmp_path):
    prompts = drawbench(6)
    samples = []
    for name, mode in (("rgba-model", "RGBA"), ("rgb-model", "RGB"), ("jpeg-model", "JPEG")):
        samples += read_manifest(write_mode_samples(tmp_path / name, name, prompts, mode, seed=len(samples)))
    build_study(samples, tmp_path / "study", progress=False)
    study = load_study(tmp_path / "study")
    served = ImageCache(study.image_files())  # what /img/{token} answers (test_server crawls it over HTTP)
    headers = {}
    for token, image in study.images.items():
        data = served.get(token)
        headers.setdefault(image.model, set()).add((ihdr(data)[2:], tuple(png_chunk_types(data)[:2])))
    assert len(headers) == 3
    assert set.union(*headers.values()) == {((8, 2, 0, 0, 0), (b"IHDR", b"IDAT"))}, headers


@pytest.fixture(scope="module")
def gold_study(tmp_path_factory):
    """Two models on 40 prompts with natural-looking images of varied detail, and 40 gold pairs."""
    root = tmp_path_factory.mktemp("gold")
    prompts = drawbench()[:40]
    samples = []
    for m, name in enumerate(("left-model", "right-model")):
        folder = root / name
        folder.mkdir()
        rng = np.random.default_rng(10 + m)
        lines = []
        for i, (prompt, category) in enumerate(prompts):
            Image.fromarray(photo_like(rng, 64)).save(folder / f"{i}.png")
            lines.append(json.dumps({"prompt": prompt, "prompt_index": i, "category": category, "image_index": 0,
                                     "model": name, "path": f"{i}.png"}))
        (folder / "manifest.jsonl").write_text("\n".join(lines) + "\n")
        samples += read_manifest(folder / "manifest.jsonl")
    build_study(samples, root / "study", gold=40, seed=3, progress=False)
    return root / "study"


def test_choosing_by_file_size_does_not_pass_gold_checks(gold_study):
    study = load_study(gold_study)
    size = {token: (gold_study / image.file).stat().st_size for token, image in study.images.items()}
    gold = [p for p in study.pairs if p.kind == "gold"]
    assert len(gold) == 40
    smaller_is_real = np.mean([size[p.a] < size[p.b] for p in gold])  # pass rate of "always pick the smaller file"
    assert abs(smaller_is_real - 0.5) <= 0.10, smaller_is_real
    ratio = np.array([size[p.b] / size[p.a] for p in gold])
    assert np.all((ratio > 0.7) & (ratio < 1.4)), ratio  # decoys are as large as ordinary images
    for p in gold:  # still an obviously worse image: the decoy does not resemble the real one
        real, decoy = (np.asarray(Image.open(gold_study / study.images[t].file), dtype=float) for t in (p.a, p.b))
        assert real.shape == decoy.shape
        assert np.abs(real - decoy).mean() > 20
