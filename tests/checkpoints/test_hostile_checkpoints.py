"""Hostile checkpoints as users meet them: a zip member that inflates to gigabytes, JSON nested thousands deep in
a safetensors header, an export whose outputs are taken, text in a model card. Each is refused in one line (or
shown as text), with memory bounded and nothing half written."""
from __future__ import annotations

import json
import struct
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import pytest
import torch

from models.checkpoints import checkpoint_problem, read_summary
from models.readers.ziphead import DEFAULT_MAX_INFLATED_MB, MAX_INFLATED_ENV, zip_head
from models.errors import CheckpointError, WorkbenchError

from ..conftest import DWB, REPO, run_with_peak_memory

MiB = 1 << 20
LIMIT = DEFAULT_MAX_INFLATED_MB * MiB


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and len(message) < 500, message
    return message


# ---------------------------------------------------------------------------------------------
# Zip members that inflate past what they declare, or past the limit


def deflated(prefix: bytes, zero_mib: int) -> tuple[bytes, int, int]:
    """(raw deflate stream, CRC-32, inflated size) of ``prefix`` and ``zero_mib`` MiB of zeros, made without
    inflating them: one fully flushed block of 1 MiB of zeros repeated (each starts afresh, so copies chain)."""
    head = zlib.compressobj(9, zlib.DEFLATED, -15)
    stream = head.compress(prefix) + head.flush(zlib.Z_FULL_FLUSH)
    block = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = block.compress(bytes(MiB)) + block.flush(zlib.Z_FULL_FLUSH)
    crc, zeros = zlib.crc32(prefix), bytes(MiB)
    for _ in range(zero_mib):
        crc = zlib.crc32(zeros, crc)
    end = zlib.compressobj(9, zlib.DEFLATED, -15).flush()  # the final, empty block
    return stream + chunk * zero_mib + end, crc, len(prefix) + zero_mib * MiB


def with_pickle_replaced(src: Path, out: Path, raw: bytes, crc: int, central_size: int,
                         local_size: int | None = None) -> Path:
    """A copy of the zip checkpoint ``src`` whose ``data.pkl`` is the deflate stream ``raw``, declared in the
    central directory as ``central_size`` bytes inflated and in its local header as ``local_size`` (the same
    by default): every other member as PyTorch stored it."""
    local_size = central_size if local_size is None else local_size
    central = []
    with zipfile.ZipFile(src) as z, open(src, "rb") as f, open(out, "wb") as o:
        for info in z.infolist():
            f.seek(info.header_offset)
            n, m = struct.unpack_from("<HH", f.read(30), 26)
            f.seek(info.header_offset + 30 + n + m)
            data, method, c, sizes = f.read(info.compress_size), info.compress_type, info.CRC, (info.file_size,) * 2
            if info.filename.endswith("/data.pkl"):
                data, method, c, sizes = raw, zipfile.ZIP_DEFLATED, crc, (central_size, local_size)
            name, at = info.filename.encode(), o.tell()
            o.write(struct.pack("<4s5H3I2H", b"PK\x03\x04", 20, 0, method, 0, 0, c, len(data), sizes[1], len(name), 0)
                    + name + data)
            central.append(struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 20, 20, 0, method, 0, 0, c, len(data), sizes[0],
                                       len(name), 0, 0, 0, 0, 0, at) + name)
        start, directory = o.tell(), b"".join(central)
        o.write(directory + struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, len(central), len(central), len(directory),
                                        start, 0))
    return out


def _pickle_of(path: Path) -> bytes:
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


def test_dwb_sample_refuses_a_checkpoint_whose_pickle_inflates_to_3_gib_in_one_line(tiny_run, tmp_path):
    """A 3 MiB ep0-ba9-rank0.pt whose deflated data.pkl inflates to 3 GiB took `dwb sample` past 2 GiB in seconds
    (PyTorch's reader and zipfile allocate what the directory declares). It runs here with at most 1.5 GiB of data
    memory (RLIMIT_DATA: a 3 GiB allocation fails), as the console script users run."""
    source = tiny_run / "ep0-ba2-rank0.pt"
    raw, crc, size = deflated(_pickle_of(source), 3 * 1024)
    bomb = with_pickle_replaced(source, tmp_path / "ep0-ba9-rank0.pt", raw, crc, size)
    assert bomb.stat().st_size - source.stat().st_size < 4 * MiB and size > 3 * 1024 * MiB  # 3 MiB more on disk
    out = tmp_path / "grid.png"
    run, peak = run_with_peak_memory("prlimit", f"--data={3 * 1024 * MiB // 2}", str(DWB), "sample", str(bomb), str(out),
                                  "--steps", "1")
    assert run.returncode == 1, run.stderr
    [line] = run.stderr.splitlines()
    assert line.startswith("error: cannot read checkpoint ") and str(bomb) in line, line
    assert f"would inflate to at least {size:,} bytes" in line and f"over the limit of {LIMIT:,}" in line, line
    assert MAX_INFLATED_ENV in line and not out.exists()
    assert peak < 1536 * MiB, f"peak resident memory {peak / MiB:.0f} MiB"


@pytest.mark.parametrize("central, local, actual, words", [
    (MiB, MiB, 64 * MiB, "inflates past the 1,048,576 bytes its directory declares"),  # the directory lies
    (MiB, 3 * 1024 * MiB, MiB, "3,221,225,472 in its local header"),  # the local header says more
])
def test_a_lying_size_is_stopped_before_or_while_inflating(tiny_run, tmp_path, central, local, actual, words):
    source = tiny_run / "ep0-ba2-rank0.pt"
    raw, crc, _ = deflated(b"", actual // MiB)
    path = with_pickle_replaced(source, tmp_path / "lying.pt", raw, crc, central, local)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as excinfo:
            zip_head(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert words in _one_line(excinfo) and str(path) in str(excinfo.value)
    assert peak < central + 4 * MiB  # stopped at the size it declared, not at what it inflates to
    assert words in checkpoint_problem(path)  # autoresume sets it aside with the same reason, nothing inflated
    with pytest.raises(CheckpointError, match="inflate"):
        read_summary(path)


def test_the_inflation_limit_is_an_environment_setting(tiny_run, tmp_path, monkeypatch):
    """A checkpoint repacked with deflate (zipfile's, which PyTorch reads) opens under the default limit and is
    refused under a lower one; a limit that is no whole number of MiB is one line."""
    source = tiny_run / "ep0-ba2-rank0.pt"
    packed = tmp_path / "ep0-ba2-deflated.pt"
    with zipfile.ZipFile(source) as a, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as b:
        for info in a.infolist():
            b.writestr(info.filename, a.read(info.filename))
    inflated = sum(i.file_size for i in zipfile.ZipFile(packed).infolist())
    assert read_summary(packed)["kind"] == "composer"
    assert inflated > MiB
    monkeypatch.setenv(MAX_INFLATED_ENV, "1")
    with pytest.raises(CheckpointError, match=rf"over the limit of 1,048,576 \({MAX_INFLATED_ENV}=1\)"):
        zip_head(packed)
    monkeypatch.setenv(MAX_INFLATED_ENV, "lots")
    with pytest.raises(WorkbenchError, match=f"{MAX_INFLATED_ENV}='lots': expected a whole number of MiB"):
        zip_head(packed)


# ---------------------------------------------------------------------------------------------
# JSON nested 5,000 deep in a checkpoint's headers and configs

DEEP = "[" * 5000 + "]" * 5000
TOO_DEEP = "JSON nested deeper than 64 levels"


def _single_file_tensors() -> dict[str, torch.Tensor]:
    """The fewest tensors the door reads as an SD 2.x single file (its keys and the UNet's input channels)."""
    return {"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(8, 4, 3, 3),
            "first_stage_model.quant_conv.weight": torch.zeros(8, 8, 1, 1),
            "cond_stage_model.model.token_embedding.weight": torch.zeros(8, 4)}


def test_a_safetensors_header_or_spec_nested_5000_deep_is_one_line_and_left_out_of_listings(tmp_path):
    """Both raised RecursionError, which no handler caught: the listing (the app's start) failed on the header,
    describing the checkpoint on the spec."""
    from safetensors.torch import save_file

    from models.checkpoints import describe, discover, find_checkpoint
    from models.checkpoints.single_file import describe_single_file

    header = b'{"__metadata__": {"format": "pt"}, "x": ' + DEEP.encode() + b"}"
    deep = tmp_path / "deep-header.safetensors"
    deep.write_bytes(len(header).to_bytes(8, "little") + header)
    spec = tmp_path / "deep-spec.safetensors"
    save_file(_single_file_tensors(), str(spec), metadata={"format": "pt", "dwb.spec": DEEP})
    good = tmp_path / "good.safetensors"
    save_file(_single_file_tensors(), str(good))
    assert [c.label for c in discover([tmp_path])] == ["deep-spec.safetensors", "good.safetensors"]
    with pytest.raises(CheckpointError) as excinfo:
        find_checkpoint(deep)
    assert _one_line(excinfo) == f"cannot read {deep}: its safetensors header: {TOO_DEEP}"
    with pytest.raises(CheckpointError) as excinfo:
        describe(find_checkpoint(spec))
    assert _one_line(excinfo) == f"cannot read {spec}'s metadata: its dwb.spec metadata: {TOO_DEEP}"
    assert describe_single_file(good)["architecture"] == "sd2-base"


@pytest.mark.parametrize("deep_file, words", [
    ("model_index.json", f"model_index.json: {TOO_DEEP}"),
    ("tokenizer/tokenizer_config.json", f"tokenizer/tokenizer_config.json: {TOO_DEEP}"),
    ("unet/config.json", f"unet/config.json: {TOO_DEEP}"),
])
def test_a_diffusers_folder_config_nested_5000_deep_is_one_line(tmp_path, deep_file, words):
    from models.checkpoints import describe, find_checkpoint, load_pipeline

    folder = tmp_path / "pipeline"
    configs = {"model_index.json": {"_class_name": "StableDiffusionPipeline",
                                    "unet": ["diffusers", "UNet2DConditionModel"]},
               "unet/config.json": {"sample_size": 8}, "vae/config.json": {"block_out_channels": [32, 64]},
               "scheduler/scheduler_config.json": {"prediction_type": "epsilon"},
               "tokenizer/tokenizer_config.json": {}}
    for name, value in configs.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(DEEP if name == deep_file else json.dumps(value))
    ckpt = find_checkpoint(folder)
    with pytest.raises(CheckpointError) as excinfo:
        describe(ckpt) if deep_file == "unet/config.json" else load_pipeline(ckpt)
    assert _one_line(excinfo).endswith(words)


def test_a_spec_tokenizer_config_nested_5000_deep_is_one_line():
    from models.readers.tokenizer_files import tokenizer_from_files

    with pytest.raises(CheckpointError) as excinfo:
        tokenizer_from_files({"tokenizer_config.json": DEEP, "vocab.json": "{}"}, where="ckpt.pt")
    assert _one_line(excinfo) == f"ckpt.pt: its tokenizer_config.json: {TOO_DEEP}"


# ---------------------------------------------------------------------------------------------
# `dwb export`: whole or nothing, and a model card that shows its text as text


def _left_in(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_an_export_whose_config_folder_is_a_dangling_link_writes_nothing(tiny_run, tmp_path, dwb):
    """``NAME.config`` a dangling symlink: the export wrote NAME.safetensors and NAME.yaml, then failed on the
    folder and left them. Every output is checked before anything is written."""
    (tmp_path / "model.config").symlink_to(tmp_path / "nowhere")
    run = dwb("export", str(tiny_run / "ep0-ba2-rank0.pt"), str(tmp_path / "model.safetensors"))
    assert run.returncode == 1, run.stderr
    assert run.stderr.strip() == (f"error: {tmp_path / 'model.config'} exists (a link): remove it or choose another "
                                  "name")
    assert _left_in(tmp_path) == {"model.config"} and (tmp_path / "model.config").is_symlink()


def test_an_export_that_fails_partway_leaves_nothing(tiny_run, tmp_path, monkeypatch):
    """The weights and the original config written, the config folder failing: all three or none are placed."""
    import models.checkpoints
    from models.export import export_single_file

    def fails(*args, **kwargs):
        raise OSError("the config folder cannot be written")

    monkeypatch.setattr(models.checkpoints, "write_spec_folder", fails)  # the door's name the export calls
    with pytest.raises(OSError, match="the config folder cannot be written"):
        export_single_file(tiny_run / "ep0-ba2-rank0.pt", tmp_path / "model.safetensors")
    assert _left_in(tmp_path) == set()


HOSTILE = "<script>alert(1)</script>\n# Injected heading\n<iframe src=http://attacker.invalid></iframe> | x"


def test_html_and_line_breaks_in_labels_rows_and_studies_are_text_on_the_model_card(tiny_run, tmp_path, dwb):
    """A checkpoint label, a results row's fields and a study's names went into the exported README raw: a
    ``<script>``, an ``<iframe>`` and headings of their own."""
    from html import unescape

    from huggingface_hub import ModelCard
    from markdown_it import MarkdownIt

    from models.checkpoints import content_hash, find_checkpoint

    named = tmp_path / "<b>run\n# heading<script>x<" / "checkpoints"  # the label: "<b>run\n# heading...<ba2"
    named.mkdir(parents=True)
    ckpt = named / "ep0-ba2-rank0.pt"
    ckpt.write_bytes((tiny_run / "ep0-ba2-rank0.pt").read_bytes())
    digest = content_hash(find_checkpoint(ckpt))
    (tmp_path / "results").mkdir()
    row = dict(checkpoint_hash=digest, status="ok", guidance=HOSTILE, sampler=HOSTILE, steps=HOSTILE,
               n_images=HOSTILE, fid=41.2, fid_lo=38.0, fid_hi=44.6)
    (tmp_path / "results" / "results.jsonl").write_text(json.dumps(row) + "\n" + DEEP + "\n")
    report = tmp_path / "study" / "report"
    report.mkdir(parents=True)
    (report / "results.json").write_text(json.dumps({
        "study": HOSTILE, "model_info": {"ours": {"checkpoint_hash": digest}},
        "comparisons": [{"question": HOSTILE, "model_a": "ours", "model_b": HOSTILE, "rate_a": 0.75,
                         "clustered_wilson": [0.6, 0.86], "votes": HOSTILE, "ties": 0}]}))
    out = tmp_path / "export"
    run = dwb("export", str(ckpt), str(out), "--results", str(tmp_path / "results"), "--study", str(tmp_path / "study"))
    assert run.returncode == 0, run.stderr
    text = (out / "README.md").read_text()
    rendered = MarkdownIt("commonmark").enable(["table"]).render(text.split("---", 2)[2])
    assert "<script" not in rendered and "<iframe" not in rendered and "<b>" not in rendered
    headings = [line for line in rendered.splitlines() if line.startswith("<h")]
    assert headings == ["<h1>&lt;b&gt;run # heading&lt;script&gt;x&lt;/ep0-ba2-rank0</h1>", "<h2>Model</h2>",
                        "<h2>Training</h2>", "<h2>Evaluation</h2>"], headings
    assert "&lt;script&gt;alert(1)&lt;/script&gt; # Injected heading" in rendered  # shown, as text, on one line
    assert unescape(rendered).count("<iframe src=http://attacker.invalid></iframe> | x") == 8  # 4 row, 4 study cells
    card = ModelCard.load(out / "README.md")
    assert (card.data.library_name, card.data.pipeline_tag) == ("diffusers", "text-to-image")
    scores_head, scores_row, wins_head, wins_row = [line for line in text.splitlines() if line.startswith("| ")]
    assert scores_row.count(" | ") == scores_head.count(" | ") and wins_row.count(" | ") == wins_head.count(" | ")
