"""`dwb data convert` and `dwb data join` on sources built to read outside them, exhaust memory or stop a run:
links and paths out of the source, decompression and header bombs, a Parquet dictionary bomb, a brace pattern of
10^14 names, JSON nested 5,000 deep, a part that names shards outside its folder, a resumed run whose sources
changed. Memory is bounded in a forked process whose heap may grow by a fixed amount (RLIMIT_DATA): a reader
that expands the bomb meets MemoryError there instead of taking the machine."""
from __future__ import annotations

import io
import json
import multiprocessing
import os
import resource
import signal
import struct
import subprocess
import tarfile
import time
import zlib
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from streaming import LocalDataset

from train.data.convert import convert_to_mds, join_parts
from train.data.tables import _load_dataset as load_dataset
from models.errors import WorkbenchError

from ..conftest import DWB, REPO
from .shard_writers import jpeg

MiB = 2**20


def captions(folder: Path) -> list[str]:
    ds = LocalDataset(local=str(folder))
    return [ds[i]["caption"] for i in range(ds.num_samples)]


def heap_used() -> int:
    """This process's data segment (heap and anonymous mappings), what RLIMIT_DATA limits."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData:"))


def bounded(function, *args, heap: int = 512 * MiB, timeout: float = 120, **kwargs):
    """``function(*args, **kwargs)`` in a forked process whose heap may grow by ``heap`` bytes at most: its
    result, or ``"error: <type>: <first line>"``."""
    fork = multiprocessing.get_context("fork")  # a fresh limit, without a new interpreter's imports
    queue = fork.Queue()

    def run() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (heap_used() + heap, resource.RLIM_INFINITY))
        try:
            queue.put(function(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - the test reads what went wrong
            queue.put(f"error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")

    child = fork.Process(target=run)
    child.start()
    try:
        return queue.get(timeout=timeout)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()


def convert_line(src, out, **kwargs) -> str:
    return convert_to_mds(src, out, buckets=[256], workers=1, progress=False, **kwargs).line()


def good_tar(path: Path, captions_: list[str], seed: int = 0) -> Path:
    with wds.TarWriter(str(path)) as sink:
        for i, caption in enumerate(captions_):
            sink.write({"__key__": f"s{i}", "jpg": jpeg(300, 300, seed + i), "txt": caption})
    return path


def outside_image(tmp_path: Path) -> Path:
    """A real image outside every source folder, with a caption of its own that must never be converted."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "private.jpg").write_bytes(jpeg(400, 400, 99))
    return outside / "private.jpg"


# Links and paths out of the source

def test_a_caption_linked_to_proc_environ_never_reaches_the_dataset(tmp_path):
    """The command as a user runs it, with a secret in its environment: the linked caption and a linked image
    are counted as refused, and the secret is nowhere in what it writes or prints."""
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(jpeg(300, 300, 1))
    (src / "a.txt").symlink_to("/proc/self/environ")
    (src / "b.jpg").symlink_to(outside_image(tmp_path))
    (src / "b.txt").write_text("an image from elsewhere")
    (src / "c.jpg").write_bytes(jpeg(300, 300, 2))
    (src / "c.txt").write_text("a plain photo")

    run = subprocess.run([str(DWB), "data", "convert", str(src), str(tmp_path / "out"), "--buckets", "256",
                          "--workers", "1"], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "AWS_SECRET_ACCESS_KEY": secret})

    assert run.returncode == 0, run.stderr[-2000:]
    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert written and not [p.name for p in written if secret.encode() in p.read_bytes()]
    assert secret not in run.stdout + run.stderr
    assert "converted 1 of 3 images: 256px 1; skipped 0 corrupt, 1 without caption," in run.stdout
    assert "1 without image; 2 files refused" in run.stdout
    assert captions(tmp_path / "out" / "256") == ["a plain photo"]


def _write_layout(layout: str, src: Path, elsewhere: Path) -> None:
    """A source folder of ``layout`` holding one good sample and one file linked to ``elsewhere``'s copy."""
    elsewhere.mkdir()
    if layout == "tar":
        good_tar(src / "a.tar", ["inside"])
        (src / "b.tar").symlink_to(good_tar(elsewhere / "b.tar", ["from elsewhere"], seed=5))
    elif layout == "parquet":
        pq.write_table(pa.table({"jpg": [jpeg(300, 300, 1)], "txt": ["inside"]}), src / "a.parquet")
        pq.write_table(pa.table({"jpg": [jpeg(300, 300, 2)], "txt": ["from elsewhere"]}), elsewhere / "b.parquet")
        (src / "b.parquet").symlink_to(elsewhere / "b.parquet")
    elif layout == "files":  # img2dataset's files output: a sidecar and the metadata beside the folder linked
        (src / "00000").mkdir()
        (src / "00000" / "000.jpg").write_bytes(jpeg(300, 300, 1))
        (src / "00000" / "000.txt").write_text("inside")
        (src / "00000" / "001.jpg").write_bytes(jpeg(300, 300, 2))
        (elsewhere / "001.json").write_text(json.dumps({"caption": "from elsewhere"}))
        (src / "00000" / "001.json").symlink_to(elsewhere / "001.json")
        pq.write_table(pa.table({"key": ["000"], "note": ["from elsewhere"]}), elsewhere / "meta.parquet")
        (src / "00000.parquet").symlink_to(elsewhere / "meta.parquet")
    elif layout == "folder":  # a linked folder: never walked
        (src / "a.jpg").write_bytes(jpeg(300, 300, 1))
        (src / "a.txt").write_text("inside")
        (elsewhere / "b.jpg").write_bytes(jpeg(300, 300, 2))
        (elsewhere / "b.txt").write_text("from elsewhere")
        (src / "sub").symlink_to(elsewhere, target_is_directory=True)


@pytest.mark.parametrize("layout", ["tar", "parquet", "files", "folder"])
def test_links_are_refused_in_every_layout(layout, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _write_layout(layout, src, tmp_path / "elsewhere")

    summary = convert_to_mds(src, tmp_path / "out", buckets=[256], workers=1, progress=False)

    assert captions(tmp_path / "out" / "256") == ["inside"]
    assert summary.refused == {"tar": 1, "parquet": 1, "files": 2, "folder": 0}[layout]
    meta = LocalDataset(local=str(tmp_path / "out" / "256"))[0]["meta"]
    assert "from elsewhere" not in json.dumps(meta)


def test_table_cells_that_hold_a_path_are_refused(tmp_path):
    """An image column of {"bytes": null, "path": ...} structs, and one of plain strings: bytes only."""
    src, private = tmp_path / "src", str(outside_image(tmp_path))
    src.mkdir()
    struct_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    pq.write_table(pa.table({"image": pa.array([{"bytes": jpeg(300, 300, 1), "path": "a.jpg"},
                                                {"bytes": None, "path": private}], type=struct_type),
                             "caption": ["a cat", "read from a path"]}), src / "a.parquet")
    pq.write_table(pa.table({"image": [private], "caption": ["read from a string"]}), src / "b.parquet")

    summary = convert_to_mds(src, tmp_path / "out", buckets=[256], workers=1, progress=False)

    assert captions(tmp_path / "out" / "256") == ["a cat"]
    assert (summary.refused, summary.no_image) == (2, 2)


def _saved(path: Path, caption: str) -> Path:
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})
    datasets.Dataset.from_dict({"image": [{"bytes": jpeg(300, 300, len(caption)), "path": None}],
                                "text": [caption]}, features=features).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("how", ["state.json", "link", "dataset_dict.json"])
def test_a_saved_dataset_that_names_files_outside_it_is_refused(how, tmp_path):
    other = _saved(tmp_path / "other", "from another dataset")
    saved = _saved(tmp_path / "saved", "inside")
    if how == "state.json":
        state = json.loads((saved / "state.json").read_text())
        state["_data_files"] = [{"filename": "../other/data-00000-of-00001.arrow"}]
        (saved / "state.json").write_text(json.dumps(state))
        expected = "state.json: the data file '../other/data-00000-of-00001.arrow' leads out of its folder"
    elif how == "link":
        (saved / "data-00000-of-00001.arrow").unlink()
        (saved / "data-00000-of-00001.arrow").symlink_to(other / "data-00000-of-00001.arrow")
        expected = "data-00000-of-00001.arrow is a symbolic link"
    else:
        saved = tmp_path / "dict"
        datasets.DatasetDict({"train": datasets.load_from_disk(str(tmp_path / "saved"))}).save_to_disk(str(saved))
        (saved / "dataset_dict.json").write_text(json.dumps({"splits": ["../other"]}))
        expected = "the split '../other': ../other/state.json leads out of its folder"

    with pytest.raises(WorkbenchError, match=expected.replace(".", r"\.").replace("(", r"\(")) as refused:
        convert_to_mds(saved, tmp_path / "out", buckets=[256], progress=False,
                       split="../other" if how == "dataset_dict.json" else "train")

    assert "\n" not in str(refused.value) and not (tmp_path / "out").exists()


# Expansions bounded before they happen

def gzip_of(blocks: list[tuple[bytes, int]]) -> bytes:
    """A gzip stream of each block repeated its number of times, made without compressing the repetitions:
    after a full flush deflate forgets what came before, so one block's compressed bytes stand for every
    repetition. The trailer's CRC is left 0: a reader that stops at its limit never reaches it."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = b"".join((deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)) * times for block, times in blocks)
    size = sum(len(block) * times for block, times in blocks)
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + body + deflate.flush() + struct.pack("<II", 0, size % 2**32)


def header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(tarfile.GNU_FORMAT)


def member(name: str, data: bytes) -> bytes:
    return header(name, len(data)) + data + b"\0" * (-len(data) % 512)


END = b"\0" * 1024


def test_a_small_tar_gz_of_huge_members_is_stopped(tmp_path):
    """3.5 MiB of .tar.gz holding 58 members of 60 MiB, all of one sample: the shard is stopped, counted, and
    its sample keeps the one image read whole (and no caption: its text members came after the stop)."""
    src = tmp_path / "src"
    src.mkdir()
    good_tar(src / "a.tar", ["a good one"])
    extensions = ["jpg", "png", "webp", "jpeg", "bmp", "txt", "json"] + [f"{i}.npy" for i in range(51)]
    (src / "b.tar.gz").write_bytes(gzip_of([block for ext in extensions
                                            for block in ((header(f"bomb.{ext}", 60 * MiB), 1), (b"\0" * MiB, 60))]
                                           + [(END, 1)]))
    assert (src / "b.tar.gz").stat().st_size < 4 * MiB

    line = bounded(convert_line, src, tmp_path / "out")

    assert line.startswith("converted 1 of 2 images: 256px 1; skipped 0 corrupt, 1 without caption,"), line
    assert line.endswith("; 1 tar shards stopped (a header over 1 MiB, or gzip expanding over 100x)")


def test_a_sample_keeps_one_image_and_its_texts_however_many_members_share_its_key(tmp_path):
    """Forty 4 MiB members of one key in a plain tar (160 MiB): only the image and the captions are read."""
    src = tmp_path / "src"
    src.mkdir()
    with tarfile.open(src / "a.tar", "w") as tar:
        for name, data in [("s.jpg", jpeg(300, 300, 1)), ("s.txt", b"one sample")] + [
                (f"s.{i}.npy", b"\1" * 4 * MiB) for i in range(40)] + [("t.jpg", jpeg(300, 300, 2)),
                                                                       ("t.txt", b"x" * (2 * MiB))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

    line = bounded(convert_line, src, tmp_path / "out", heap=96 * MiB)

    assert line.startswith("converted 1 of 2 images: 256px 1; skipped 0 corrupt, 1 without caption,"), line
    assert line.endswith("; 1 files refused")  # the 2 MiB caption


@pytest.mark.parametrize("kind", ["GNU long name", "pax header", "GNU sparse"])
def test_a_tar_header_of_gigabytes_is_stopped_before_it_is_read(kind, tmp_path):
    """A 2.5 GiB long-name or pax header (tarfile reads one whole), and a GNU sparse member whose extension
    blocks never end: the shard stops at the header, counted; the samples before it are kept."""
    src = tmp_path / "src"
    src.mkdir()
    size = 2560 * MiB
    if kind == "GNU sparse":
        head = bytearray(header("sparse.jpg", 0, tarfile.GNUTYPE_SPARSE))
        head[482] = 1  # isextended: extension blocks follow
        head[148:156] = b" " * 8
        head[148:156] = b"%06o\0 " % sum(head)
        entry = b"%011o\0%011o\0" % (1, 1)
        hostile = [(bytes(head), 1), (entry * 21 + b"\1" + b"\0" * 7, size // 512)]
    else:
        kind_byte = tarfile.GNUTYPE_LONGNAME if kind == "GNU long name" else tarfile.XHDTYPE
        hostile = [(header("././@LongLink", size, kind_byte), 1), (b"a" * MiB, size // MiB)]
    first = member("first.jpg", jpeg(300, 300, 3)) + member("first.txt", b"read before the header")
    (src / "a.tar.gz").write_bytes(gzip_of([(first, 1), *hostile, (member("last.jpg", jpeg(300, 300, 4)), 1),
                                            (END, 1)]))

    line = bounded(convert_line, src, tmp_path / "out")

    assert line.startswith("converted 1 of 1 images: 256px 1;"), line
    assert line.endswith("; 1 tar shards stopped (a header over 1 MiB, or gzip expanding over 100x)")
    assert captions(tmp_path / "out" / "256") == ["read before the header"]


def _dictionary_bomb(path: Path, real: bytes) -> None:
    """150 rows whose image is one dictionary-encoded 10 MiB value, then one real row: the bomb takes about
    1 KiB on disk."""
    values = pa.array([b"\0" * (10 * MiB), real])
    image = pa.DictionaryArray.from_arrays(pa.array([0] * 150 + [1], pa.int32()), values)
    pq.write_table(pa.table({"image": image, "caption": ["a bomb"] * 150 + ["a real one"]}), path,
                   compression="zstd")


def test_a_parquet_dictionary_bomb_is_read_in_bounded_batches(tmp_path, dwb):
    src, real = tmp_path / "bomb.parquet", jpeg(300, 300, 1)
    _dictionary_bomb(src, real)
    assert src.stat().st_size < len(real) + 2048

    line = bounded(convert_line, src, tmp_path / "out")

    assert line.startswith("converted 1 of 151 images: 256px 1; skipped 150 corrupt,"), line
    r = dwb("data", "convert", str(src), str(tmp_path / "small"), "--buckets", "256", "--max-row-group-mib", "1")
    assert r.returncode == 1 and r.stderr.strip().endswith(
        "; 1 Parquet row groups over the size limit (--max-row-group-mib))")


def test_a_brace_pattern_of_10_to_the_14_names_is_refused_before_expanding(tmp_path):
    line = bounded(convert_line, f"{tmp_path}/SRC{{0..9999999}}{{0..9999999}}", tmp_path / "out")
    assert line == (f"error: WorkbenchError: {tmp_path}/SRC{{0..9999999}}{{0..9999999}}: expands to more than "
                    "1,000,000 names; split it into several patterns")


# JSON from outside

def test_json_nested_5000_deep_in_a_sidecar_is_counted_and_the_run_goes_on(tmp_path):
    deep = "[" * 5000 + '"' + "x" * 40_000 + '"' + "]" * 5000  # 50 KB
    src = tmp_path / "src"
    (src / "photos").mkdir(parents=True)
    (src / "photos" / "a.jpg").write_bytes(jpeg(300, 300, 1))
    (src / "photos" / "a.txt").write_text("a caption beside a deep json")
    (src / "photos" / "a.json").write_text(deep)
    (src / "photos" / "b.jpg").write_bytes(jpeg(300, 300, 2))
    (src / "photos" / "b.json").write_text(deep)
    shards = tmp_path / "shards"
    shards.mkdir()
    with wds.TarWriter(str(shards / "a.tar")) as sink:
        sink.write({"__key__": "s0", "jpg": jpeg(300, 300, 3), "txt": "a tar sample", "json": deep.encode()})
        sink.write({"__key__": "s1", "jpg": jpeg(300, 300, 4), "txt": "another", "json": b'{"year": 2020}'})

    folder = convert_to_mds(src, tmp_path / "out", buckets=[256], progress=False)
    tars = convert_to_mds(shards, tmp_path / "tars", buckets=[256], progress=False)

    assert (folder.converted, folder.no_caption, folder.bad_json) == (1, 1, 2)
    assert captions(tmp_path / "out" / "256") == ["a caption beside a deep json"]
    assert (tars.converted, tars.bad_json) == (2, 1)
    assert "2 .json sidecars refused (too large, too deep or not JSON)" in folder.line()
    assert convert_to_mds(src, tmp_path / "out", buckets=[256], progress=False) == folder  # a rerun works


# Parts joined, runs resumed

def _two_parts(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for k in range(2):
        good_tar(src / f"{k}.tar", [f"shard {k} sample {i}" for i in range(2)], seed=10 * k)
    for i in range(2):
        convert_to_mds(src, tmp_path / "out", buckets=[256], part=(i, 2), workers=1, progress=False)
    return tmp_path / "out"


def test_join_refuses_a_part_whose_index_names_shards_outside_it(tmp_path):
    out = _two_parts(tmp_path)
    (out / "x").mkdir()  # where ../../x/shard leads from the unit's folder
    index_file = out / "256" / "00001" / "index.json"
    index = json.loads(index_file.read_text())
    shard = index["shards"][0]["raw_data"]["basename"]
    (out / "256" / "00001" / shard).rename(out / "x" / "shard")
    index["shards"][0]["raw_data"]["basename"] = "../../x/shard"
    index_file.write_text(json.dumps(index))

    with pytest.raises(WorkbenchError, match=r"256/00001: shard \.\./\.\./x/shard lies outside the dataset folder"):
        join_parts(out)
    assert not (out / "256" / "index.json").exists()


@pytest.mark.parametrize("done", ['{"seen": 3}', '{"seen": 1, "written": {"256": "many"}}', "[" * 5000, "not json"])
def test_join_names_a_malformed_done_file_in_one_line(done, tmp_path, dwb):
    out = _two_parts(tmp_path)
    (out / ".convert" / "done" / "00001.json").write_text(done)

    r = dwb("data", "join", str(out))

    assert r.returncode == 1 and r.stderr.startswith(f"error: {out}/.convert/done/00001.json: ")
    assert len(r.stderr.strip().splitlines()) == 1 and not (out / "256" / "index.json").exists()


def _convert_slowly(src: Path, out: Path) -> None:
    convert_to_mds(src, out, buckets=[256], workers=1, progress=False)


def test_a_killed_run_resumed_after_its_sources_changed_is_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for k in range(6):
        good_tar(src / f"{k}.tar", [f"shard {k} sample {i}" for i in range(4)], seed=10 * k)
    fork = multiprocessing.get_context("fork")
    run = fork.Process(target=_convert_slowly, args=(src, tmp_path / "out"))
    run.start()
    done = tmp_path / "out" / ".convert" / "done"
    while run.is_alive() and not (done.is_dir() and any(done.glob("*.json"))):
        time.sleep(0.01)
    os.kill(run.pid, signal.SIGKILL)
    run.join()
    assert not (tmp_path / "out" / "256" / "index.json").exists(), "finished before it could be killed"
    for k in (3, 4):  # rewritten since: other samples under the same names
        good_tar(src / f"{k}.tar", [f"new shard {k} sample {i}" for i in range(5)], seed=100 + k)

    changed = rf"out: the source of unit 00003 \({src}/3.tar\) changed since this conversion began "
    with pytest.raises(WorkbenchError, match=changed + r".*fresh OUT, or delete .*out and run the command again"):
        convert_to_mds(src, tmp_path / "out", buckets=[256], workers=1, progress=False)
    assert not (tmp_path / "out" / "256" / "index.json").exists()


def test_a_part_run_after_an_object_was_replaced_on_s3_is_refused(s3_server, tmp_path, monkeypatch):
    """On S3 the ETag tells the change: a part run after one shard was uploaded again with other samples."""
    import boto3

    src = tmp_path / "src"
    src.mkdir()
    for k in range(2):
        good_tar(src / f"{k}.tar", [f"shard {k} sample {i}" for i in range(2)], seed=10 * k)
    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="changing")
    for k in range(2):
        s3.upload_file(str(src / f"{k}.tar"), "changing", f"shards/{k}.tar")
    convert_to_mds("s3://changing/shards", tmp_path / "out", buckets=[256], part=(0, 2), progress=False)
    s3.upload_file(str(good_tar(tmp_path / "new.tar", ["another sample"], seed=7)), "changing", "shards/1.tar")

    with pytest.raises(WorkbenchError, match=r"the source of unit 00001 \(s3://changing/shards/1.tar\) changed"):
        convert_to_mds("s3://changing/shards", tmp_path / "out", buckets=[256], part=(1, 2), progress=False)
    assert not (tmp_path / "out" / "256" / "00001").exists()


def test_a_hub_dataset_reads_image_paths_only_inside_the_hugging_face_caches(tmp_path, monkeypatch):
    """A hub dataset built from image files keeps paths into datasets' cache: those are read; a path a row
    of the hub's data names elsewhere is refused."""
    cache = tmp_path / "hf-cache"
    (cache / "downloads").mkdir(parents=True)
    (cache / "downloads" / "cat.jpg").write_bytes(jpeg(300, 300, 1))
    table = datasets.Dataset.from_dict(
        {"image": [str(cache / "downloads" / "cat.jpg"), str(outside_image(tmp_path))],
         "text": ["a cached cat", "read from elsewhere"]},
        features=datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")}))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets, "load_dataset", lambda src, split: table)
    load_dataset.cache_clear()  # a dataset opened once per process

    try:
        summary = convert_to_mds("someone/cached-pictures", tmp_path / "out", buckets=[256], workers=1,
                                 progress=False)
    finally:
        load_dataset.cache_clear()

    assert captions(tmp_path / "out" / "256") == ["a cached cat"]
    assert (summary.refused, summary.no_image) == (1, 1)
