"""`dwb data convert` on shards written by img2dataset's own writers and WebDataset's TarWriter: every
img2dataset layout, plain tars, S3, hostile members, workers, kill-and-resume, and parts joined."""
from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from streaming import LocalDataset

from train.data.convert import convert_to_mds, join_parts
from train.data.records import MAX_FILE_BYTES
from models.errors import WorkbenchError

from ..conftest import REPO, upload_folder
from .shard_writers import Row, jpeg, laion_rows, write_img2dataset

FILTERS = dict(min_aesthetic=5.5, languages=["en", "fr"], max_punsafe=0.2, max_watermark=0.8)


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return laion_rows(40)


@pytest.fixture(scope="module")
def img2dataset_out(rows, tmp_path_factory) -> Path:
    """The same rows in each of img2dataset's layouts: ROOT/webdataset, ROOT/files, ROOT/parquet."""
    root = tmp_path_factory.mktemp("img2dataset")
    for output_format in ("webdataset", "files", "parquet"):
        write_img2dataset(root / output_format, rows, output_format)
    return root


def samples(folder: Path) -> list[dict]:
    ds = LocalDataset(local=str(folder))
    return [ds[i] for i in range(ds.num_samples)]


def content(out: Path, side: int | str) -> list[tuple]:
    """What a bucket holds, in order: caption, meta and the stored image's bytes."""
    return [(s["caption"], sorted(s["meta"].items()), s["image"].tobytes()) for s in samples(out / str(side))]


def fitting(rows: list[Row], side: int) -> list[str]:
    from PIL import Image

    return [r.caption for r in rows if r.image is not None and min(Image.open(io.BytesIO(r.image)).size) >= side]


def expected_captions(rows: list[Row], side: int) -> list[str]:
    """The rows the recipe's filters keep whose shorter side fits ``side``, in source order."""
    from PIL import Image

    keep = []
    for r in rows:
        if r.image is None or min(Image.open(io.BytesIO(r.image)).size) < side:
            continue
        if (r.aesthetic >= FILTERS["min_aesthetic"] and r.language in FILTERS["languages"]
                and r.punsafe <= FILTERS["max_punsafe"] and r.pwatermark <= FILTERS["max_watermark"]):
            keep.append(r.caption)
    return keep


@pytest.mark.parametrize("layout", ["webdataset", "files", "parquet"])
def test_each_img2dataset_layout_converts_with_the_recipe_filters(layout, rows, img2dataset_out, tmp_path):
    summary = convert_to_mds(img2dataset_out / layout, tmp_path / "out", buckets=[256, 512], progress=False, **FILTERS)

    small = samples(tmp_path / "out" / "256")
    assert [s["caption"] for s in small] == expected_captions(rows, 256)
    assert [s["caption"] for s in samples(tmp_path / "out" / "512")] == expected_captions(rows, 512)
    assert summary.converted == len(small) > 0 and summary.filtered > 0
    by_caption = {r.caption: r for r in rows}
    for s in small:  # the metadata joined to the right sample: its sha256 is that of the image downloaded
        assert s["meta"]["sha256"] == hashlib.sha256(by_caption[s["caption"]].image).hexdigest()
        assert s["meta"]["punsafe"] <= 0.2 and "caption" not in s["meta"]
    failed = sum(r.image is None for r in rows)
    assert summary.no_image == (failed if layout == "parquet" else 0)  # tars and folders hold no failed rows
    assert summary.seen == len(rows) - (0 if layout == "parquet" else failed)


def test_tars_by_name_pattern_and_list_and_without_the_parquet_beside(rows, img2dataset_out, tmp_path):
    shards = img2dataset_out / "webdataset"
    whole = [s["caption"] for s in samples(_convert(shards, tmp_path / "folder") / "256")]
    assert whole == fitting(rows, 256)  # shard by shard, in key order: the rows' order
    first_two = [s["caption"] for s in samples(_convert(f"{shards}/{{00000..00001}}.tar", tmp_path / "braces") / "256")]
    convert_to_mds([shards / "00000.tar", shards / "00001.tar"], tmp_path / "list", buckets=[256], progress=False)
    assert [s["caption"] for s in samples(tmp_path / "list" / "256")] == first_two
    convert_to_mds(shards / "00002.tar", tmp_path / "one", buckets=[256], progress=False)  # a tar named directly
    rest = [s["caption"] for s in samples(_convert(f"{shards}/{{00002,00003}}.tar", tmp_path / "rest") / "256")]
    assert rest[: len(samples(tmp_path / "one" / "256"))] == [s["caption"] for s in samples(tmp_path / "one" / "256")]
    assert first_two + rest == whole and first_two and rest

    bare = tmp_path / "bare"  # tars alone: the .json members carry the same metadata
    bare.mkdir()
    for tar in shards.glob("*.tar"):
        (bare / tar.name).write_bytes(tar.read_bytes())
    assert content(_convert(bare, tmp_path / "bare-out", **FILTERS), 256) == \
        content(_convert(shards, tmp_path / "with-parquet", **FILTERS), 256)


def _convert(src, out: Path, **kwargs) -> Path:
    convert_to_mds(src, out, buckets=[256], progress=False, **kwargs)
    return out


def test_plain_webdataset_shards_join_metadata_by_key_from_the_parquet_beside(tmp_path):
    """Tars of jpg + txt only (WebDataset's TarWriter); the scores live in the Parquet beside, by key."""
    src = tmp_path / "shards"
    src.mkdir()
    with wds.TarWriter(str(src / "000.tar")) as sink:
        for i in range(4):
            sink.write({"__key__": f"s{i}", "jpg": jpeg(300, 300, i), "txt": f"sample {i}"})
    pq.write_table(pa.table({"key": ["s0", "s1", "s2", "s3"], "punsafe": [0.01, 0.9, 0.02, None]}), src / "000.parquet")

    summary = convert_to_mds(src, tmp_path / "out", buckets=[256], max_punsafe=0.1, progress=False)

    assert [s["caption"] for s in samples(tmp_path / "out" / "256")] == ["sample 0", "sample 2"]
    assert summary.filtered == 2  # 0.9, and the unknown score


def test_hostile_and_broken_tar_members_are_skipped_and_counted(tmp_path):
    src = tmp_path / "shards"
    src.mkdir()
    with wds.TarWriter(str(src / "a.tar")) as sink:
        sink.write({"__key__": "good", "jpg": jpeg(300, 300, 1), "txt": "a good one"})
        sink.write({"__key__": "corrupt", "jpg": os.urandom(3000), "txt": "random bytes"})
        sink.write({"__key__": "nocaption", "jpg": jpeg(300, 300, 2)})
        sink.write({"__key__": "also", "jpg": jpeg(300, 300, 3), "txt": "another good one"})
    with tarfile.open(src / "b.tar", "w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        add("../../escape.jpg", jpeg(300, 300, 4))  # a traversal name
        add("../../escape.txt", b"out of the folder")
        link = tarfile.TarInfo("link.jpg")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
        add("link.txt", b"a symlink")
        add("huge.jpg", b"\0" * (MAX_FILE_BYTES + 1))  # oversize: never read
        add("huge.txt", b"too big")
        add("fine.jpg", jpeg(300, 300, 5))
        add("fine.txt", b"fine after all that")
    with tarfile.open(src / "a.tar") as tar:
        last = tar.getmember("also.jpg")
    (src / "c.tar").write_bytes((src / "a.tar").read_bytes()[: last.offset_data + last.size // 2])  # cut in "also"

    summary = convert_to_mds(src, tmp_path / "out", buckets=[256], progress=False)

    assert [s["caption"] for s in samples(tmp_path / "out" / "256")] == [
        "a good one", "another good one", "fine after all that", "a good one"]
    assert (summary.corrupt, summary.no_caption, summary.truncated, summary.refused) == (2, 2, 1, 4)
    assert summary.no_image == 2  # the captions of the refused link and oversize images
    assert "1 tar shards cut short or unreadable; 4 files refused" in summary.line()


def test_a_folder_of_neither_layout_names_the_layouts_it_looked_for(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "notes.csv").write_text("url,caption\n")
    with pytest.raises(WorkbenchError, match="holds nothing conversion reads; looked for WebDataset tars.*files output"):
        convert_to_mds(tmp_path / "src", tmp_path / "out", progress=False)


def test_every_layout_on_s3_converts_as_the_local_one(s3_server, rows, img2dataset_out, tmp_path, monkeypatch):
    """img2dataset's three layouts, a tar pattern, a datasets save_to_disk folder (DatasetDict) and an image folder
    with .txt sidecars, read from the moto server: each writes what its local copy writes."""
    import datasets

    monkeypatch.setenv("DWB_CACHE", str(tmp_path / "cache"))
    saved = tmp_path / "saved"
    table = datasets.Dataset.from_dict({"image": [{"bytes": r.image, "path": None} for r in rows[:8] if r.image],
                                        "text": [r.caption for r in rows[:8] if r.image]},
                                       features=datasets.Features({"image": datasets.Image(),
                                                                   "text": datasets.Value("string")}))
    datasets.DatasetDict({"train": table}).save_to_disk(str(saved))
    folder = tmp_path / "folder" / "photos"
    folder.mkdir(parents=True)
    for k, r in enumerate(rows[:6]):
        if r.image:
            (folder / f"{k:03d}.jpg").write_bytes(r.image)
            (folder / f"{k:03d}.txt").write_text(r.caption)
    sources = {"webdataset": (img2dataset_out / "webdataset", FILTERS), "files": (img2dataset_out / "files", FILTERS),
               "parquet": (img2dataset_out / "parquet", FILTERS), "saved": (saved, {}), "folder": (folder.parent, {})}
    for name, (local, filters) in sources.items():
        remote = upload_folder(local, "laion", name)
        from_s3 = content(_convert(remote, tmp_path / f"s3-{name}", **filters), 256)
        assert from_s3 == content(_convert(local, tmp_path / f"local-{name}", **filters), 256) and from_s3, name
    pattern = content(_convert("s3://laion/webdataset/{00000..00003}.tar", tmp_path / "s3-braces", **FILTERS), 256)
    assert pattern == content(tmp_path / "s3-webdataset", 256)
    assert len(list((tmp_path / "cache" / "datasets").iterdir())) == 1  # the saved folder, copied once
    _convert("s3://laion/saved", tmp_path / "s3-saved-again")
    assert len(list((tmp_path / "cache" / "datasets").iterdir())) == 1


def test_s3_objects_that_would_escape_or_exhaust_are_refused(s3_server, rows, tmp_path, monkeypatch):
    import boto3

    monkeypatch.setenv("DWB_CACHE", str(tmp_path / "cache"))
    limit = 2 * max(len(r.image or b"") for r in rows[:4])
    monkeypatch.setattr("train.data.image_folders.MAX_FILE_BYTES", limit)
    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="hostile")
    for k, r in enumerate(rows[:4]):
        if r.image:
            s3.put_object(Bucket="hostile", Key=f"photos/{k}.jpg", Body=r.image)
            s3.put_object(Bucket="hostile", Key=f"photos/{k}.txt", Body=r.caption.encode())
    s3.put_object(Bucket="hostile", Key="photos/huge.jpg", Body=b"\xff\xd8" + b"\0" * limit)
    s3.put_object(Bucket="hostile", Key="photos/huge.txt", Body=b"too big to read")
    summary = convert_to_mds("s3://hostile/photos", tmp_path / "out", buckets=[256], progress=False)
    assert (summary.refused, summary.no_image, summary.converted) == (1, 1, len(fitting(rows[:4], 256)))

    for key in ("saved/state.json", "saved/../../escaped.arrow"):
        s3.put_object(Bucket="hostile", Key=key, Body=b"{}")
    with pytest.raises(WorkbenchError, match="refusing to copy the object '../../escaped.arrow'"):
        convert_to_mds("s3://hostile/saved", tmp_path / "out2", progress=False)
    assert not list(tmp_path.rglob("escaped.arrow"))


def test_two_workers_write_what_one_writes(img2dataset_out, tmp_path):
    one = convert_to_mds(img2dataset_out / "webdataset", tmp_path / "one", buckets=[256, 512], workers=1,
                         progress=False)
    two = convert_to_mds(img2dataset_out / "webdataset", tmp_path / "two", buckets=[256, 512], workers=2,
                         progress=False)
    assert one == two
    for side in (256, 512):
        assert content(tmp_path / "one", side) == content(tmp_path / "two", side)


def _part(src: Path, out: Path, i: int) -> None:
    convert_to_mds(src, out, buckets=[256, 512], workers=1, part=(i, 3), progress=False)


def test_three_parts_in_three_processes_joined_hold_the_one_part_run(img2dataset_out, tmp_path, dwb):
    src = img2dataset_out / "files"
    whole = convert_to_mds(src, tmp_path / "whole", buckets=[256, 512], progress=False)
    fork = multiprocessing.get_context("fork")
    parts = [fork.Process(target=_part, args=(src, tmp_path / "parts", i)) for i in range(2)]
    for p in parts:
        p.start()
    for p in parts:
        p.join()
    assert [p.exitcode for p in parts] == [0, 0]
    with pytest.raises(WorkbenchError, match="units are not converted yet"):
        join_parts(tmp_path / "parts")
    last = fork.Process(target=_part, args=(src, tmp_path / "parts", 2))
    last.start()
    last.join()

    r = dwb("data", "join", str(tmp_path / "parts"))

    assert r.returncode == 0 and r.stdout.strip() == whole.line()
    for side in (256, 512):
        assert content(tmp_path / "parts", side) == content(tmp_path / "whole", side)


@pytest.mark.slow  # two `dwb` processes, each importing Streaming (9 s of CPU): 98 s at load 11 on 2 shared cores
def test_a_killed_convert_run_again_writes_what_an_uninterrupted_one_writes(tmp_path):
    src = write_img2dataset(tmp_path / "src", laion_rows(48, seed=3), "webdataset", per_shard=4)
    convert_to_mds(src, tmp_path / "whole", buckets=[256, 512], progress=False)
    command = [sys.executable, str(REPO / "dwb.py"), "data", "convert", str(src), str(tmp_path / "out"),
               "--buckets", "256,512", "--workers", "2"]
    run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done = tmp_path / "out" / ".convert" / "done"
    while run.poll() is None and not (done.is_dir() and any(done.glob("*.json"))):
        time.sleep(0.01)
    helpers = psutil.Process(run.pid).children(recursive=True)  # the fork server and its workers
    run.send_signal(signal.SIGKILL)
    run.wait()
    assert run.returncode == -signal.SIGKILL, "finished before it could be killed"
    assert not (tmp_path / "out" / "256" / "index.json").exists()
    _, alive = psutil.wait_procs(helpers, timeout=20)  # they end with it, none left converting a unit
    assert len(helpers) >= 3 and not alive, alive

    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)

    assert again.returncode == 0, again.stderr[-2000:]
    assert "units kept from an earlier run" in again.stdout
    for side in (256, 512):
        assert content(tmp_path / "out", side) == content(tmp_path / "whole", side)


def _aspect_part(src: Path, out: Path, part: tuple[int, int] | None = None):
    return convert_to_mds(src, out, buckets=[128], aspect_buckets=True, workers=1, part=part, progress=False)


def _shard_files(index: Path) -> list[Path]:
    import json

    return [index.parent / s["raw_data"]["basename"] for s in json.loads(index.read_text())["shards"]]


def test_aspect_buckets_are_a_folder_each_under_a_budget_that_reads_as_one_dataset(img2dataset_out, tmp_path):
    """OUT/128/<WxH>/index.json per bucket and OUT/128/index.json over them name the same shard files; parts joined
    and a run resumed after losing a unit write what one run writes."""
    src = img2dataset_out / "webdataset"
    whole = _aspect_part(src, tmp_path / "whole")
    budget = tmp_path / "whole" / "128"
    buckets = sorted(p.name for p in budget.iterdir() if p.is_dir())
    assert buckets and set(buckets) == {key.split("/")[1] for key in whole.buckets}
    per_bucket = [f for b in buckets for f in _shard_files(budget / b / "index.json")]
    assert sorted(_shard_files(budget / "index.json")) == sorted(per_bucket)
    assert sorted(budget.rglob("shard.*.mds")) == sorted(per_bucket)  # none copied, none left out
    for b in buckets:
        rows = samples(budget / b)
        assert rows and {f"{r['bucket_width']}x{r['bucket_height']}" for r in rows} == {b}
    assert len(samples(budget)) == sum(whole.buckets.values())

    for i in range(3):
        _aspect_part(src, tmp_path / "parts", (i, 3))
    assert join_parts(tmp_path / "parts") == whole
    for left in (".convert/done/00001.json", ".convert/summary.json", "128/index.json"):
        (tmp_path / "parts" / left).unlink()  # what a run killed while converting unit 1 had not written
    assert _aspect_part(src, tmp_path / "parts").units_kept == 3
    for folder in ["", *buckets]:
        assert content(tmp_path / "parts" / "128", folder) == content(tmp_path / "whole" / "128", folder)


def test_a_bucket_unit_whose_index_leads_out_is_refused_before_the_merge(img2dataset_out, tmp_path):
    import json

    src = img2dataset_out / "webdataset"
    for i in range(2):
        _aspect_part(src, tmp_path / "parts", (i, 2))
    unit = next((tmp_path / "parts" / "128").glob("*x*/00000/index.json"))
    index = json.loads(unit.read_text())
    index["shards"][0]["raw_data"]["basename"] = "../../../elsewhere/shard.00000.mds"
    unit.write_text(json.dumps(index))
    with pytest.raises(WorkbenchError, match="lies outside the dataset folder"):
        join_parts(tmp_path / "parts")
    assert not (tmp_path / "parts" / "128" / "index.json").exists()
