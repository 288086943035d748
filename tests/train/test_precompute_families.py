"""`dwb data precompute --config` for every family, and the frozen parts held in the training dtype.

The run's own model encodes (its denoiser on the meta device): SDXL's two towers' penultimate states with the second's
pooled output and each image's size and crop, Flux.1's T5 states with CLIP's pooled output. Training on them gives the
loss encoding on the fly gives, batch for batch. On a GPU the VAE and text towers are held in the autocast dtype, and
the memory plan and the latents' fingerprints count them there."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from train.cli import run_encoder
from train.config import load_config
from train.data.latents import META
from train.data.precompute import precompute_latents
from train.recipes import frozen_dtype
from train.trainer import attach_latents, build_model, frozen_size, training_dataloader

from ..conftest import REPO, tiny_overrides
from .conftest import assert_trains_alike

# (config, resolution, overrides): tiny Flux's T5 over the CLIP tokenizer's 20 tokens, a tenth of 512's cost
FAMILIES = {"sdxl": ("tiny-sdxl-phase1", 16, {}), "flux": ("tiny-flux", 32, {"model.text_tokens": 20})}


def overrides(family: str, shapes_data, components) -> list[str]:
    _, res, extra = FAMILIES[family]
    return tiny_overrides(shapes_data, components, Path("unused"), res=res, **extra,
                          **{"data.shuffle": "false", "model.caption_dropout": 0.5, "model.other_phrasing": 0.5})


def config_file(family: str) -> Path:
    return REPO / "configs" / f"{FAMILIES[family][0]}.yaml"


@pytest.fixture(scope="module")
def latents(shapes_data, components, tmp_path_factory) -> dict[str, Path]:
    """Each family's latents of its resolution bucket, float32, encoded by the run's own model (the CLI's
    ``run_encoder``, as `dwb data precompute --config` does)."""
    out = tmp_path_factory.mktemp("family-latents")
    folders = {}
    for family, (_, res, _) in FAMILIES.items():
        encoder, refs = run_encoder(str(config_file(family)), overrides(family, shapes_data, components))
        assert all(p.is_meta for p in encoder.denoiser.parameters())  # no denoiser weights were made
        precompute_latents(str(shapes_data), str(out / family), encoder=encoder, refs=refs, resolutions=[res],
                           batch_size=64, dtype="float32", chunk_size=1000, progress=False)
        folders[family] = out / family / str(res)
    return folders


def precomputed(family, latents, shapes_data, components, *more):
    return load_config(config_file(family), overrides(family, shapes_data, components) +
                       [f"data.path={latents[family]}", "data.precomputed=true", *more])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_training_on_precomputed_text_equals_encoding_on_the_fly(family, latents, shapes_data, components):
    """The first batch of each loader (images and captions; stored latents, states, pooled output and sizes), same
    RNG state, caption dropout and other phrasings drawn at 0.5: the same loss; another draw, another loss."""
    cfg = precomputed(family, latents, shapes_data, components)
    model = build_model(cfg)
    attach_latents(cfg, model)
    model.train()
    raw = next(iter(training_dataloader(load_config(config_file(family), overrides(family, shapes_data, components)),
                                        model)))
    pre = next(iter(training_dataloader(cfg, model)))
    assert "image" not in pre and {"text", "pooled", "pooled_alt"} <= set(pre)
    for key in ("original_size", "crop_top_left"):  # SDXL's size and crop conditioning, stored as the loader makes it
        assert torch.equal(pre[key], raw[key])
    assert_trains_alike(model, raw, pre)


def test_stored_states_and_pooled_output_are_the_models_own(latents, shapes_data, components):
    """Flux: T5's states over text_tokens and CLIP's pooled output of each caption; a dropped caption becomes the
    empty caption's states and pooled output together."""
    from streaming import LocalDataset

    cfg = precomputed("flux", latents, shapes_data, components)
    model = build_model(cfg).eval()
    attach_latents(cfg, model)
    stored = [LocalDataset(local=str(latents["flux"]))[i] for i in range(4)]
    expected = model.encode_captions([s["caption"] for s in stored])
    assert expected.states.shape == (4, 20, model.text_encoder_2.config.d_model)
    got = torch.from_numpy(np.stack([s["text"] for s in stored]))
    torch.testing.assert_close(got, expected.states, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.from_numpy(np.stack([s["pooled"] for s in stored])), expected.pooled,
                               atol=1e-5, rtol=1e-5)
    empty = model.encode_captions([""])
    torch.testing.assert_close(model.empty_pooled, empty.pooled[0], atol=1e-5, rtol=1e-5)
    model.train()
    model.caption_dropout = 1.0
    states, pooled = model.drop_text((got, torch.zeros(4, model.empty_pooled.shape[0])))
    assert torch.equal(states, model.empty_text.expand_as(states))
    assert torch.equal(pooled, model.empty_pooled.expand(4, -1))


def test_latents_of_another_family_or_one_tower_are_refused(latents, shapes_data, components, tmp_path):
    """SD 2's model (one tower, the same VAE and resolution) refuses SDXL's stored states; SDXL's refuses latents
    made without its second tower; each in one line before training."""
    from models.errors import WorkbenchError

    sd2 = load_config(REPO / "configs/tiny-phase1.yaml", tiny_overrides(shapes_data, components, tmp_path) +
                      [f"data.path={latents['sdxl']}", "data.precomputed=true"])
    with pytest.raises(WorkbenchError, match="sdxl's conditioning"):
        attach_latents(sd2, build_model(sd2))
    # As latents from before families and second towers were recorded: SD 2's one tower
    older = tmp_path / "older"
    shutil.copytree(latents["sdxl"], older)
    meta = json.loads((older / META).read_text())
    del meta["family"], meta["text_encoder_2"]
    (older / META).write_text(json.dumps(meta))
    sdxl = precomputed("sdxl", {"sdxl": older}, shapes_data, components)
    model = build_model(sdxl)
    with pytest.raises(WorkbenchError, match="sd2's conditioning"):
        attach_latents(sdxl, model)
    meta["family"] = "sdxl"
    (older / META).write_text(json.dumps(meta))
    with pytest.raises(WorkbenchError, match="without this model's text_encoder_2"):
        attach_latents(sdxl, model)


def test_the_frozen_dtype_is_the_autocast_dtype_on_a_gpu_and_float32_on_a_cpu():
    assert frozen_dtype("cuda", "amp_bf16") == frozen_dtype("gpu", "auto") == torch.bfloat16
    assert frozen_dtype("gpu", "amp_fp16") == torch.float16
    assert frozen_dtype("gpu", "fp32") == torch.float32
    assert {frozen_dtype("cpu", p) for p in ("auto", "fp32", "amp_bf16", "amp_fp16")} == {torch.float32}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_plan_counts_frozen_parts_at_the_dtype_they_are_held_in(family, shapes_data, components):
    """On a CPU the tiny run holds its frozen parts in float32, as planned; held in bfloat16 (a GPU's amp_bf16), the
    parts' tensors take what the plan counts at bfloat16, half of float32's."""
    from models.checkpoints import module_size

    cfg = load_config(config_file(family), overrides(family, shapes_data, components))
    model = build_model(cfg)
    parts = model.frozen_components().values()
    assert {t.dtype for part in parts for t in part.parameters()} == {torch.float32}
    held = lambda: sum(module_size(part)[1] for part in parts)  # noqa: E731
    assert frozen_size(cfg)[1] == pytest.approx(held(), rel=0.01)
    half = frozen_size(cfg, torch.bfloat16)[1]
    model.hold_frozen_in(torch.bfloat16)
    assert {t.dtype for part in parts for t in part.parameters()} == {torch.bfloat16}
    assert half == pytest.approx(held(), rel=0.01) and half == pytest.approx(frozen_size(cfg)[1] / 2, rel=0.01)


def test_latents_made_in_float32_serve_a_run_holding_its_parts_in_half_precision(latents, shapes_data, components,
                                                                                  tmp_path):
    """The fingerprints precompute records per dtype are those of the parts a GPU run loads in bfloat16 or float16
    (transformers keeps T5's ``wo`` in float32 under float16, and so does ``hold_in``); weights changed after the
    cast are still refused."""
    from transformers import T5EncoderModel

    from models.checkpoints import fingerprint, hold_in, random_t5_encoder
    from models.errors import WorkbenchError

    t5 = random_t5_encoder("tiny-flux", 99, 0)
    t5.save_pretrained(tmp_path / "t5")
    loaded = T5EncoderModel.from_pretrained(tmp_path / "t5", dtype=torch.float16)
    assert fingerprint(loaded) == fingerprint(t5, torch.float16) == fingerprint(hold_in(t5, torch.float16))
    assert {n for n, p in loaded.named_parameters() if p.dtype == torch.float32} == \
        {n for n, p in t5.named_parameters() if p.dtype == torch.float32} != set()

    cfg = precomputed("sdxl", latents, shapes_data, components)
    model = build_model(cfg).hold_frozen_in(torch.bfloat16)
    attach_latents(cfg, model)
    with torch.no_grad():
        next(model.text_encoder_2.parameters()).add_(1.0)
    with pytest.raises(WorkbenchError, match="another text encoder 2"):
        attach_latents(cfg, model)


def test_precompute_config_cli_errors_are_one_line(shapes_data, tmp_path, dwb):
    r = dwb("data", "precompute", str(shapes_data), str(tmp_path / "o"), "--config", str(config_file("flux")),
            "--set", "model.pretrained=" + str(tmp_path / "nothing"), "--resolution", "32")
    assert r.returncode == 1 and "not found" in r.stderr and "Traceback" not in r.stderr
