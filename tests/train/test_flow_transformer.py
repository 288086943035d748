"""`dwb train` of the tiny MMDiT with rectified flow: what it conditions on and how it noises equal what diffusers'
``StableDiffusion3Pipeline`` and ``FlowMatchEulerDiscreteScheduler`` do at sampling; validation is bit-identical
straight or through a SIGKILL and resume; previews are what `dwb sample` draws; the exported folder draws the same
image in plain diffusers; phase 2 takes SD3's resolution shift.

Two short real runs shared by the module: phase 1 straight (4 batches) and the same phase 1 SIGKILLed after its
batch-2 checkpoint and resumed; a 2-batch phase 2 from the straight run."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from models.checkpoints import load_pipeline, read_checkpoint
from train.config import load_config
from models.errors import WorkbenchError
from models.generation import Settings, generate_images
from train.trainer import build_model, train

from ..conftest import REPO, kill_once_saved, tiny_overrides

PHASE1, PHASE2 = REPO / "configs/tiny-mmdit-phase1.yaml", REPO / "configs/tiny-mmdit-phase2.yaml"
PROMPTS = ["a red circle above a blue square", "two green triangles"]
BIN = Path(sys.executable).parent


def _over(shapes_data, components, folder, **extra) -> list[str]:
    keys = dict(max_duration="4ba", save_interval="2ba", autoresume="true", eval_interval="2ba", preview_interval="4ba",
                **{"validation.path": shapes_data / "eval" / "32", "validation.max_samples": 4,
                   "validation.timesteps": "[125,375,625,875]", "previews.prompts": json.dumps(PROMPTS),
                   "previews.steps": 3, "ema.enabled": "true"})
    return tiny_overrides(shapes_data, components, folder, **{**keys, **extra})




@pytest.fixture(scope="module")
def runs(shapes_data, components, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("mmdit")
    straight = root / "straight" / "checkpoints"
    train(load_config(PHASE1, _over(shapes_data, components, straight)))

    killed = root / "killed" / "checkpoints"
    over = _over(shapes_data, components, killed, preview_interval="null")
    proc = subprocess.Popen([str(BIN / "dwb"), "train", str(PHASE1), *over], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    kill_once_saved(proc, killed / "ep0-ba2-rank0.pt")
    train(load_config(PHASE1, over))

    phase2 = root / "phase2" / "checkpoints"
    train(load_config(PHASE2, _phase2_over(shapes_data, components, phase2, straight / "ep0-ba4-rank0.pt")))
    return {"straight": straight, "killed": killed, "phase2": phase2}


def _phase2_over(shapes_data, components, folder, start: Path) -> list[str]:
    """The module's phase 2: 2 batches at 32 px from the checkpoint ``start``."""
    return _over(shapes_data, components, folder, max_duration="2ba", eval_interval="null", preview_interval="null",
                 load_path=start, **{"data.path": shapes_data / "32", "data.resolution": 32})


@pytest.fixture(scope="module")
def model(shapes_data, components):
    """The training model as phase 1 builds it (fresh weights), in eval mode."""
    return build_model(load_config(PHASE1, tiny_overrides(shapes_data, components, Path("unused")))).eval()


def test_the_text_states_are_what_sd3s_pipeline_feeds_the_transformer(model):
    pipe = model.pipeline_with(model.transformer)
    ids = model.tokenizer(PROMPTS, padding="max_length", max_length=model.tokenizer.model_max_length,
                          truncation=True, return_tensors="pt").input_ids
    text = model.encode_text(ids)
    want, _, want_pooled, _ = pipe.encode_prompt(PROMPTS, None, None, do_classifier_free_guidance=False,
                                                 max_sequence_length=0)
    assert text.states.shape == want.shape and text.states.shape[-1] == model.transformer.config.joint_attention_dim
    assert torch.equal(text.states, want) and torch.equal(text.pooled, want_pooled) and text.time_ids is None


def test_the_noised_input_and_timestep_are_the_schedulers(model):
    """The transformer sees, in training, what it sees at sampling at the same t: FlowMatchEulerDiscreteScheduler's
    ``scale_noise`` of the latents, and the timestep 1000 t."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    seen = {}
    hook = model.transformer.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    try:
        latents, noise = torch.randn(2, 4, 4, 4), torch.randn(2, 4, 4, 4)
        ids = model.tokenizer(PROMPTS, padding="max_length", max_length=model.tokenizer.model_max_length,
                              return_tensors="pt").input_ids
        scheduler = FlowMatchEulerDiscreteScheduler(shift=model.flow.shift)
        t = scheduler.timesteps[[100, 700]]
        pred, target, sigma = model.denoise(latents, model.encode_text(ids), noise, t)
    finally:
        hook.remove()
    want = torch.cat([scheduler.scale_noise(latents[i:i + 1], t[i:i + 1], noise[i:i + 1]) for i in range(2)])
    assert torch.allclose(seen["hidden_states"], want, atol=1e-6)
    assert torch.equal(seen["timestep"], t.float()) and torch.equal(target, noise - latents)
    assert pred.shape == latents.shape and torch.allclose(sigma, t / 1000)


def test_the_spec_says_family_denoiser_and_flow(runs):
    spec = read_checkpoint(runs["straight"] / "ep0-ba4-rank0.pt")["spec"]
    assert spec["format"] == "diffusion-workbench/2" and spec["family"] == "sd3"
    assert spec["prediction_type"] == "flow" and "unet" not in spec
    assert spec["transformer"]["num_layers"] == 4 and spec["flow"]["shift"] == 1.0
    assert spec["vae"]["shift_factor"] == 0.0
    from models.checkpoints import describe, find_checkpoint

    info = describe(find_checkpoint(str(runs["straight"] / "ep0-ba4-rank0.pt")))  # what the app and evaluate ask
    assert info.family == "sd3" and info.prediction_type == "flow" and info.resolution == 16


@pytest.mark.slow
def test_validation_loss_is_bit_identical_straight_or_through_a_kill_and_resume(runs):
    for name in ("ep0-ba2-rank0.pt", "ep0-ba4-rank0.pt"):
        straight = read_checkpoint(runs["straight"] / name)["callbacks"]["ValidationLoss"]["last"]
        resumed = read_checkpoint(runs["killed"] / name)["callbacks"]["ValidationLoss"]["last"]
        assert straight == resumed
    assert straight["validation/loss"] != straight["validation_ema/loss"]
    assert {"validation/loss_low", "validation/loss_mid", "validation/loss_high"} <= set(straight)


def test_a_format_2_spec_without_its_flow_is_one_line(runs, dwb, tmp_path):
    """A checkpoint from elsewhere whose spec names SD3 but leaves out how it noises: one line, not a KeyError."""
    ckpt = torch.load(runs["straight"] / "ep0-ba4-rank0.pt", map_location="cpu", weights_only=False)
    del ckpt["state"]["callbacks"]["ModelSpec"]["spec"]["flow"]
    hostile = tmp_path / "no-flow.pt"
    torch.save(ckpt, hostile)
    r = dwb("sample", str(hostile), str(tmp_path / "x.png"), "--steps", "1", "--size", "16")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "its model spec does not build (KeyError: 'flow')" in r.stderr and not (tmp_path / "x.png").exists()


def test_a_preview_is_what_dwb_sample_draws(runs, dwb, tmp_path):
    preview = runs["straight"].parent / "previews" / "ba4.png"
    params = json.loads(preview.with_suffix(".json").read_text())
    out = tmp_path / "sample.png"
    args = [a for p in PROMPTS for a in ("--prompt", p)]
    r = dwb("sample", str(runs["straight"] / "ep0-ba4-rank0.pt"), str(out), *args, "--seeds", "2", "--steps", "3",
            "--guidance", str(params["guidance"]), "--size", "16", "--weights", "ema" if params["ema"] else "raw")
    assert r.returncode == 0, r.stderr
    a, b = np.asarray(Image.open(preview)), np.asarray(Image.open(out))
    cells = (slice(24, None), slice(300, None))  # below the title, right of the prompt labels
    assert a.shape == b.shape and np.array_equal(a[cells], b[cells]) and a[cells].std() > 0


def test_the_exported_folder_draws_our_image_in_plain_diffusers(runs, dwb, tmp_path):
    from diffusers import StableDiffusion3Pipeline

    ckpt = runs["phase2"] / "ep0-ba2-rank0.pt"
    r = dwb("export", str(ckpt), str(tmp_path / "folder"))
    assert r.returncode == 0, r.stderr
    settings = Settings(steps=4, guidance=3.0, width=32, height=32, sampler="Euler")
    ours = generate_images(load_pipeline(ckpt, ema=True), PROMPTS[:1], [7], settings)[0]

    card = (tmp_path / "folder" / "README.md").read_text()  # how the card says to load and call it
    assert "text_encoder_3=None, tokenizer_3=None" in card and "max_sequence_length=0" in card
    plain = StableDiffusion3Pipeline.from_pretrained(tmp_path / "folder", text_encoder_3=None, tokenizer_3=None,
                                                     local_files_only=True)
    assert plain.scheduler.config.shift == 2.0  # SD3's resolution shift at 32 px over the 16 px base
    image = plain(PROMPTS[0], num_inference_steps=4, guidance_scale=3.0, width=32, height=32, max_sequence_length=0,
                  generator=torch.Generator("cpu").manual_seed(7), output_type="np").images[0]
    assert np.array_equal(ours, (image * 255).round().astype(np.uint8)) and ours.std() > 0


def test_the_single_file_export_is_sd3s_file_without_text_encoders_and_diffusers_draws_our_image(runs, dwb, tmp_path):
    """Trained without T5, our MMDiT is written as ``sd3_medium.safetensors`` is published: the MMDiT and the VAE in
    SD3's names, its CLIP tower in ``NAME.config/``; diffusers' ``from_single_file`` and `dwb`'s door read it and
    draw our image."""
    from diffusers import StableDiffusion3Pipeline
    from safetensors import safe_open
    from transformers import CLIPTextModelWithProjection

    ckpt = runs["phase2"] / "ep0-ba2-rank0.pt"
    out = tmp_path / "ours.safetensors"
    r = dwb("export", str(ckpt), str(out))
    assert r.returncode == 0, r.stderr
    with safe_open(str(out), "pt") as f:
        keys = set(f.keys())
    assert {k.split(".")[0] for k in keys} == {"model", "first_stage_model"}
    assert "model.diffusion_model.joint_blocks.0.x_block.attn.qkv.weight" in keys
    settings = Settings(steps=4, guidance=3.0, width=32, height=32, sampler="Euler")
    ours = generate_images(load_pipeline(ckpt, ema=True), PROMPTS[:1], [7], settings)[0]
    # the text encoders as diffusers' reader asks for parts its file lacks: loaded, and passed in
    config = tmp_path / "ours.config"
    towers = {name: CLIPTextModelWithProjection.from_pretrained(config / name) for name in ("text_encoder",
                                                                                             "text_encoder_2")}
    plain = StableDiffusion3Pipeline.from_single_file(str(out), config=str(config), text_encoder_3=None,
                                                      tokenizer_3=None, local_files_only=True,
                                                      torch_dtype=torch.float32, **towers)
    image = plain(PROMPTS[0], num_inference_steps=4, guidance_scale=3.0, width=32, height=32, max_sequence_length=0,
                  generator=torch.Generator("cpu").manual_seed(7), output_type="np").images[0]
    assert np.array_equal(ours, (image * 255).round().astype(np.uint8)) and ours.std() > 0
    assert np.array_equal(generate_images(load_pipeline(out), PROMPTS[:1], [7], settings)[0], ours)  # `dwb`'s door


def test_phase_2_takes_the_resolution_shift_and_the_phase_1_weights(runs, model, shapes_data, components, tmp_path):
    """Phase 2 records SD3's shift at 32 px, and the transformer it trains from (the trainer `dwb train` builds for
    the module's phase 2, before its first batch) holds phase 1's last weights tensor for tensor: its EMA weights,
    which Composer saves as the model's (README, "EMA and checkpoints"), not its raw ones nor a fresh transformer at
    the run's seed."""
    from models.checkpoints import model_weights
    from train.trainer import build_trainer

    spec = read_checkpoint(runs["phase2"] / "ep0-ba2-rank0.pt")["spec"]
    assert spec["flow"]["shift"] == pytest.approx(2.0) and spec["resolution"] == 32
    start = runs["straight"] / "ep0-ba4-rank0.pt"
    ema, raw = ({k: v for k, v in model_weights(read_checkpoint(start), ema=e).items() if k.startswith("transformer.")}
                for e in (True, False))
    trainer = build_trainer(load_config(PHASE2, _phase2_over(shapes_data, components, tmp_path / "c", start)))
    try:
        starts = {k: v.detach().clone() for k, v in trainer.state.model.state_dict().items()
                  if k.startswith("transformer.")}
    finally:
        trainer.close()
    fresh = {k: v for k, v in model.state_dict().items() if k.startswith("transformer.")}
    assert ema and ema.keys() == raw.keys() == starts.keys() == fresh.keys()
    assert all(torch.equal(ema[k], starts[k]) for k in ema)
    for other in (raw, fresh):
        assert not all(torch.equal(other[k], starts[k]) for k in ema)


def test_a_unet_checkpoint_is_no_starting_point_for_the_transformer(tiny_run, shapes_data, components, tmp_path):
    over = tiny_overrides(shapes_data, components, tmp_path / "ck", max_duration="1ba",
                          load_path=tiny_run / "ep0-ba4-rank0.pt")
    with pytest.raises(WorkbenchError, match="config key 'load_path'.*'tiny' model"):
        train(load_config(PHASE1, over))


@pytest.mark.parametrize("overrides, says", [
    ({"model.loss_weighting": "uniform"}, "model.loss_weighting"),
    ({"model.logit_std": "0"}, "model.logit_std"),
    ({"model.flow_shift": ".inf"}, "model.flow_shift"),
    # stored latents come with their captions, not their other phrasings
    ({"data.precomputed": "true", "model.other_phrasing": "0.5"}, "model.other_phrasing"),
])
def test_bad_flow_keys_are_one_line(overrides, says, shapes_data, components, tmp_path):
    with pytest.raises(WorkbenchError, match=says):
        build_model(load_config(PHASE1, tiny_overrides(shapes_data, components, tmp_path, **overrides)))


def test_the_full_size_mmdit_is_sd3_mediums_two_billion_weights():
    """configs/mmdit-medium-phase{1,2}.yaml build SD3-medium's MMDiT (published: "2B parameters"; diffusers' own
    SD3-medium transformer counts 2.028B) on SD 2's 4-channel latents and 1,024-wide text tower, offline."""
    from models.checkpoints import build_transformer

    with torch.device("meta"):
        count = sum(p.numel() for p in build_transformer("mmdit-medium").parameters())
    assert abs(count / 2.028e9 - 1) < 0.01, count
    for phase in (1, 2):
        cfg = load_config(REPO / f"configs/mmdit-medium-phase{phase}.yaml")
        assert (cfg.model.architecture, cfg.data.resolution) == ("mmdit-medium", {1: 256, 2: 512}[phase])


@pytest.mark.slow
def test_a_full_size_run_the_machine_cannot_hold_is_one_line_before_any_weight():
    """`dwb train` of the full-size MMDiT on a CPU with 4 GiB to spare: refused in one line naming what it needs
    (2,025M trained weights x 16 bytes, and 4 more for the copy rank 0 draws previews with under FSDP), before a
    weight is made, instead of being killed for memory."""
    import os

    from models.checkpoints import build_transformer, random_text_encoder, random_vae

    with torch.device("meta"):
        trained = sum(p.numel() for p in build_transformer("mmdit-medium").parameters())
        frozen = sum(p.numel() for m in (random_vae("mmdit-medium"), random_text_encoder("mmdit-medium"))
                     for p in m.parameters())
    need = (trained * (16 + 4) + frozen * 4) / 2**30  # phase 1 has no EMA; fsdp and previews are on
    r = subprocess.run([str(BIN / "dwb"), "train", str(REPO / "configs/mmdit-medium-phase1.yaml"),
                        "model.pretrained=null", "low_precision_norms=false", "precision=fp32"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "DWB_MEMORY_MB": "4096"})
    assert r.returncode != 0 and "Traceback" not in r.stderr
    [line] = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert f"'mmdit-medium' (mmdit-medium-phase1) needs at least {need:.1f} GiB" in line and "4.0 GiB is free" in line


def test_the_app_offers_the_flow_samplers_and_draws_what_dwb_sample_draws(runs):
    """The app takes a transformer checkpoint like any other: its family's samplers, and the image of the one
    generation path with its PNG parameters."""
    from app.generate import GenerationParams
    from app.handlers import Handlers
    from app.service import Service
    from models.families import family_named

    handlers = Handlers(Service([runs["straight"]]))
    [label] = [c for c in handlers.choices()[1] if c.endswith("ep0-ba4-rank0.pt")]
    sampler, negative = handlers.family_controls(label, "LMS")
    assert list(sampler["choices"]) == list(family_named("sd3").samplers) and negative["interactive"] is True
    result = handlers.service.generate(label, "ema", GenerationParams(PROMPTS[0], sampler="Euler", steps=3,
                                                                      guidance=3.0, width=16, height=16, seed=5))
    ours = generate_images(load_pipeline(runs["straight"] / "ep0-ba4-rank0.pt", ema=True), PROMPTS[:1], [5],
                           Settings(steps=3, guidance=3.0, width=16, height=16, sampler="Euler"))[0]
    assert np.array_equal(np.asarray(result.images[0].convert("RGB")), ours)
    assert "Sampler: Euler" in result.images[0].info["parameters"]
