"""`dwb train` of a Flux.1-style transformer: what it conditions on, how it packs and noises equal what diffusers'
``FluxPipeline`` and ``FlowMatchEulerDiscreteScheduler`` feed the transformer; the exported folder draws our image
in plain ``FluxPipeline``; Flux.1-schnell's full-size transformer counts its published weights on the meta device and
is refused in one line where the machine cannot train it.

One short real run shared by the module: tiny-flux at 32 px, 2 batches of 8."""
from pathlib import Path

import numpy as np
import pytest
import torch

from models.checkpoints import load_pipeline, read_checkpoint
from train.config import load_config
from models.errors import WorkbenchError
from models.generation import Settings, generate_images
from train.trainer import build_model, train

from ..conftest import REPO, tiny_overrides

CONFIG = REPO / "configs/tiny-flux.yaml"
PROMPTS = ["a red circle above a blue square", "two green triangles"]


@pytest.fixture(scope="module")
def model(shapes_data, components):
    """The training model as configs/tiny-flux.yaml builds it (fresh weights), in eval mode."""
    return build_model(load_config(CONFIG, tiny_overrides(shapes_data, components, Path("unused"), res=32))).eval()


@pytest.fixture(scope="module")
def run(shapes_data, components, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("flux") / "checkpoints"
    train(load_config(CONFIG, tiny_overrides(shapes_data, components, folder, res=32, max_duration="2ba",
                                             save_interval="2ba", eval_interval="null", preview_interval="null",
                                             **{"ema.enabled": "false"})))
    return folder / "ep0-ba2-rank0.pt"


def _ids(model, prompts):
    return model.tokenizer(prompts, padding="max_length", max_length=model.tokenizer.model_max_length,
                           truncation=True, return_tensors="pt").input_ids


def test_the_text_conditioning_is_flux_pipelines(model):
    pipe = model.pipeline_with(model.transformer)
    text = model.encode_text(_ids(model, PROMPTS))
    want, want_pooled, _ = pipe.encode_prompt(PROMPTS, None)
    assert text.states.shape == want.shape and text.states.shape[-1] == model.transformer.config.joint_attention_dim
    assert torch.equal(text.states, want) and torch.equal(text.pooled, want_pooled) and text.time_ids is None


def _fed(module, call) -> dict:
    seen = []
    hook = module.register_forward_pre_hook(lambda m, a, kw: seen.append(kw), with_kwargs=True)
    try:
        call()
    finally:
        hook.remove()
    return seen[0]


def test_the_packed_input_ids_and_timestep_are_the_pipelines(model):
    """At the same t the transformer sees in training what FluxPipeline feeds it at sampling: the scheduler's
    ``scale_noise`` of the latents packed 2x2, FluxPipeline's image and text ids, t in [0, 1]; and training's
    resolution shift is the one the pipeline's schedule takes at this size."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    from models.families import pack_latents, shifted

    pipe = model.pipeline_with(model.transformer)
    latents, noise = torch.randn(1, 4, 8, 8), torch.randn(1, 4, 8, 8)
    sampled = _fed(model.transformer, lambda: pipe(PROMPTS[0], num_inference_steps=4, width=32, height=32,
                                                   latents=pack_latents(noise), output_type="latent"))
    # the pipeline's schedule for 4 steps at 16 tokens, rebuilt as it builds it (its own scheduler has run to the end)
    mu = calculate_shift(16, *(pipe.scheduler.config[k] for k in ("base_image_seq_len", "max_image_seq_len",
                                                                  "base_shift", "max_shift")))
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / 4, 4), mu=mu)
    assert torch.equal(scheduler.timesteps, pipe.scheduler.timesteps)
    t = scheduler.timesteps[2:3]
    text = model.encode_text(_ids(model, PROMPTS[:1]))
    trained = _fed(model.transformer, lambda: model.denoise(latents, text, noise, t))
    assert torch.equal(trained["hidden_states"], pack_latents(scheduler.scale_noise(latents, t, noise)))
    assert torch.equal(trained["img_ids"], sampled["img_ids"]) and torch.equal(trained["txt_ids"], sampled["txt_ids"])
    assert torch.equal(trained["timestep"], t / 1000)
    assert torch.equal(sampled["hidden_states"], pack_latents(noise)) and sampled["timestep"].item() == 1.0
    assert model.flow.shift == pytest.approx(np.exp(mu))  # training draws t at the shift the pipeline samples at
    assert torch.allclose(scheduler.sigmas[:4], shifted(torch.linspace(1, 1 / 4, 4), model.flow.shift), atol=1e-6)


def test_the_spec_says_flux_and_its_t5(run):
    spec = read_checkpoint(run)["spec"]
    assert spec["family"] == "flux" and spec["prediction_type"] == "flow" and spec["resolution"] == 32
    assert spec["transformer"]["num_single_layers"] == 2 and spec["text_encoder_2"]["model_type"] == "t5"


def test_the_exported_folder_draws_our_image_in_plain_flux_pipeline(run, dwb, tmp_path):
    from diffusers import FluxPipeline

    r = dwb("export", str(run), str(tmp_path / "folder"))
    assert r.returncode == 0, r.stderr
    settings = Settings(steps=3, guidance=0.0, width=32, height=32, sampler="Euler")
    ours = generate_images(load_pipeline(run), PROMPTS[:1], [7], settings)[0]
    plain = FluxPipeline.from_pretrained(tmp_path / "folder", local_files_only=True)
    image = plain(PROMPTS[0], num_inference_steps=3, width=32, height=32,
                  generator=torch.Generator("cpu").manual_seed(7), output_type="np").images[0]
    assert np.array_equal(ours, (image * 255).round().astype(np.uint8)) and ours.std() > 0


def test_a_block_is_an_fsdp_unit(model):
    units = [m for m in model.transformer.modules() if model.fsdp_wrap_fn(m)]
    assert len(units) == 4 and not model.fsdp_wrap_fn(model.transformer)


def test_flux_schnell_counts_its_published_weights_and_is_refused_before_any_is_made(monkeypatch):
    """configs/flux-schnell-mlperf.yaml builds Flux.1-schnell's transformer (published: "~11.9B", MLPerf's
    text_to_image README; "12 billion" on its card) on the meta device, and a machine that cannot hold its training
    state refuses it in one line before a weight is made."""
    from train import trainer

    cfg = load_config(REPO / "configs/flux-schnell-mlperf.yaml")
    with torch.device("meta"):
        count = sum(p.numel() for p in trainer.build_denoiser(cfg).parameters())
    assert abs(count / 11.9e9 - 1) < 0.005, count
    monkeypatch.setattr(trainer, "build_model", lambda cfg: pytest.fail("a weight was made"))
    monkeypatch.setenv("DWB_MEMORY_MB", "65536")
    with pytest.raises(WorkbenchError, match=r"'flux-schnell' .* needs at least .*11,891M trained weights") as e:
        trainer.check_memory(cfg, "cpu")
    assert "\n" not in str(e.value)
