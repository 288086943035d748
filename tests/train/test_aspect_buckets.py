"""`dwb data convert --aspect-buckets`: the bucket set, each image's bucket and crop, what is recorded, the
report, and images no bucket can take."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from streaming import StreamingDataset

import dwb
from models.datasets import ASPECT_COLUMNS, open_local
from models.generation import assign, bucket_set, nearest_bucket
from train.data.convert import ConvertSummary, convert_to_mds
from models.datasets.mds import open_streaming
from models.errors import WorkbenchError

SIZES = [(300, 150), (150, 300), (200, 200), (640, 480), (480, 640), (260, 100), (129, 131), (400, 220),
         (170, 340), (500, 260), (333, 333), (256, 512)]


def photo(w: int, h: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def image_folder(folder: Path, sizes) -> Path:
    folder.mkdir(parents=True)
    for i, (w, h) in enumerate(sizes):
        photo(w, h, i).save(folder / f"{i:03d}.png")  # PNG: lossless, so stored pixels compare exactly
        (folder / f"{i:03d}.txt").write_text(f"image {i}")
    return folder


def read(folder) -> list[dict]:
    ds = open_local(folder)
    return [ds[i] for i in range(len(ds))]


def log_gap(size, bucket) -> float:
    return abs(math.log(size[0] / size[1]) - math.log(bucket[0] / bucket[1]))


def buckets_by_definition(side: int, step: int, max_aspect: float) -> set[tuple[int, int]]:
    """Every (width, height) on the step's grid that the module's definition admits, found by trying them all: at
    most the budget's pixels, the shorter side as long as the budget allows (one step more would exceed it), and
    sides within ``max_aspect`` of each other."""
    grid = range(step, int(side * max_aspect) + step, step)
    return {(w, h) for w in grid for h in grid
            if w * h <= side * side < (w * (h + step) if w >= h else (w + step) * h)
            and max(w, h) <= max_aspect * min(w, h)}


@pytest.mark.parametrize("side,step,max_aspect", [(256, None, 2.0), (512, None, 2.0), (1024, None, 2.0),
                                                  (512, 32, 2.0), (128, 8, 2.0), (768, 64, 2.0), (512, 32, 4.0),
                                                  (64, 8, 4.0)])
def test_bucket_set_has_about_the_budget_in_multiples_of_the_step(side, step, max_aspect):
    buckets = bucket_set(side, step, max_aspect)
    step = step or (64 if side >= 512 else 32)
    assert (side, side) in buckets
    for w, h in buckets:
        assert w % step == 0 and h % step == 0
        assert side * side - step * max(w, h) < w * h <= side * side
        assert 1 / max_aspect <= w / h <= max_aspect
        assert (h, w) in buckets
    ratios = [w / h for w, h in buckets]
    assert ratios == sorted(ratios) and len(set(ratios)) == len(ratios)
    assert set(buckets) == buckets_by_definition(side, step, max_aspect)  # none missing, none extra


def test_max_aspect_bounds_the_set():
    assert bucket_set(512, 32, 1.0) == ((512, 512),)
    wide = bucket_set(512, 32, 4.0)
    assert max(w / h for w, h in wide) > 2 >= max(w / h for w, h in bucket_set(512, 32))
    assert all(1 / 4 <= w / h <= 4 for w, h in wide)


@pytest.mark.parametrize("size", SIZES + [(1, 10000), (10000, 1), (1000, 999)])
def test_nearest_bucket_is_nearest_in_log_space(size):
    buckets = bucket_set(256, 32)
    chosen = nearest_bucket(size, buckets)
    assert log_gap(size, chosen) == min(log_gap(size, b) for b in buckets)


def test_a_tie_goes_to_the_squarer_bucket():
    buckets = ((32, 128), (64, 64), (128, 32))
    assert nearest_bucket((200, 100), buckets) == (64, 64)  # 2:1 is halfway between 1:1 and 4:1 in log space
    assert nearest_bucket((100, 200), buckets) == (64, 64)


def test_options_are_refused_in_one_line():
    for step, sides, max_aspect in ((12, [256], 2.0), (0, [256], 2.0), (None, [200], 2.0), (32, [256], 0.5)):
        with pytest.raises(WorkbenchError) as e:
            convert_to_mds("nowhere", "nowhere-out", buckets=sides, aspect_buckets=True, bucket_step=step,
                           max_aspect=max_aspect, progress=False)
        assert "\n" not in str(e.value)
    with pytest.raises(WorkbenchError, match="--aspect-buckets"):
        convert_to_mds("nowhere", "nowhere-out", bucket_step=32, progress=False)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("aspect")
    src = image_folder(tmp / "src", SIZES)
    summary = convert_to_mds(src, tmp / "out", buckets=(128, 256), image_format="png", aspect_buckets=True,
                             workers=1, progress=False)
    return src, tmp / "out", summary


def expected_crop(original: Image.Image, bucket, left: int, top: int) -> Image.Image:
    """PIL's own resize of the source to cover the bucket at the least scale, cropped at the recorded corner."""
    scale = max(bucket[0] / original.width, bucket[1] / original.height)
    resized = (max(bucket[0], round(original.width * scale)), max(bucket[1], round(original.height * scale)))
    assert (left, top) == ((resized[0] - bucket[0]) // 2, (resized[1] - bucket[1]) // 2)  # centred
    return original.resize(resized, Image.Resampling.LANCZOS).crop((left, top, left + bucket[0], top + bucket[1]))


def test_each_image_is_stored_cropped_at_its_recorded_crop(converted):
    src, out, _ = converted
    for side in (128, 256):
        samples = read(out / str(side))
        assert samples
        for sample in samples:
            original = Image.open(src / sample["meta"]["source"]).convert("RGB")
            bucket = (sample["bucket_width"], sample["bucket_height"])
            assert (sample["original_width"], sample["original_height"]) == original.size
            assert sample["meta"]["original_size"] == list(original.size)
            assert bucket == nearest_bucket(original.size, bucket_set(side))
            assert sample["image"].size == bucket
            want = expected_crop(original, bucket, sample["crop_left"], sample["crop_top"])
            assert np.array_equal(np.asarray(sample["image"]), np.asarray(want))


def test_images_too_small_for_their_bucket_are_left_out_of_that_budget(converted):
    src, out, summary = converted
    sources = {side: {Path(s["meta"]["source"]).name for s in read(out / str(side))} for side in (128, 256)}
    for i, size in enumerate(SIZES):
        for side in (128, 256):
            covers = assign(size, bucket_set(side)) is not None
            assert (f"{i:03d}.png" in sources[side]) == covers
    assert summary.too_small == sum(all(assign(s, bucket_set(side)) is None for side in (128, 256)) for s in SIZES)


def test_the_report_counts_buckets_and_the_area_cropped(converted):
    src, out, summary = converted
    counted, resized, cropped = {}, 0, 0
    for side in (128, 256):
        for s in read(out / str(side)):
            key = f"{side}/{s['bucket_width']}x{s['bucket_height']}"
            counted[key] = counted.get(key, 0) + 1
            scale = max(s["bucket_width"] / s["original_width"], s["bucket_height"] / s["original_height"])
            area = (max(s["bucket_width"], round(s["original_width"] * scale))
                    * max(s["bucket_height"], round(s["original_height"] * scale)))
            resized, cropped = resized + area, cropped + area - s["bucket_width"] * s["bucket_height"]
    assert summary.buckets == counted
    assert (summary.resized_pixels, summary.cropped_pixels) == (resized, cropped)
    assert sum(counted.values()) == sum(summary.written.values())
    line = summary.line()
    assert f"cropped {100 * cropped / resized:.1f}% of the resized images' area" in line
    for key, n in counted.items():
        assert f"{key.split('/')[1]} {n}" in line
    recorded = ConvertSummary.from_json((out / ".convert" / "summary.json").read_bytes(), "summary.json")
    assert recorded.buckets == counted and recorded.cropped_pixels == cropped


def test_streaming_reads_every_column(converted, tmp_path):
    _, out, _ = converted
    ds = open_streaming(lambda: StreamingDataset(local=str(out / "256"), shuffle=False, batch_size=1))
    samples = [ds[i] for i in range(len(ds))]
    assert samples and all(set(s) == {"image", "caption", "meta", *ASPECT_COLUMNS} for s in samples)
    assert all(s["image"].size == (s["bucket_width"], s["bucket_height"]) for s in samples)
    index = json.loads((out / "256" / "index.json").read_text())
    assert set(index["shards"][0]["column_names"]) == {"image", "caption", "meta", *ASPECT_COLUMNS}


def test_the_same_command_again_prints_the_same_report_and_square_options_are_refused(converted):
    src, out, summary = converted
    again = convert_to_mds(src, out, buckets=(128, 256), image_format="png", aspect_buckets=True, workers=1,
                           progress=False)
    assert again.line() == summary.line()
    with pytest.raises(WorkbenchError, match="other sources or options"):
        convert_to_mds(src, out, buckets=(128, 256), image_format="png", workers=1, progress=False)


def test_square_conversion_plans_as_before(tmp_path):
    src = image_folder(tmp_path / "src", [(300, 200)])
    summary = convert_to_mds(src, tmp_path / "out", buckets=(128,), workers=1, progress=False)
    plan = json.loads((tmp_path / "out" / ".convert" / "plan.json").read_text())
    assert "aspect" not in plan["options"] and "aspect buckets" not in summary.line()
    assert set(read(tmp_path / "out" / "128")[0]) == {"image", "caption", "meta"}


def test_an_extreme_image_gets_the_extreme_bucket_or_is_counted_too_small(tmp_path, monkeypatch):
    """A 1 x 10000 px image covers its bucket only scaled up 96 times (96 x 960000 px, 276 MB): it is counted
    too small and never resized; a 64 x 10000 one goes to the tallest bucket, cropped. No resize is ever larger
    than its source."""
    src = image_folder(tmp_path / "src", [(1, 10000), (10000, 1), (64, 10000)])
    resizes = []
    real_resize = Image.Image.resize

    def recorded(self, size, *args, **kwargs):
        resizes.append((self.size, tuple(size)))
        return real_resize(self, size, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "resize", recorded)
    summary = convert_to_mds(src, tmp_path / "out", buckets=(64,), bucket_step=8, image_format="png",
                             aspect_buckets=True, workers=1, progress=False)
    assert summary.too_small == 2 and summary.written == {64: 1}
    tallest = bucket_set(64, 8)[0]
    assert summary.buckets == {f"64/{tallest[0]}x{tallest[1]}": 1}
    (sample,) = read(tmp_path / "out" / "64")
    assert (sample["bucket_width"], sample["bucket_height"]) == tallest and sample["crop_top"] > 0
    assert resizes and all(new[0] <= old[0] and new[1] <= old[1] for old, new in resizes)


def test_command_line(tmp_path, capsys):
    src = image_folder(tmp_path / "src", [(300, 150), (200, 200)])
    assert dwb.main(["data", "convert", str(src), str(tmp_path / "out"), "--buckets", "128", "--aspect-buckets",
                     "--bucket-step", "16", "--max-aspect", "2.5", "--workers", "1"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "aspect buckets: 128px" in line and "cropped" in line
    assert dwb.main(["data", "convert", str(src), str(tmp_path / "out2"), "--aspect-buckets", "--bucket-step",
                     "12"]) == 1
    assert capsys.readouterr().err.strip().count("\n") == 0
