"""`dwb data convert`: real image folders, Parquet files and saved datasets in, MDS buckets out."""
from __future__ import annotations

import io
import json

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from streaming import LocalDataset

from train.data.convert import ConvertSummary, convert_to_mds
from models.errors import WorkbenchError


def photo(w: int, h: int, seed: int = 0) -> Image.Image:
    """Noise, so encoders cannot shrink it and a truncated file really lacks pixels."""
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def encoded(img: Image.Image, fmt: str = "JPEG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def read(folder) -> list[dict]:
    """Every sample, through Streaming's reader of a local MDS folder (no shared memory: a StreamingDataset here
    raced another test process's for the same shared-memory name, FileExistsError)."""
    ds = LocalDataset(local=str(folder))
    return [ds[i] for i in range(len(ds))]


def test_image_folder_sidecars_corrupt_and_buckets(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    (src / "sub").mkdir(parents=True)
    photo(300, 400, 1).save(src / "a.jpg")
    (src / "a.txt").write_text("  a red fox in the snow \n")
    photo(600, 800, 2).save(src / "b.png")
    (src / "b.json").write_text(json.dumps({"caption": "a blue bird", "photographer": "ana", "year": 2020}))
    photo(1040, 520, 3).save(src / "sub" / "c.webp")
    (src / "sub" / "c.txt").write_text("a wide harbour at dusk")
    (src / "bad.jpg").write_bytes(np.random.default_rng(4).bytes(5000))  # random bytes
    (src / "bad.txt").write_text("never written")
    png = encoded(photo(600, 600, 5), "PNG")
    (src / "cut.png").write_bytes(png[: len(png) // 2])  # header intact, pixels truncated
    (src / "cut.txt").write_text("never written")
    (src / "empty.jpg").write_bytes(b"")
    (src / "empty.txt").write_text("never written")
    photo(300, 300, 6).save(src / "orphan.jpg")  # no sidecar
    photo(100, 120, 7).save(src / "tiny.png")
    (src / "tiny.txt").write_text("too small")
    photo(400, 300, 8).save(src / "blank.jpg")
    (src / "blank.txt").write_text("  \n")

    summary = convert_to_mds(src, out, progress=False)

    assert isinstance(summary, ConvertSummary)
    assert (summary.seen, summary.written, summary.corrupt) == (9, {256: 3, 512: 2}, 3)
    assert (summary.no_caption, summary.empty_caption, summary.too_small, summary.filtered) == (1, 1, 1, 0)
    assert summary.line() == ("converted 3 of 9 images: 256px 3, 512px 2; skipped 3 corrupt, 1 without caption, "
                              "1 empty caption, 1 too small, 0 too large, 0 filtered")
    small, large = read(out / "256"), read(out / "512")
    assert [s["caption"] for s in small] == ["a red fox in the snow", "a blue bird", "a wide harbour at dusk"]
    assert [s["caption"] for s in large] == ["a blue bird", "a wide harbour at dusk"]
    assert [s["image"].size for s in small] == [(256, 341), (256, 341), (512, 256)]
    assert [s["image"].size for s in large] == [(512, 683), (1024, 512)]
    assert all(s["image"].mode == "RGB" for s in small + large)
    assert small[0]["meta"] == {"source": "a.jpg", "original_size": [300, 400]}
    assert small[1]["meta"] == {"photographer": "ana", "year": 2020, "source": "b.png", "original_size": [600, 800]}
    assert large[1]["meta"]["source"] == "sub/c.webp"


def test_jpeg_draft_and_exif_orientation(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6  # stored landscape, shown rotated 90 degrees: portrait
    photo(2400, 1800).save(src / "cam.jpg", exif=exif, quality=95)
    (src / "cam.txt").write_text("a phone photo")

    convert_to_mds(src, out, image_format="png", progress=False)

    (small,), (large,) = read(out / "256"), read(out / "512")
    assert (small["image"].size, large["image"].size) == ((256, 341), (512, 683))
    assert small["meta"]["original_size"] == [1800, 2400]


def _parquet_rows(rows: list[tuple]) -> pa.Table:
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return pa.table({
        "image": pa.array([{"bytes": encoded(photo(w, w, i)), "path": f"{i}.jpg"} for i, (w, *_) in enumerate(rows)],
                          type=image_type),
        "caption": [r[1] for r in rows],
        "aesthetic_score": [r[2] for r in rows],
        "language": [r[3] for r in rows],
        "url": [f"https://example.com/{i}.jpg" for i in range(len(rows))],
        "tags": [["x", "y"]] * len(rows),  # not a scalar: stays out of meta
    })


def test_parquet_struct_images_with_filters(tmp_path):
    src, out = tmp_path / "laion", tmp_path / "out"
    src.mkdir()
    pq.write_table(_parquet_rows([
        (300, "a cat", 6.5, "en"),
        (600, "a dog", 4.0, "en"),  # aesthetic too low
        (600, "a bird", 7.0, "de"),  # language not wanted
    ]), src / "part-00000.parquet")
    pq.write_table(_parquet_rows([
        (600, "a fish", 8.0, "FR"),
        (300, "   ", 9.0, "en"),  # empty caption
        (300, "a frog", None, "en"),  # unknown aesthetic score
        (200, "a newt", 9.0, "en"),  # too small
    ]), src / "part-00001.parquet")

    summary = convert_to_mds(src, out, min_aesthetic=5.0, languages=["en", "fr"], progress=False)

    assert summary.line() == ("converted 2 of 7 images: 256px 2, 512px 1; skipped 0 corrupt, 0 without caption, "
                              "1 empty caption, 1 too small, 0 too large, 3 filtered")
    small, large = read(out / "256"), read(out / "512")
    assert [s["caption"] for s in small] == ["a cat", "a fish"]
    assert [(s["caption"], s["image"].size) for s in large] == [("a fish", (512, 512))]
    assert small[1]["meta"] == {"aesthetic_score": 8.0, "language": "FR", "url": "https://example.com/0.jpg",
                                "source": "part-00001.parquet:0", "original_size": [600, 600]}


def test_parquet_raw_bytes_autodetect_and_column_errors(tmp_path):
    src = tmp_path / "shard.parquet"
    pq.write_table(pa.table({"jpg": [encoded(photo(256, 300))], "TEXT": ["a hill"], "key": ["000"]}), src)

    summary = convert_to_mds(src, tmp_path / "out", buckets=[256], limit=5, progress=False)
    (sample,) = read(tmp_path / "out" / "256")
    assert summary.written == {256: 1}
    assert (sample["caption"], sample["meta"]["key"], sample["meta"]["source"]) == ("a hill", "000", "shard.parquet:0")

    with pytest.raises(WorkbenchError, match="aesthetic"):
        convert_to_mds(src, tmp_path / "out2", min_aesthetic=5.0, progress=False)
    assert not (tmp_path / "out2").exists()  # failed before opening writers
    metadata = tmp_path / "metadata.parquet"  # LAION metadata: urls, no image bytes
    pq.write_table(pa.table({"URL": ["https://example.com/a.jpg"], "TEXT": ["a hill"]}), metadata)
    with pytest.raises(WorkbenchError, match="no image column.*URL, TEXT"):
        convert_to_mds(metadata, tmp_path / "out3", progress=False)


def test_saved_datasets_with_image_feature(tmp_path):
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string"),
                                  "score": datasets.Value("float32")})
    train = datasets.Dataset.from_dict({
        "image": [photo(520, 600, 1), {"bytes": b"not an image", "path": None}, photo(260, 260, 2)],
        "text": ["a red barn", "garbage", "a green field"],
        "score": [1.0, 2.0, 3.0],
    }, features=features)
    held_out = datasets.Dataset.from_dict({"image": [photo(300, 300, 3)], "text": ["a lake"], "score": [4.0]},
                                          features=features)
    datasets.DatasetDict({"train": train, "validation": held_out}).save_to_disk(str(tmp_path / "hf"))
    train.save_to_disk(str(tmp_path / "hf_train"))

    summary = convert_to_mds(tmp_path / "hf", tmp_path / "out", progress=False)

    assert (summary.written, summary.corrupt) == ({256: 2, 512: 1}, 1)
    small, large = read(tmp_path / "out" / "256"), read(tmp_path / "out" / "512")
    assert [(s["caption"], s["image"].size) for s in small] == [("a red barn", (256, 295)),
                                                                ("a green field", (256, 256))]
    assert [(s["caption"], s["image"].size) for s in large] == [("a red barn", (512, 591))]
    assert small[1]["meta"] == {"score": 3.0, "source": 2, "original_size": [260, 260]}

    validation = convert_to_mds(tmp_path / "hf", tmp_path / "val", split="validation", progress=False)
    assert validation.written == {256: 1, 512: 0}
    assert convert_to_mds(tmp_path / "hf_train", tmp_path / "plain", buckets=[512], progress=False).written == {512: 1}
    with pytest.raises(WorkbenchError, match="no split 'test'"):
        convert_to_mds(tmp_path / "hf", tmp_path / "x", split="test", progress=False)


def test_limit_and_transparency(tmp_path):
    clear = Image.new("RGBA", (300, 300), (255, 0, 0, 0))  # red, but fully transparent
    rows = [encoded(clear, "PNG")] + [encoded(photo(300, 300, i)) for i in range(3)]
    pq.write_table(pa.table({"png": rows, "prompt": ["clear", "one", "two", "three"]}), tmp_path / "rows.parquet")

    summary = convert_to_mds(tmp_path / "rows.parquet", tmp_path / "out", buckets=[256], limit=2, progress=False)

    assert (summary.seen, summary.written) == (2, {256: 2})
    first, _ = read(tmp_path / "out" / "256")
    assert first["caption"] == "clear" and first["image"].getpixel((128, 128)) == (255, 255, 255)


def test_missing_source_and_hub_failure(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere"
    with pytest.raises(WorkbenchError, match=str(missing)):
        convert_to_mds(missing, tmp_path / "out", progress=False)

    def offline(*args, **kwargs):
        raise ConnectionError("hub unreachable\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(WorkbenchError, match="someone/pictures does not exist locally .*hub.*hub unreachable\\)$"):
        convert_to_mds("someone/pictures", tmp_path / "out", progress=False)


def test_no_usable_images_and_existing_output(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "bad.jpg").write_bytes(b"\xff\xd8\xff garbage")
    (src / "bad.txt").write_text("a caption")
    photo(64, 64).save(src / "small.png")
    (src / "small.txt").write_text("a caption")
    with pytest.raises(WorkbenchError, match="no usable images in .*1 corrupt.*1 too small"):
        convert_to_mds(src, tmp_path / "out", progress=False)

    photo(256, 256).save(src / "ok.png")
    (src / "ok.txt").write_text("fine")
    first = convert_to_mds(src, tmp_path / "good", progress=False)
    again = convert_to_mds(src, tmp_path / "good", progress=False)  # the same command: the finished job's summary
    assert again == first and again.units_kept == 1 and first.units_kept == 0
    with pytest.raises(WorkbenchError, match="holds a conversion of other sources or options"):
        convert_to_mds(src, tmp_path / "good", buckets=[256], progress=False)
    with pytest.raises(WorkbenchError, match="already holds an MDS dataset"):  # written by something else
        convert_to_mds(src, tmp_path / "good" / "256", progress=False)
    with pytest.raises(WorkbenchError, match="without .json sidecars"):
        convert_to_mds(src, tmp_path / "filtered", languages=["en"], progress=False)


def flat_png(path, w: int, h: int, rgb=(200, 80, 40)) -> None:
    """A real w x h PNG of one colour, written row by row, never held whole in memory: 13000 x 13000 is
    2 MB on disk."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    z, row = zlib.compressobj(1), b"\x00" + bytes(rgb) * w  # filter byte 0, then the row's pixels
    pixels = b"".join(z.compress(row) for _ in range(h)) + z.flush()
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))


def _convert_measured(src, out, queue) -> None:
    """In a forked process: convert, then the growth of its peak resident memory (MiB) and the summary."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        line = convert_to_mds(src, out, buckets=[256], progress=False).line()
    except WorkbenchError as e:
        line = str(e)
    queue.put(((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024, line))


def test_a_huge_image_is_counted_and_skipped_before_decoding(tmp_path):
    """A 13000 x 13000 PNG (169 MP) decoded in full took 1.9 GB; its header alone says it is over the limit."""
    import multiprocessing

    src = tmp_path / "src"
    src.mkdir()
    flat_png(src / "huge.png", 13000, 13000)
    (src / "huge.txt").write_text("an orange wall")
    photo(300, 300).save(src / "ok.jpg")
    (src / "ok.txt").write_text("a photo")

    fork = multiprocessing.get_context("fork")  # a fresh peak, without a new interpreter's imports
    queue = fork.Queue()
    child = fork.Process(target=_convert_measured, args=(src, tmp_path / "out", queue))
    child.start()
    grown_mib, line = queue.get(timeout=120)
    child.join()
    assert grown_mib < 150, f"peak memory grew by {grown_mib:.0f} MiB"  # the decoded image alone is 484 MiB
    assert line == ("converted 1 of 2 images: 256px 1; skipped 0 corrupt, 0 without caption, 0 empty caption, "
                    "0 too small, 1 too large, 0 filtered")


def test_the_pixel_limit_counts_what_is_decoded_jpegs_after_draft(tmp_path, dwb):
    """9 MP over a 4 MP limit: the PNG is skipped; the JPEG decodes at a quarter of each side (0.56 MP)."""
    src = tmp_path / "src"
    src.mkdir()
    flat_png(src / "wide.png", 3000, 3000)
    (src / "wide.txt").write_text("a flat png")
    photo(3000, 3000).save(src / "cam.jpg", quality=90)
    (src / "cam.txt").write_text("a camera jpeg")

    r = dwb("data", "convert", str(src), str(tmp_path / "out"), "--buckets", "256", "--max-megapixels", "4")
    assert r.returncode == 0 and "converted 1 of 2 images: 256px 1;" in r.stdout and "1 too large" in r.stdout
    assert [s["caption"] for s in read(tmp_path / "out" / "256")] == ["a camera jpeg"]
    assert convert_to_mds(src, tmp_path / "default", buckets=[256], progress=False).written == {256: 2}  # 64 MP admits both
    r = dwb("data", "convert", str(src), str(tmp_path / "none"), "--max-megapixels", "0")
    assert r.returncode == 2 and "--max-megapixels: must be positive, got 0" in r.stderr
