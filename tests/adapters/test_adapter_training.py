"""Training an adapter on a model the user holds (``model.init_from`` with an ``adapter:`` section), end to end: the
run's checkpoints hold the adapter alone (its weights, AdamW's state and EMA) and name the base by content hash; `dwb
export --layout` writes files that plain diffusers (``load_lora_weights``, and its kohya converter for the kohya
layout and Flux.1's ComfyUI layout) loads into the untouched base to draw the trained model's image at strength 1 and
0.5; a run SIGKILLed after
a checkpoint resumes to the same bits; 2 FSDP ranks train what one process trains. Bases: tiny random models written
by diffusers' ``save_pretrained`` (SD 2, SDXL, Flux.1-dev)."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from ..ranks import BIN, finish, launch
from .adapted import denoiser_of, draw, fresh
from .conftest import adapter_keys, killed_and_resumed

ATOL = 1e-5  # the adapter's weights through each file: the same images to float rounding (as the layout tests)


def trained_pipelines(keys: list[str], checkpoint: Path):
    """(the base pipeline as diffusers opens its folder, the same pipeline around the run's trained denoiser): the
    training model rebuilt by the trainer's own builder and given the checkpoint's EMA state as a resume gives it."""
    import diffusers

    from models.checkpoints import model_weights, read_checkpoint
    from models.families import family_named
    from train.config import load_config
    from train.trainer import build_model

    model = build_model(load_config(None, keys))
    missing, unexpected = model.load_state_dict(model_weights(read_checkpoint(checkpoint), ema=True), strict=False)
    assert not unexpected and not any("lora_" in k for k in missing)
    base = getattr(diffusers, family_named(model.family).pipeline).from_pretrained(model.source["init_from"])
    base.set_progress_bar_config(disable=True)
    return base, fresh(base, model.family, model.denoiser.eval())


@pytest.mark.parametrize("family", ["sd2", "sdxl", "flux"])
def test_exported_files_draw_the_trained_image_in_plain_diffusers_at_full_and_half_strength(family, lora_runs, dwb,
                                                                                            tmp_path):
    keys, folder = lora_runs(family)
    base, trained = trained_pipelines(keys, folder / "ep0-ba4-rank0.pt")
    base_image, full, half = draw(base, family), draw(trained, family), draw(trained, family, scale=0.5)
    for a, b in ((full, base_image), (half, full)):  # else the comparisons below prove nothing
        assert np.abs(a - b).max() > 0.02, "the trained adapter, or its strength, changed no pixel"
    denoiser = denoiser_of(base, family)
    # ComfyUI's own layout is written for the transformer families; diffusers' Flux.1 reader takes its names
    for layout in ("diffusers", "kohya", *(("comfyui",) if family == "flux" else ())):
        out = tmp_path / f"{layout}.safetensors"
        done = dwb("export", str(folder / "ep0-ba4-rank0.pt"), str(out), "--layout", layout)
        assert done.returncode == 0 and f"in the {layout} layout" in done.stdout, done.stderr
        loaded = fresh(base, family, copy.deepcopy(denoiser))
        loaded.load_lora_weights(out, adapter_name="style")
        np.testing.assert_allclose(draw(loaded, family), full, atol=ATOL, err_msg=layout)
        loaded.set_adapters("style", adapter_weights=0.5)
        np.testing.assert_allclose(draw(loaded, family), half, atol=ATOL, err_msg=layout)


def test_checkpoints_hold_the_adapter_its_optimizer_and_ema_and_name_the_base_by_hash(lora_runs, sd2_folder):
    from models.adapters import is_adapter_key
    from models.checkpoints import content_hash, find_checkpoint, read_checkpoint

    from ..train.test_resilience import training_state

    path = lora_runs("sd2")[1] / "ep0-ba4-rank0.pt"
    state = training_state(path)
    weights = [k[len("model."):] for k in state if k.startswith("model.")]
    ema = [k[len("ema."):] for k in state if k.startswith("ema.")]
    assert weights and all(is_adapter_key(k) for k in weights)
    assert sorted(ema) == sorted(weights)  # the EMA averages the adapter, nothing else
    assert len([k for k in state if k.startswith("adamw.") and k.endswith(".exp_avg")]) == len(weights)
    spec = read_checkpoint(path)["spec"]
    assert spec["adapter"]["base"]["content_hash"] == content_hash(find_checkpoint(sd2_folder))
    assert spec["adapter"]["type"] == "lora" and spec["adapter"]["alpha"] == 8
    from safetensors import safe_open

    with safe_open(next((sd2_folder / "unet").glob("*.safetensors")), "pt") as base:
        base_values = sum(np.prod(base.get_slice(k).get_shape()) for k in base.keys())
    assert 20 * sum(state["model." + k].numel() for k in weights) < base_values  # rank 4 of 32- and 64-wide layers


@pytest.mark.slow
def test_an_adapter_run_sigkilled_after_a_checkpoint_resumes_bit_identically(lora_runs, tmp_path):
    from ..train.test_resilience import differing

    keys, reference = lora_runs("sd2")
    resumed = killed_and_resumed(keys, tmp_path / "checkpoints")
    assert differing(resumed, reference / "ep0-ba4-rank0.pt") == []


@pytest.mark.slow
def test_two_fsdp_ranks_train_the_adapter_one_process_trains(shapes_data, sd2_folder, tmp_path):
    """The adapter's weights, raw and EMA, after 2 batches on 2 ranks (SHARD_GRAD_OP, the base frozen inside the
    same FSDP units) against one process, within the float-sum bound of tests/train/test_scale.py. At the configs'
    lr of 1e-4: LoRA's down weights get no gradient at step 1 (the up weights start at zero) and a gradient of
    cancelling terms at step 2, which AdamW scales to about lr whatever its size, so the order of float sums shows
    in proportion to lr (one process with 2 microbatches against 1: 4.1e-8 at lr 1e-4, 7.0e-5 at 0.02)."""
    from train.config import load_config
    from train.trainer import train

    from ..train.test_scale import WEIGHTS_ATOL, weights_of

    one, two = tmp_path / "one", tmp_path / "two"
    keys = [k for k in adapter_keys(shapes_data, sd2_folder, one, max_duration="2ba", **{"optimizer.lr": 1e-4})
            if not k.startswith("save_folder=")]  # the shared runs' keys at the configs' lr, 2 batches
    config = tmp_path / "empty.yaml"
    config.write_text("{}\n")
    # the ranks start first: their interpreters load while this process trains the reference
    ranks = launch([str(BIN / "dwb"), "train", str(config), *keys, f"save_folder={two}", "fsdp=true"], nproc=2)
    train(load_config(None, [*keys, f"save_folder={one}"]))
    run = finish(ranks)
    assert run.returncode == 0 and not run.hung, run.explain()
    assert "FSDP SHARD_GRAD_OP" in run.stdout
    for ema in (False, True):
        got, want = weights_of(two / "ep0-ba2-rank0.pt", ema), weights_of(one / "ep0-ba2-rank0.pt", ema)
        assert want and got.keys() == want.keys()
        assert max(w.abs().max().item() for k, w in want.items() if "lora_B" in k) > 20 * WEIGHTS_ATOL  # it trained
        assert max((got[k] - want[k]).abs().max().item() for k in want) <= WEIGHTS_ATOL


def test_the_adapter_export_runs_with_the_training_framework_refused(lora_runs, sd2_folder, tmp_path):
    """`dwb export --layout` reads the adapter checkpoint through the door's own readers: a fresh interpreter that
    refuses Composer writes the peft-layout file, which the adapter check reads as the run's LoRA."""
    import diffusers

    from models.adapters import check_adapter_file

    from ..test_no_training_framework import run_without_composer

    out = tmp_path / "peft.safetensors"
    ckpt = lora_runs("sd2")[1] / "ep0-ba4-rank0.pt"
    done = run_without_composer(f"from dwb import main; main(['export', {str(ckpt)!r}, {str(out)!r}, '--layout', "
                                f"'peft'])")
    assert done.returncode == 0, done.stderr[-2000:]
    base = diffusers.UNet2DConditionModel.from_pretrained(sd2_folder / "unet")
    found = check_adapter_file(out, base, "sd2")
    assert (found.layout, found.kind, found.rank) == ("peft", "lora", 4)
