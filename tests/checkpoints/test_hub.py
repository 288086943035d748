"""Hub ids: one rule for what is an id, labels as written, snapshots found offline in a cache laid out as
huggingface_hub lays it out (by branch, tag or commit), and a missing id offline in one line."""
from __future__ import annotations

import pytest

from models.checkpoints.hub import hub_label, is_hub_id, pipeline_files, resolve_hub
from models.errors import CheckpointError


@pytest.fixture
def offline_cache(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache.cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub_cache


@pytest.mark.parametrize("ref", [
    "stabilityai/stable-diffusion-2-base", "stabilityai/stable-diffusion-2-base@main", "org/name@v1.0",
    "org/name@refs/pr/1", "org/name@" + "0123456789abcdef" * 2 + "01234567", "Org_1/model.v2", "a/b",
])
def test_hub_ids(ref):
    assert is_hub_id(ref)
    assert hub_label(ref) == ref


@pytest.mark.parametrize("ref", [
    "name", "org/name/extra", "./org/name", "/org/name", "org//name", "org/na--me", "org/name..x", "org/-name",
    "org/name.", "org/name@", "org/name@-x", "org/name@a..b", "o rg/name", "org/name@main@v2", "",
    "runs/ep0-ba4-rank0.pt", "downloads/model.safetensors", "models/sd21.ckpt", "org/" + "n" * 96,
])
def test_not_hub_ids(ref):
    assert not is_hub_id(ref)
    with pytest.raises(CheckpointError):
        hub_label(ref)


def test_an_existing_local_path_is_never_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "phase1").mkdir(parents=True)
    assert not is_hub_id("runs/phase1")
    assert is_hub_id("runs/phase2")


def test_resolves_the_main_snapshot_offline(offline_cache):
    expected = offline_cache.main_snapshot
    assert resolve_hub(offline_cache.repo, allow_download=True) == expected  # HF_HUB_OFFLINE=1 wins
    assert resolve_hub(f"{offline_cache.repo}@main", allow_download=True) == expected
    assert resolve_hub(f"{offline_cache.repo}@{offline_cache.main}", allow_download=True) == expected


def test_resolves_a_branch_or_commit_with_downloads_off(hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache.cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert resolve_hub(f"{hub_cache.repo}@v2", allow_download=False) == hub_cache.other_snapshot
    assert resolve_hub(f"{hub_cache.repo}@{hub_cache.other}", allow_download=False) == hub_cache.other_snapshot


def test_hf_home_is_respected(hub_cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(hub_cache.cache.parent))  # the cache is HF_HOME/hub
    assert resolve_hub(hub_cache.repo, allow_download=False) == hub_cache.main_snapshot


def test_each_revision_is_its_snapshot_with_the_real_tokenizer(offline_cache, sd2_folder):
    """Through the cache's symlinks: main holds the reference pipeline's weights, branch v2 another UNet.
    (test_offline.py opens main as a pipeline and compares its image.)"""
    from transformers import CLIPTokenizer

    weights = "unet/diffusion_pytorch_model.safetensors"
    main = resolve_hub(offline_cache.repo, allow_download=False)
    v2 = resolve_hub(f"{offline_cache.repo}@v2", allow_download=False)
    assert (main / weights).is_symlink() and (main / weights).read_bytes() == (sd2_folder / weights).read_bytes()
    assert (v2 / weights).read_bytes() != (sd2_folder / weights).read_bytes()
    vae = "vae/diffusion_pytorch_model.safetensors"
    assert (v2 / vae).resolve() == (main / vae).resolve()  # an unchanged file is one blob for both revisions
    tokenizer = CLIPTokenizer.from_pretrained(main / "tokenizer")
    assert tokenizer("a photo of a cat").input_ids == [49406, 320, 1125, 539, 320, 2368, 49407]
    assert len(tokenizer) == 49408 and tokenizer.pad_token == "!"


@pytest.mark.parametrize("suffix", ["", "@v3"])
def test_missing_offline_is_one_line_naming_id_cache_and_remedy(offline_cache, suffix):
    ref = "stabilityai/stable-diffusion-2-base" if not suffix else offline_cache.repo + suffix
    with pytest.raises(CheckpointError) as excinfo:
        resolve_hub(ref, allow_download=True)
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith(ref + " ") and str(offline_cache.cache) in message
    assert "huggingface-cli download " + ref.split("@")[0] in message and "HF_HUB_OFFLINE" in message
    assert ("--revision v3" in message) == bool(suffix)


def test_a_cached_repository_that_is_not_a_pipeline_is_one_line(tmp_path, monkeypatch):
    from .fixtures import commit_hash, write_hub_snapshot

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    write_hub_snapshot(tmp_path / "hub", "org/text-model", model, commit_hash("x"), refs=("main",))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(CheckpointError, match="not a diffusers pipeline") as excinfo:
        resolve_hub("org/text-model", allow_download=False)
    assert "\n" not in str(excinfo.value)


def test_downloads_only_the_pipeline_files():
    """The file list of a pipeline repository as the hub lists it (SD 2.x layout, with its single-file
    checkpoints at the top level and fp16 variants beside the full weights)."""
    repo = [
        ".gitattributes", "README.md", "512-base-ema.ckpt", "512-base-ema.safetensors", "model_index.json",
        "feature_extractor/preprocessor_config.json", "scheduler/scheduler_config.json",
        "text_encoder/config.json", "text_encoder/model.safetensors", "text_encoder/model.fp16.safetensors",
        "text_encoder/pytorch_model.bin", "text_encoder/flax_model.msgpack",
        "tokenizer/merges.txt", "tokenizer/special_tokens_map.json", "tokenizer/tokenizer_config.json",
        "tokenizer/vocab.json",
        "unet/config.json", "unet/diffusion_pytorch_model.fp16.safetensors", "unet/diffusion_pytorch_model.bin",
        "vae/config.json", "vae/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.fp16.safetensors",
    ]
    assert pipeline_files(repo) == sorted([
        "model_index.json", "feature_extractor/preprocessor_config.json", "scheduler/scheduler_config.json",
        "text_encoder/config.json", "text_encoder/model.safetensors",
        "tokenizer/merges.txt", "tokenizer/special_tokens_map.json", "tokenizer/tokenizer_config.json",
        "tokenizer/vocab.json",
        "unet/config.json", "unet/diffusion_pytorch_model.fp16.safetensors",  # the UNet has only fp16 safetensors
        "vae/config.json", "vae/diffusion_pytorch_model.safetensors",
    ])
