"""The checkpoint door: Composer files under any name, fp16 diffusers folders, s3:// URIs, one generation path,
and hostile files that must neither write outside a private folder nor run code."""
import builtins
import json
import shutil

import numpy as np
import pytest
import torch

from train.checkpoints import (content_hash, find_checkpoint, list_checkpoints, load_pipeline,
                               select_resume_checkpoint)
from train.checkpoints.composer import checkpoint_problem
from train.errors import CheckpointError, WorkbenchError
from train.generation import Settings, generate_images

from ..conftest import REPO, tiny_overrides, upload_folder

PROMPT = "two red circles left of a blue square"
SETTINGS = Settings(steps=4, guidance=4.0, width=16, height=16, sampler="DPM++ 2M")


def image(pipe, seed: int = 5) -> np.ndarray:
    return generate_images(pipe, [PROMPT], [seed], SETTINGS)[0]


class Payload:
    """Unpickling it creates ``marker``: what a hostile pickle could do instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.open, (self.marker, "w")


def test_composer_checkpoints_under_any_name_are_found_by_their_contents(tiny_run, tmp_path):
    run = tmp_path / "my-run"
    run.mkdir()
    shutil.copy(tiny_run / "ep0-ba2-rank0.pt", run / "warmup.pt")
    shutil.copy(tiny_run / "ep0-ba4-rank0.pt", run / "final weights.pt")
    (run / "latest-rank0.pt").symlink_to("final weights.pt")
    (run / "notes.txt").write_text("not a checkpoint")
    found = list_checkpoints(run)
    assert [(c.path.name, c.kind, c.step) for c in found] == [("warmup.pt", "composer", 2),
                                                               ("final weights.pt", "composer", 4)]
    assert select_resume_checkpoint(run) == run / "final weights.pt"  # the newest by its timestamp, not its name
    latest = find_checkpoint(run / "latest-rank0.pt")
    assert (latest.kind, latest.step, latest.label) == ("composer", 4, "latest-rank0")
    for ema in (False, True):
        assert np.array_equal(image(load_pipeline(latest, ema=ema)),
                              image(load_pipeline(tiny_run / "ep0-ba4-rank0.pt", ema=ema)))
    assert not np.array_equal(image(load_pipeline(latest, ema=True)), image(load_pipeline(latest, ema=False)))


def test_a_diffusers_folder_with_fp16_variant_files_opens(tiny_run, tmp_path):
    pipe = load_pipeline(tiny_run / "ep0-ba4-rank0.pt", ema=True)
    pipe.to(torch.float16).save_pretrained(tmp_path / "fp16", variant="fp16")
    assert (tmp_path / "fp16" / "unet" / "diffusion_pytorch_model.fp16.safetensors").is_file()
    found = find_checkpoint(tmp_path / "fp16")
    assert found.kind == "diffusers"
    opened = load_pipeline(found)
    assert opened.unet.dtype == torch.float32  # read as fp16, run in the precision asked for
    same_weights = load_pipeline(tiny_run / "ep0-ba4-rank0.pt", ema=True).to(torch.float16).to(torch.float32)
    assert np.array_equal(image(opened), image(same_weights))


def test_one_generation_path_gives_the_same_image_in_the_grid_evaluate_and_the_app(tiny_run, tmp_path):
    from app.generate import GenerationParams
    from app.service import Service
    from evaluate.prompts import Prompt
    from evaluate.samples import Provenance, generate_samples, image_seed
    from PIL import Image
    from train.grid import generate

    ckpt = find_checkpoint(tiny_run / "ep0-ba4-rank0.pt")
    pipe = load_pipeline(ckpt, ema=True)
    seed = image_seed(0, 0, 0)
    source = Provenance(ckpt.ref, ckpt.label, content_hash(ckpt), "ema")
    records = generate_samples(pipe, [Prompt(PROMPT, "", 0)], tmp_path / "eval", source=source,
                               n_per_prompt=1, guidance=4.0, steps=4, size=16, sampler="DPM++ 2M", batch_size=1,
                               progress=False)
    assert records[0].seed == seed
    evaluated = np.asarray(Image.open(tmp_path / "eval" / records[0].path).convert("RGB"))
    grid = generate(pipe, [PROMPT], [seed], steps=4, guidance=4.0, size=16, sampler="DPM++ 2M")[0, 0]
    app = Service([tiny_run], cache_size=1).generate(
        "ep0-ba4-rank0.pt", "ema", GenerationParams(PROMPT, scheduler="DPM++ 2M", steps=4, guidance=4.0, width=16,
                                                    height=16, seed=seed))
    assert np.array_equal(evaluated, grid) and np.array_equal(grid, np.asarray(app.images[0]))
    assert app.records[0].checkpoint_hash == records[0].checkpoint_hash == content_hash(ckpt)
    assert app.records[0].seed == records[0].seed and app.records[0].sampler == records[0].scheduler


def test_s3_checkpoints_are_fetched_once_per_etag(s3_server, tiny_run, tmp_path, monkeypatch):
    monkeypatch.setenv("DWB_CACHE", str(tmp_path / "cache"))
    remote = upload_folder(tiny_run, "runs", "s3run/checkpoints")
    uri = f"{remote}/ep0-ba4-rank0.pt"
    first = find_checkpoint(uri)
    assert (first.kind, first.step, first.label) == ("composer", 4, "s3run/ep0-ba4-rank0")
    mtime = first.path.stat().st_mtime_ns
    again = find_checkpoint(uri)
    assert again.path == first.path and again.path.stat().st_mtime_ns == mtime  # not downloaded twice
    assert content_hash(first) == content_hash(find_checkpoint(tiny_run / "ep0-ba4-rank0.pt"))
    assert np.array_equal(image(load_pipeline(uri, ema=True)), image(load_pipeline(tiny_run / "ep0-ba4-rank0.pt",
                                                                                     ema=True)))
    listed = list_checkpoints("s3://runs/s3run")
    assert [(c.label, c.step) for c in listed] == [("s3run/ep0-ba2-rank0", 2), ("s3run/ep0-ba4-rank0", 4)]
    with pytest.raises(CheckpointError, match="checkpoint not found: s3://runs/s3run/checkpoints/nope.pt"):
        find_checkpoint("s3://runs/s3run/checkpoints/nope.pt")


def test_watch_scores_each_remote_checkpoint_once(s3_server, tiny_run, tmp_path, monkeypatch):
    import boto3

    from evaluate.store import ResultsStore
    from evaluate.watch import Watcher

    monkeypatch.setenv("DWB_CACHE", str(tmp_path / "cache"))
    upload_folder(tiny_run, "runs", "watched/checkpoints")
    store, scored = ResultsStore(tmp_path / "results"), []

    def score(ckpt):
        found = find_checkpoint(ckpt.ref)  # fetched here, as the evaluator does
        scored.append((found.label, found.step))
        store.append({"checkpoint": ckpt.ref, "status": "ok", "file_size": None, "file_mtime_ns": None})

    watcher = Watcher("s3://runs/watched", store, score, lambda c, e: pytest.fail(str(e)))
    assert [c.step for c in watcher.poll_once()] == [2, 4]
    assert watcher.poll_once() == []
    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.upload_file(str(tiny_run / "ep0-ba2-rank0.pt"), "runs", "watched/checkpoints/ep1-ba6-rank0.pt")
    assert [c.label for c in Watcher("s3://runs/watched", store, score, None).poll_once()] == ["watched/ep1-ba6-rank0"]
    assert scored == [("watched/ep0-ba2-rank0", 2), ("watched/ep0-ba4-rank0", 4), ("watched/ep1-ba6-rank0", 2)]


def test_an_s3_uri_without_credentials_is_one_line(tmp_path, monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(WorkbenchError, match="needs S3 credentials, and none were found"):
        find_checkpoint("s3://bucket/run/checkpoints/ep0-ba2-rank0.pt")


def test_a_file_of_another_kind_is_one_line(tmp_path):
    from PIL import Image

    png = tmp_path / "looks-like.pt"
    Image.new("RGB", (8, 8)).save(png, format="PNG")
    with pytest.raises(CheckpointError, match=r"cannot read checkpoint .*looks-like.pt: corrupt, not a PyTorch file"):
        load_pipeline(png)
    with pytest.raises(CheckpointError, match="checkpoint not found: .*missing.pt"):
        load_pipeline(tmp_path / "missing.pt")


# ---------------------------------------------------------------------------------------------
# Hostile files


def _rewrite(src, dst, edit) -> None:
    """A copy of a Composer checkpoint with ``edit(state)`` applied (the test's own file: unpickled whole)."""
    ckpt = torch.load(src, map_location="cpu", weights_only=False)
    edit(ckpt["state"])
    torch.save(ckpt, dst)


def test_a_spec_naming_tokenizer_files_outside_is_refused_and_writes_nothing(tiny_run, tmp_path):
    escape = f"../../{tmp_path.name}-escaped.pth"
    hostile = tmp_path / "hostile.pt"
    _rewrite(tiny_run / "ep0-ba2-rank0.pt", hostile,
             lambda s: s["callbacks"]["ModelSpec"]["spec"]["tokenizer"].update({escape: "import os"}))
    with pytest.raises(CheckpointError, match=r"tokenizer file named '\.\./\.\./.*escaped.pth'.*refused"):
        load_pipeline(hostile)
    import tempfile
    from pathlib import Path

    # where the name points from the private folder the tokenizer is written to (TMPDIR/dwb-tokenizer-*/)
    assert not (Path(tempfile.gettempdir()).parent / f"{tmp_path.name}-escaped.pth").exists()


@pytest.mark.parametrize("config, message", [
    ({"vocab_file": "/etc/passwd"}, "points vocab_file outside its folder"),
    ({"merges_file": "../../merges.txt"}, "points merges_file outside its folder"),
    ({"auto_map": {"AutoTokenizer": ["evil.Tokenizer", None]}}, "asks for custom code"),
])
def test_a_tokenizer_config_pointing_outside_or_at_code_is_refused(tiny_run, tmp_path, config, message):
    hostile = tmp_path / "hostile.pt"

    def edit(state):
        files = state["callbacks"]["ModelSpec"]["spec"]["tokenizer"]
        files["tokenizer_config.json"] = json.dumps({**json.loads(files["tokenizer_config.json"]), **config})

    _rewrite(tiny_run / "ep0-ba2-rank0.pt", hostile, edit)
    with pytest.raises(CheckpointError, match=message):
        load_pipeline(hostile)
    folder = tmp_path / "folder"
    load_pipeline(tiny_run / "ep0-ba2-rank0.pt").save_pretrained(folder)
    tok = folder / "tokenizer" / "tokenizer_config.json"
    tok.write_text(json.dumps({**json.loads(tok.read_text()), **config}))
    with pytest.raises(CheckpointError, match=message):
        load_pipeline(folder)


def test_a_model_index_naming_another_library_is_refused(tiny_run, tmp_path):
    folder = tmp_path / "folder"
    load_pipeline(tiny_run / "ep0-ba2-rank0.pt").save_pretrained(folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "unet": ["antigravity", "UNet"]}))
    with pytest.raises(CheckpointError, match=r"model_index.json names \['antigravity', 'UNet'\] for 'unet'"):
        load_pipeline(folder)


def test_a_pickle_payload_in_the_save_folder_is_set_aside_before_autoresume(tiny_run, shapes_data, components, tmp_path):
    from train.config import load_config
    from train.trainer import build_trainer

    marker = tmp_path / "payload-ran"
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for name in ("ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt"):
        shutil.copy(tiny_run / name, folder / name)
    _rewrite(tiny_run / "ep0-ba4-rank0.pt", folder / "ep0-ba6-rank0.pt",
             lambda s: s.update(timestamp={**s["timestamp"]}, extra=Payload(marker)))
    assert checkpoint_problem(folder / "ep0-ba6-rank0.pt") is None  # a whole file: only its pickle is hostile
    trainer = build_trainer(load_config(REPO / "configs/tiny-phase1.yaml", tiny_overrides(
        shapes_data, components, folder, max_duration="6ba", save_interval="2ba", autoresume="true")))
    assert int(trainer.state.timestamp.batch) == 4  # from ba4: ba6 was set aside
    assert (folder / "ep0-ba6-rank0.pt.corrupt").is_file() and not marker.exists()
    trainer.close()
    assert not marker.exists()


def test_a_pickle_column_in_an_mds_dataset_is_refused_by_name(components, tmp_path):
    from streaming import MDSWriter

    from train.config import load_config
    from train.trainer import build_trainer

    marker = tmp_path / "payload-ran"
    data = tmp_path / "data"
    from PIL import Image

    with MDSWriter(out=str(data), columns={"image": "png", "caption": "pkl", "meta": "json"}) as w:
        for i in range(16):
            w.write({"image": Image.new("RGB", (16, 16), (i * 10, 0, 0)), "caption": Payload(marker), "meta": {}})
    # training data: Streaming itself refuses unsafe types (allow_unsafe_types is never set); one line names it
    with pytest.raises(WorkbenchError, match=r"training data .*Column caption contains an unsafe type: pkl"):
        build_trainer(load_config(REPO / "configs/tiny-phase1.yaml",
                                  tiny_overrides(tmp_path, components, tmp_path / "ckpt", max_duration="2ba") +
                                  [f"data.path={data}"]))
    from evaluate.reference import count_images, iter_images

    assert count_images(data) == 16
    # reference sets, the scorer's and prepare's reads: LocalDataset has no such check; train.mds adds it
    with pytest.raises(WorkbenchError, match="column 'caption' is stored with pickle \\('pkl'\\), which runs code"):
        next(iter_images(data, 16))
    assert not marker.exists()
