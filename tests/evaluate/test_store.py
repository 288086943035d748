"""The results store survives a torn write; the reference cache key covers what the cache keeps."""
import csv
import json
import os

import pytest

from evaluate.scorers.features import InceptionExtractor
from evaluate.reference import reference_stats
from evaluate.store import ResultsStore
from models.errors import WorkbenchError

from ..conftest import file_size_limit
from .test_run import _image_folder


def test_a_torn_tail_is_set_aside_and_the_next_rows_are_kept(tmp_path):
    store = ResultsStore(tmp_path)
    store.append_rows([{"checkpoint": "a.pt", "guidance": 3.0}, {"checkpoint": "a.pt", "guidance": 5.0}])
    fragment = b'{"checkpoint": "b.pt", "guid'
    with open(store.path, "ab") as f:  # a crash in the middle of writing b's row
        f.write(fragment)
    store.append_rows([{"checkpoint": "c.pt", "guidance": 3.0}])
    assert [r["checkpoint"] for r in store.rows()] == ["a.pt", "a.pt", "c.pt"]  # c's row is not glued to the fragment
    assert (tmp_path / "results.torn").read_bytes() == fragment + b"\n"  # nothing thrown away
    assert store.path.read_bytes().endswith(b"\n")

    only_torn = ResultsStore(tmp_path / "other")
    only_torn.folder.mkdir()
    only_torn.path.write_bytes(b'{"checkpoint": "x')
    only_torn.append({"checkpoint": "y.pt"})
    assert only_torn.rows() == [{"checkpoint": "y.pt"}]


def test_a_checkpoints_rows_are_written_at_once(tmp_path, monkeypatch):
    writes = []
    real_write = os.write

    def counting_write(fd, data):  # the real write, counted
        writes.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)
    rows = [{"checkpoint": "a.pt", "guidance": g, "fid": 1.0} for g in (1.5, 3, 5, 8)]
    ResultsStore(tmp_path).append_rows(rows)
    assert len(writes) == 1
    assert [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()] == rows


@pytest.fixture(scope="module")
def extractor(inception_weights):
    return InceptionExtractor(inception_weights, dim=64)


def test_reference_cache_key_covers_the_kid_sample_size(extractor, tmp_path):
    folder = _image_folder(tmp_path, 12, 0)
    small = reference_stats(folder, extractor, 16, 12, tmp_path / "cache", kid_max=4, progress=False)
    large = reference_stats(folder, extractor, 16, 12, tmp_path / "cache", kid_max=10, progress=False)
    assert small.stats.features().shape[0] == 4
    assert not large.cached and large.key != small.key  # a cache with 4 kept features does not serve 10
    assert large.stats.features().shape[0] == 10
    assert reference_stats(folder, extractor, 16, 12, tmp_path / "cache", kid_max=10, progress=False).cached


def test_a_cache_of_fewer_images_is_refused_without_allow_fewer(extractor, tmp_path):
    folder = _image_folder(tmp_path, 5, 0)
    fewer = reference_stats(folder, extractor, 16, 8, tmp_path / "cache", allow_fewer=True, progress=False)
    assert fewer.stats.n == 5
    with pytest.raises(WorkbenchError, match="5 readable images, fewer than the 8 requested"):
        reference_stats(folder, extractor, 16, 8, tmp_path / "cache", progress=False)  # the same key, cached


def test_a_store_and_a_manifest_of_an_older_version_read_with_sampler(tmp_path):
    """Before the sampler had one name, rows and manifest lines said "scheduler": read as "sampler", beside new rows."""
    from evaluate.compare import rows_of
    from evaluate.samples import read_manifest

    older = {"model": "run/ep0-ba2-rank0", "checkpoint": "run/checkpoints/ep0-ba2-rank0.pt", "step": 2, "guidance": 5.0,
             "fid": 310.5, "n_images": 4, "prompts": "shapes", "scheduler": "DDIM", "steps": 2, "size": 16,
             "samples": "samples/run_ep0-ba2-rank0/cfg5-DDIM", "status": "ok", "categories": [
                 {"category": "one group", "n_prompts": 2, "n_images": 2}]}
    (tmp_path / "results.jsonl").write_text(json.dumps(older) + "\n")
    store = ResultsStore(tmp_path)
    newer = {k: v for k, v in older.items() if k != "scheduler"} | {"sampler": "DPM++ 2M", "samples": "samples/run_ep0-ba2-rank0/cfg5"}
    store.append_rows([newer])  # a row of this version after them
    rows = store.rows()
    assert [r["sampler"] for r in rows] == ["DDIM", "DPM++ 2M"] and not any("scheduler" in r for r in rows)
    assert set(rows_of(rows, "run/ep0-ba2-rank0")) == {(5.0, "DDIM"), (5.0, "DPM++ 2M")}  # two settings, not one
    store.export_csv()
    with open(tmp_path / "results.csv") as f:
        assert [r["sampler"] for r in csv.DictReader(f)] == ["DDIM", "DPM++ 2M"]
    with open(tmp_path / "categories.csv") as f:
        assert [r["sampler"] for r in csv.DictReader(f)] == ["DDIM", "DPM++ 2M"]
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(json.dumps({"prompt": "a red circle", "prompt_index": 0, "category": "one group",
                                    "image_index": 0, "seed": 1, "scheduler": "DDIM", "path": "images/00000-000.png"}) + "\n")
    assert read_manifest(manifest)[0]["sampler"] == "DDIM"


def _disk_full(call, folder) -> str:
    with pytest.raises(WorkbenchError) as refused:
        call()
    message = str(refused.value)
    assert message.startswith(f"the disk is full under {folder} (File too large); ") and "\n" not in message
    return message


def test_a_full_disk_is_one_line_and_leaves_every_result_file_whole_or_absent(extractor, tmp_path):
    """Each way evaluate writes results, past a file-size limit (EFBIG, as ENOSPC on a full disk)."""
    from PIL import Image

    from models.generation import ImageRecord, save_png

    out = tmp_path / "out"
    store = ResultsStore(out)
    store.append_rows([{"checkpoint": "a.pt", "guidance": 3.0, "error": "x" * 3000}])
    store.export_csv()
    kept = {p.name: p.read_bytes() for p in out.iterdir()}
    folder = _image_folder(tmp_path, 4, 0)
    record = ImageRecord("a red circle", "", "DDIM", 2, 3.0, 64, 64, 1, "a.pt", "0123456789ab", "ema")
    with file_size_limit(store.path.stat().st_size + 100):
        assert "results.jsonl rows (1) not written" in _disk_full(
            lambda: store.append_rows([{"checkpoint": "b.pt", "guidance": 3.0, "error": "y" * 3000}]), out)
        assert "results.csv not written" in _disk_full(store.export_csv, out)  # the old csv is kept
        _disk_full(lambda: reference_stats(folder, extractor, 16, 4, out / "cache", progress=False), out / "cache")
        noise = Image.effect_noise((64, 64), 60).convert("RGB")
        _disk_full(lambda: save_png(noise, out / "sample.png", record), out)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == kept  # nothing torn, nothing half-new
    assert list((out / "cache").iterdir()) == []
    assert [r["checkpoint"] for r in store.rows()] == ["a.pt"]
