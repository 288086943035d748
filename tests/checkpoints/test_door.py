"""The checkpoint door: Composer files under any name, fp16 diffusers folders, s3:// URIs, one generation path,
and hostile files that must neither write outside a private folder nor run code."""
import builtins
import json
import shutil

import numpy as np
import pytest
import torch

from models.checkpoints import (checkpoint_problem, content_hash, find_checkpoint, list_checkpoints, load_pipeline,
                                select_resume_checkpoint)
from models.errors import CheckpointError, WorkbenchError
from models.generation.images import Settings, generate_images

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
    from models.generation.grid import generate

    ckpt = find_checkpoint(tiny_run / "ep0-ba4-rank0.pt")
    pipe = load_pipeline(ckpt, ema=True)
    seed = image_seed(0, 0, 0)
    source = Provenance(ckpt.ref, ckpt.label, content_hash(ckpt), "ema")
    records = generate_samples(pipe, [Prompt(PROMPT, "", 0)], tmp_path / "eval", source=source,
                               n_per_prompt=1, guidance=4.0, steps=4, size=16, sampler="DPM++ 2M", batch_size=1,
                               progress=False)
    assert records[0].seed == seed
    evaluated = np.asarray(Image.open(tmp_path / "eval" / records[0].path).convert("RGB"))
    grid = generate(pipe, [PROMPT], [seed], SETTINGS)[0, 0]
    app = Service([tiny_run], cache_size=1).generate(
        "ep0-ba4-rank0.pt", "ema", GenerationParams(PROMPT, sampler="DPM++ 2M", steps=4, guidance=4.0, width=16,
                                                    height=16, seed=seed))
    assert np.array_equal(evaluated, grid) and np.array_equal(grid, np.asarray(app.images[0]))
    assert app.records[0].checkpoint_hash == records[0].checkpoint_hash == content_hash(ckpt)
    assert app.records[0].seed == records[0].seed and app.records[0].sampler == records[0].sampler


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
    # reference sets, the scorer's and prepare's reads: LocalDataset has no such check; models.datasets.mds adds it
    with pytest.raises(WorkbenchError, match="column 'caption' is stored with pickle \\('pkl'\\), which runs code"):
        next(iter_images(data, 16))
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# mosaicml/diffusion's Composer checkpoints, and the outside kinds through every command


def _mosaicml_parts():
    """A reduced SD2-shaped model as mosaicml/diffusion builds one: diffusers parts, SD2's conventions
    (64-channel heads, 32 norm groups, OpenCLIP's GELU, the VAE's 0.18215), the CLIP vocabulary."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(3)
    unet = UNet2DConditionModel(sample_size=8, block_out_channels=(64, 128), layers_per_block=1, cross_attention_dim=64,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), attention_head_dim=[1, 2],
                                use_linear_projection=True)
    vae = AutoencoderKL(block_out_channels=(32, 64, 64), layers_per_block=1, latent_channels=4, sample_size=32,
                        down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
                        scaling_factor=0.18215)
    text_encoder = CLIPTextModel(CLIPTextConfig(vocab_size=49408, hidden_size=64, intermediate_size=128,
                                                num_hidden_layers=2, num_attention_heads=1, max_position_embeddings=77,
                                                hidden_act="gelu"))
    with torch.no_grad():
        for module in (unet, vae, text_encoder):
            for p in module.parameters():
                p.add_(torch.randn_like(p) * 0.05)
    return unet, vae, text_encoder


@pytest.fixture(scope="module")
def mosaicml_checkpoint(tmp_path_factory):
    """A checkpoint written by Composer's Trainer around a ComposerModel whose parts are its ``unet``, ``vae`` and
    ``text_encoder`` attributes, as mosaicml/diffusion's StableDiffusion (no spec, no tokenizer inside)."""
    from composer import Trainer
    from composer.models import ComposerModel

    class StableDiffusion(ComposerModel):
        def __init__(self, unet, vae, text_encoder):
            super().__init__()
            self.unet, self.vae, self.text_encoder = unet, vae, text_encoder

        def forward(self, batch):
            return self.unet.conv_in(batch)

        def loss(self, outputs, batch):
            return outputs.mean()

    parts = _mosaicml_parts()
    out = tmp_path_factory.mktemp("mosaicml") / "ep0-ba1-rank0.pt"
    trainer = Trainer(model=StableDiffusion(*parts), max_duration="1ba", device="cpu", progress_bar=False,
                      log_to_console=False)
    trainer.save_checkpoint(str(out))
    trainer.close()
    return out, parts


def test_a_mosaicml_diffusion_checkpoint_opens_with_its_architecture_from_the_weights(mosaicml_checkpoint):
    from diffusers import StableDiffusionPipeline
    from transformers import CLIPTokenizer

    from models.checkpoints import describe
    from models.checkpoints.spec_from_weights import sd2_tokenizer_files
    from models.checkpoints import inference_scheduler

    path, (unet, vae, text_encoder) = mosaicml_checkpoint
    found = find_checkpoint(path)
    assert found.kind == "mosaicml"
    info = describe(found)
    assert (info.architecture, info.prediction_type, info.has_ema) == ("inferred", "epsilon", False)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        for name, text in sd2_tokenizer_files().items():
            (Path(tmp) / name).write_text(text)
        tokenizer = CLIPTokenizer.from_pretrained(tmp)
    reference = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                        scheduler=inference_scheduler("epsilon"), safety_checker=None,
                                        feature_extractor=None, requires_safety_checker=False)
    settings = Settings(steps=3, guidance=3.0, width=32, height=32, sampler="DDIM")
    ours = generate_images(load_pipeline(found), [PROMPT], [2], settings)
    assert np.array_equal(ours, generate_images(reference, [PROMPT], [2], settings))
    assert ours.std() > 1  # a picture, not a constant


def test_hub_ids_and_single_files_open_in_sample_evaluate_and_the_app(hub_cache, single_files, shapes_data,
                                                                      inception_weights, tmp_path, monkeypatch, dwb):
    from PIL import Image

    from app.generate import GenerationParams
    from app.service import Service

    from ..conftest import run_dwb

    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache.cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    single, same_weights = single_files["sd2"]
    reference = generate_images(load_pipeline(same_weights), [PROMPT], [9], Settings(steps=3, guidance=3.0))
    for ref in (hub_cache.repo, str(single)):
        found = find_checkpoint(ref)
        assert found.label == (hub_cache.repo if ref == hub_cache.repo else "sd2")
        assert np.array_equal(generate_images(load_pipeline(found), [PROMPT], [9], Settings(steps=3, guidance=3.0)),
                              reference)
        # the hub id offline in a process of its own (the hub library reads HF_HUB_OFFLINE once, on import)
        grid = (run_dwb if ref == hub_cache.repo else dwb)("sample", ref, str(tmp_path / "grid.png"), "--prompt",
                                                           PROMPT, "--seeds", "1", "--steps", "2")
        assert grid.returncode == 0, grid.stderr
        assert Image.open(tmp_path / "grid.png").size[0] > 96
    run = run_dwb("evaluate", "run", hub_cache.repo, str(single), "--out", str(tmp_path / "ev"), "--reference",
                  str(shapes_data / "eval/32"), "--inception-weights", str(inception_weights), "--inception-features",
                  "64", "--prompts", "shapes", "--n-prompts", "2", "--n-reference", "16", "--guidance", "3",
                  "--steps", "2", "--kid-subset-size", "2", "--kid-subsets", "2", "--device", "cpu")
    assert run.returncode == 0, run.stderr
    rows = [json.loads(line) for line in (tmp_path / "ev" / "results.jsonl").read_text().splitlines()]
    assert [r["model"] for r in rows] == [hub_cache.repo, "sd2"] and all(len(r["checkpoint_hash"]) == 12 for r in rows)
    roots = [single.parent]
    app = Service(roots, cache_size=1)
    assert {c.label for c in app.checkpoints()} >= {"sd2.safetensors", "sd2.ckpt", "sd1.safetensors"}
    made = app.generate("sd2.safetensors", "ema", GenerationParams(PROMPT, sampler="DPM++ 2M", steps=3, guidance=3.0,
                                                                   width=32, height=32, seed=9))
    assert np.array_equal(np.asarray(made.images[0]), reference[0])
    assert np.array_equal(np.asarray(app.generate(hub_cache.repo, "ema", GenerationParams(
        PROMPT, sampler="DPM++ 2M", steps=3, guidance=3.0, width=32, height=32, seed=9)).images[0]), reference[0])
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(WorkbenchError, match="nor a pipeline in the server's Hugging Face cache") as missing:
        app.open(hub_cache.repo)
    assert str(tmp_path) not in str(missing.value)  # the app names no server folder
