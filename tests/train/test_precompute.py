"""`dwb data precompute`: stored latents decode to the image, train like on-the-fly encoding, refuse other encoders."""
import json
import shutil

import numpy as np
import pytest
import torch
from streaming import LocalDataset

from models.checkpoints.components import load_frozen_parts
from train.config import DataConfig, load_config
from train.data.loader import build_dataloader, crop_to_array, latent_meta, other_phrasing, to_model_range
from models.errors import WorkbenchError
from train.data.latents import META, decode_array
from models.checkpoints.hashing import fingerprint
from train.data.precompute import precompute_latents
from train.trainer import attach_latents, build_model, train

from ..conftest import REPO, tiny_overrides
from .conftest import assert_trains_alike

PHASE1 = REPO / "configs/tiny-phase1.yaml"


@pytest.fixture(scope="module")
def latents(shapes_data, components, tmp_path_factory):
    out = tmp_path_factory.mktemp("latents")
    for dtype in ("float16", "float32"):
        precompute_latents(str(shapes_data), str(out / dtype), vae_ref=str(components), text_encoder_ref=str(components),
                   tokenizer_ref=str(components), batch_size=16, dtype=dtype, chunk_size=50, progress=False)
    return out


def _source(shapes_data, side, n):
    ds = LocalDataset(local=str(shapes_data / str(side)))
    return [ds[i] for i in range(n)]


def _stored(folder, n):
    ds = LocalDataset(local=str(folder))
    return [ds[i] for i in range(n)]


def test_layout_metadata_and_order(latents, shapes_data, components):
    vae, text_encoder, _ = load_frozen_parts(str(components))
    for side in (16, 32):
        meta = json.loads((latents / "float16" / str(side) / META).read_text())
        assert meta["complete"] and meta["samples"] == 192 and meta["resolution"] == side
        assert meta["scaling_factor"] == vae.config.scaling_factor
        assert meta["vae"]["fingerprint"] == fingerprint(vae)
        assert meta["text_encoder"]["fingerprint"] == fingerprint(text_encoder)
        assert meta["latent_shape"] == [4, side // 4, side // 4]
    # Four chunks of 50, merged in order: sample i of the output is sample i of the source.
    src = _source(shapes_data, 16, 192)
    out = _stored(latents / "float16" / "16", 192)
    assert [s["caption"] for s in src] == [s["caption"] for s in out]
    assert out[0]["latent_mean"].dtype == np.float16 and out[0]["text"].shape == (20, 64)


def test_stored_latents_decode_to_the_image_within_the_vae_error(latents, shapes_data, components):
    vae, _, _ = load_frozen_parts(str(components))
    src = _source(shapes_data, 32, 16)
    images = to_model_range(np.stack([crop_to_array(s["image"], 32) for s in src]))
    stored = torch.from_numpy(np.stack([s["latent_mean"] for s in _stored(latents / "float16" / "32", 16)])).float()
    sf = vae.config.scaling_factor
    with torch.no_grad():
        direct = vae.decode(vae.encode(images).latent_dist.mean).sample  # the VAE's own reconstruction
        from_store = vae.decode(stored / sf).sample  # the scaling factor was applied exactly once
    vae_err = (direct - images).pow(2).mean().item()
    store_err = (from_store - images).pow(2).mean().item()
    assert store_err <= vae_err * 1.02 + 1e-6  # fp16 storage adds nothing visible to the VAE's own error
    assert (from_store - direct).abs().max().item() < 0.05


@pytest.mark.parametrize("dtype,rtol", [("float32", 1e-5), ("float16", 2e-2)])
def test_precomputed_training_loss_equals_on_the_fly(latents, shapes_data, components, dtype, rtol):
    """Same batch, same RNG state: the precomputed path gives the on-the-fly loss (fp16 within its rounding)."""
    cfg = load_config(PHASE1, [f"model.pretrained={components}", f"data.path={latents / dtype / '32'}",
                               "data.precomputed=true", "data.resolution=32", "model.caption_dropout=0.5",
                               "model.other_phrasing=0.5"])
    model = build_model(cfg)
    attach_latents(cfg, model)
    model.train()
    n = 8
    src = _source(shapes_data, 32, n)
    tokens = lambda captions: model.tokenizer(captions, padding="max_length", truncation=True,  # noqa: E731
                                              max_length=model.tokenizer.model_max_length, return_tensors="pt").input_ids
    raw = {"image": to_model_range(np.stack([crop_to_array(s["image"], 32) for s in src])),
           "input_ids": tokens([s["caption"] for s in src]), "input_ids_alt": tokens([other_phrasing(s) for s in src])}
    stored = _stored(latents / dtype / "32", n)
    pre = {k: torch.from_numpy(np.stack([s[k] for s in stored])) for k in ("latent_mean", "latent_std", "text", "text_alt")}
    losses = []
    for batch in (raw, pre):
        torch.manual_seed(123)
        losses.append(model.loss(model(batch), batch).item())
    assert losses[1] == pytest.approx(losses[0], rel=rtol)
    torch.manual_seed(124)  # another draw gives another loss: the comparison is not vacuous
    assert model.loss(model(pre), pre).item() != pytest.approx(losses[1], rel=1e-6)


def test_other_phrasing_is_stored_and_drawn_at_every_step(latents, shapes_data, components):
    """``text_alt`` holds the states of each caption said the other way round; training swaps it in at the set rate."""
    vae, text_encoder, tokenizer = load_frozen_parts(str(components))
    src = _source(shapes_data, 32, 64)
    stored = _stored(latents / "float32" / "32", 64)
    alts = [other_phrasing(s) for s in src]
    assert sum(a != s["caption"] for a, s in zip(alts, src)) > 10  # two-group scenes have another phrasing
    for s, alt in zip(src, alts):
        assert alt in s["meta"]["captions"]
    ids = tokenizer(alts, padding="max_length", truncation=True, max_length=tokenizer.model_max_length,
                    return_tensors="pt").input_ids
    with torch.no_grad():
        expected = text_encoder(ids)[0]
    got = torch.from_numpy(np.stack([s["text_alt"] for s in stored]))
    assert torch.allclose(got, expected, atol=1e-5)
    same = [i for i, s in enumerate(src) if alts[i] == s["caption"]]  # one-group scenes: alt is the caption
    assert torch.equal(got[same], torch.from_numpy(np.stack([stored[i]["text"] for i in same])))

    cfg = load_config(PHASE1, [f"model.pretrained={components}", f"data.path={latents / 'float32' / '32'}",
                               "data.precomputed=true", "data.resolution=32", "model.other_phrasing=0.3"])
    model = build_model(cfg)
    model.train()
    main, alt = torch.zeros(64, 20, 64), torch.ones(64, 20, 64)
    torch.manual_seed(0)
    picks = torch.stack([model.rephrase(main, alt)[:, 0, 0] for _ in range(200)])
    assert set(picks.unique().tolist()) == {0.0, 1.0}  # whole samples swapped, never mixed
    assert abs(picks.mean().item() - 0.3) < 0.02
    model.eval()
    assert torch.equal(model.rephrase(main, alt), main)


def test_caption_dropout_is_drawn_at_every_step(latents, components):
    cfg = load_config(PHASE1, [f"model.pretrained={components}", f"data.path={latents / 'float16' / '16'}",
                               "data.precomputed=true", "data.resolution=16", "model.caption_dropout=0.25"])
    model = build_model(cfg)
    attach_latents(cfg, model)
    model.train()
    loader = build_dataloader(cfg.data, None, batch_size=64, seed=0)
    text = next(iter(loader))["text"].float()
    assert not (text == model.empty_text).all(dim=(1, 2)).any()  # nothing was dropped at precompute time
    torch.manual_seed(0)
    drops = torch.stack([(model.drop_text(text) == model.empty_text).all(dim=(1, 2)) for _ in range(200)])
    rate = drops.float().mean().item()
    assert abs(rate - 0.25) < 0.02  # 12,800 draws: 4 standard deviations is 0.015
    per_sample = drops.float().mean(dim=0)
    assert per_sample.min() > 0.05 and per_sample.max() < 0.5  # every caption is dropped sometimes, none always
    model.eval()
    assert torch.equal(model.drop_text(text), text)  # no dropout outside training


def test_stored_other_phrasings_reach_the_batch_only_when_training_swaps_them(latents, components):
    cfg = load_config(PHASE1, [f"model.pretrained={components}", f"data.path={latents / 'float16' / '16'}",
                               "data.precomputed=true", "data.resolution=16"])
    wanted = next(iter(build_dataloader(cfg.data, None, batch_size=16, seed=0)))
    skipped = next(iter(build_dataloader(cfg.data, None, batch_size=16, seed=0, other_phrasings=False)))
    assert wanted["text_alt"].shape == wanted["text"].shape and "text_alt" not in skipped
    assert all(torch.equal(wanted[k], skipped[k]) for k in ("latent_mean", "latent_std", "text"))


def test_training_on_precomputed_latents_and_refusing_other_encoders(latents, shapes_data, components, tmp_path):
    folder = tmp_path / "ckpt"
    over = tiny_overrides(shapes_data, components, folder, max_duration="2ba", save_interval="2ba")
    over += [f"data.path={latents / 'float16' / '16'}", "data.precomputed=true"]
    train(load_config(PHASE1, over))
    assert (folder / "ep0-ba2-rank0.pt").is_file()

    # Another scaling factor, then other VAE weights: each is one clear error before training.
    other = tmp_path / "other"
    shutil.copytree(components, other)
    cfg_file = other / "vae" / "config.json"
    vae_cfg = json.loads(cfg_file.read_text())
    vae_cfg["scaling_factor"] = 0.5
    cfg_file.write_text(json.dumps(vae_cfg))
    with pytest.raises(WorkbenchError, match="scaling factor"):
        train(load_config(PHASE1, over + [f"model.pretrained={other}", "save_folder=" + str(tmp_path / "x")]))
    vae_cfg["scaling_factor"] = 1.0
    cfg_file.write_text(json.dumps(vae_cfg))
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(other / "vae")
    with torch.no_grad():
        vae.encoder.conv_in.weight.mul_(1.01)
    vae.save_pretrained(other / "vae")
    with pytest.raises(WorkbenchError, match="another VAE"):
        train(load_config(PHASE1, over + [f"model.pretrained={other}", "save_folder=" + str(tmp_path / "y")]))
    # Wrong resolution, wrong data kind, random crops: refused by name.
    with pytest.raises(WorkbenchError, match="32 px"):
        train(load_config(PHASE1, over + [f"data.path={latents / 'float16' / '32'}", "save_folder=" + str(tmp_path / "z")]))
    with pytest.raises(WorkbenchError, match="data.precomputed=true"):
        train(load_config(PHASE1, over + ["data.precomputed=false", "save_folder=" + str(tmp_path / "w")]))
    with pytest.raises(WorkbenchError, match="no precomputed latents"):
        train(load_config(PHASE1, over + [f"data.path={shapes_data / '16'}", "save_folder=" + str(tmp_path / "v")]))


def test_interrupted_precompute_redoes_only_unfinished_chunks(latents, shapes_data, components, tmp_path):
    out = tmp_path / "lat"
    kw = dict(vae_ref=str(components), text_encoder_ref=str(components), tokenizer_ref=str(components),
              resolutions=[16], batch_size=16, chunk_size=50, progress=False)
    precompute_latents(str(shapes_data), str(out), **kw)
    reference = [s["latent_mean"].tobytes() for s in _stored(out / "16", 192)]
    # As if killed: chunk 2 unfinished (a partial folder), no merged index, metadata not complete.
    shutil.rmtree(out / "16" / "chunks" / "00002")
    (out / "16" / "chunks" / "00002.part").mkdir()
    (out / "16" / "index.json").unlink()
    meta = json.loads((out / "16" / META).read_text())
    meta["complete"] = False
    (out / "16" / META).write_text(json.dumps(meta))
    with pytest.raises(WorkbenchError, match="unfinished"):
        latent_meta(DataConfig(path=str(out / "16"), precomputed=True, resolution=16))
    summary = precompute_latents(str(shapes_data), str(out), **kw)[0]
    assert summary["encoded"] == 50 and summary["resumed_chunks"] == 3
    assert [s["latent_mean"].tobytes() for s in _stored(out / "16", 192)] == reference
    assert not (out / "16" / "chunks" / "00002.part").exists()
    assert precompute_latents(str(shapes_data), str(out), **kw)[0]["already_done"]
    # Another encoder into the same folder is refused instead of mixing latents.
    with pytest.raises(WorkbenchError, match="another source, encoder or setting"):
        precompute_latents(str(shapes_data), str(out), **{**kw, "dtype": "float32"})


def test_empty_caption_states_are_the_text_encoders(latents, components):
    _, text_encoder, tokenizer = load_frozen_parts(str(components))
    meta = json.loads((latents / "float32" / "16" / META).read_text())
    ids = tokenizer("", padding="max_length", max_length=tokenizer.model_max_length, return_tensors="pt").input_ids
    with torch.no_grad():
        expected = text_encoder(ids)[0][0].numpy()
    np.testing.assert_allclose(decode_array(meta["empty_text"]), expected, rtol=1e-6, atol=1e-6)


def test_cli_errors_are_one_line(shapes_data, components, tmp_path, dwb):
    r = dwb("data", "precompute", str(shapes_data), str(tmp_path / "o"))
    assert r.returncode == 1 and "--pretrained" in r.stderr and "Traceback" not in r.stderr
    r = dwb("data", "precompute", str(shapes_data / "16"), str(tmp_path / "o"), "--pretrained", str(components))
    assert r.returncode == 1 and "--resolution" in r.stderr
    r = dwb("data", "precompute", str(shapes_data), str(tmp_path / "o"), "--pretrained", str(tmp_path / "nothing"))
    assert r.returncode == 1 and "not found" in r.stderr and "Traceback" not in r.stderr


def test_the_transformer_trains_on_stored_latents_with_its_captions_as_from_images(latents, shapes_data, components):
    """The MMDiT conditions on states the stored ones do not hold (penultimate and pooled), so its batches carry the
    stored latents with their captions' ids: same batch, same RNG state, the on-the-fly loss; the stored text
    states need no matching text tower (its CLIP tower gains a projection)."""
    from train.data import build_dataloader

    cfg = load_config(REPO / "configs/tiny-mmdit-phase2.yaml", [
        f"model.pretrained={components}", f"data.path={latents / 'float32' / '32'}", "data.precomputed=true",
        "model.caption_dropout=0.5", "global_train_batch_size=8", "device_train_microbatch_size=8",
        "data.shuffle=false", "load_path=null"])
    model = build_model(cfg)
    attach_latents(cfg, model)
    model.train()
    pre = next(iter(build_dataloader(cfg.data, model.tokenizer, 8, cfg.seed, captions=model.reads_captions)))
    assert set(pre) == {"latent_mean", "latent_std", "input_ids"}
    src = _source(shapes_data, 32, 8)
    raw = {"image": to_model_range(np.stack([crop_to_array(s["image"], 32) for s in src])),
           "input_ids": model.tokenizer([s["caption"] for s in src], padding="max_length", truncation=True,
                                        max_length=model.tokenizer.model_max_length, return_tensors="pt").input_ids}
    assert torch.equal(pre["input_ids"], raw["input_ids"])
    assert_trains_alike(model, raw, pre)
