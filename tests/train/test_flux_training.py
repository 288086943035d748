"""`dwb train` of a Flux.1-style transformer: what it conditions on, how it packs and noises equal what diffusers'
``FluxPipeline`` and ``FlowMatchEulerDiscreteScheduler`` feed the transformer; the exported folder draws our image
in plain ``FluxPipeline``; Flux.1-schnell's full-size transformer counts its published weights on the meta device and
is refused in one line where the machine cannot train it. MLPerf's recipe: t drawn uniform and unshifted, each
held-out sample validated at one timestep, the validation loss unweighted. A guidance-distilled transformer
(Flux.1-dev's ``guidance_embeds``) is told the guidance as FluxPipeline tells it, and trains.

Two short real runs: tiny-flux at 32 px, 2 batches of 8 (shared by the module), and one batch with a guidance input."""
from pathlib import Path

import numpy as np
import pytest
import torch

from models.checkpoints import load_pipeline, read_checkpoint
from train.config import load_config
from models.errors import WorkbenchError
from models.generation import Settings, generate_images
from train.recipes import Draws
from train.trainer import build_model, train

from ..conftest import REPO, tiny_overrides

CONFIG = REPO / "configs/tiny-flux.yaml"
MLPERF = REPO / "configs/flux-schnell-mlperf.yaml"
EIGHT = [0, 125, 250, 375, 500, 625, 750, 875]  # MLPerf's validation timesteps
PROMPTS = ["a red circle above a blue square", "two green triangles"]


@pytest.fixture(scope="module")
def model(shapes_data, components):
    """The training model as configs/tiny-flux.yaml builds it (fresh weights), in eval mode."""
    return build_model(load_config(CONFIG, tiny_overrides(shapes_data, components, Path("unused"), res=32))).eval()


@pytest.fixture(scope="module")
def short(shapes_data, components):
    """tiny-flux with its T5 over the tiny CLIP tokenizer's 20 tokens (``model.text_tokens``), in eval mode: the
    validation tests' model, at a tenth of the default 512 tokens' cost."""
    over = tiny_overrides(shapes_data, components, Path("unused"), res=32, **{"model.text_tokens": 20})
    return build_model(load_config(CONFIG, over)).eval()


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


def test_the_t5_tokens_travel_with_the_checkpoint_into_the_sampling_call(run):
    """The run's ``model.text_tokens`` (512 here) is in its spec; the pipeline `dwb sample` opens says it in its
    ``tokenizer_2`` (a copy of the tiny CLIP tokenizer, which keeps its own 20), and the generation path calls
    FluxPipeline with as many T5 tokens as that says: told 24, FluxPipeline's image at 24 tokens, not at 512."""
    from models.checkpoints import with_max_length

    assert read_checkpoint(run)["spec"]["text_tokens"] == 512
    pipe = load_pipeline(run)
    assert pipe.tokenizer_2.model_max_length == 512 and pipe.tokenizer.model_max_length == 20
    pipe.tokenizer_2 = with_max_length(pipe.tokenizer_2, 24)
    ours = generate_images(pipe, PROMPTS[:1], [7], Settings(steps=2, guidance=0.0, width=32, height=32,
                                                            sampler="Euler"))[0]

    def direct(tokens: int) -> np.ndarray:
        image = pipe(PROMPTS[0], num_inference_steps=2, width=32, height=32, max_sequence_length=tokens,
                     generator=torch.Generator("cpu").manual_seed(7), output_type="np").images[0]
        return (image * 255).round().astype(np.uint8)

    assert np.array_equal(ours, direct(24)) and not np.array_equal(ours, direct(512))


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
    line = str(e.value)
    # float32 weights, gradients and AdamW's two moments (no EMA copy, no previews), and the frozen VAE, CLIP-L and
    # T5-XXL in float32 as Flux.1-schnell publishes them (counted on the meta device: nothing is downloaded to plan)
    from models.families import built_on_meta, family_named

    assert not cfg.ema.enabled and cfg.model.pretrained and not cfg.preview_interval
    parts = family_named("flux").variant("schnell").parts
    frozen = sum(sum(built_on_meta(parts[p].cls, parts[p].config, p)) for p in ("vae", "text_encoder", "text_encoder_2"))
    need = count * (4 + 4 + 2 * 4) + frozen * 4
    assert "\n" not in line and f"needs at least {need / 2**30:.1f} GiB on this machine for 1 process" in line
    assert f"11,891M trained weights and {frozen / 1e6:,.0f}M frozen ones" in line


def _in_bins(t: torch.Tensor, bins: int) -> np.ndarray:
    return np.bincount(np.minimum((t.double().numpy() * bins).astype(int), bins - 1), minlength=bins)


def test_the_mlperf_config_draws_t_uniform_and_unshifted(short):
    """MLPerf's reference draws t ~ U[0, 1): each eighth of [0, 1) takes 1/8 of 40,000 draws (within 5 sigma) and
    scipy's KS test finds them uniform. The logit-normal default, shifted at 256 px, put its expected share (the normal
    CDF at the logit of the unshifted 1/8) below t = 1/8: under 1%."""
    from scipy import stats

    from train.recipes.flux import flux_flow

    model, n, ids = short, 40_000, torch.arange(40_000)
    draws = lambda: Draws(17, torch.zeros_like(ids), ids)  # noqa: E731
    kept = model.flow
    try:
        model.flow = flux_flow(load_config(MLPERF), model.vae)
        assert (model.flow.sampling, model.flow.shift) == ("uniform", 1.0)
        t = model.draw_timesteps(draws(), n, "cpu") / 1000
        model.flow = flux_flow(load_config(MLPERF, ["model.timestep_sampling=logit_normal", "model.flow_shift=null"]),
                               model.vae)
        default = model.draw_timesteps(draws(), n, "cpu") / 1000
    finally:
        model.flow = kept
    sigma = np.sqrt(n * (1 / 8) * (7 / 8))
    assert np.all(np.abs(_in_bins(t, 8) - n / 8) < 5 * sigma)
    assert stats.kstest(t.double().numpy(), "uniform").pvalue > 1e-4
    a = flux_flow(load_config(MLPERF, ["model.flow_shift=null"]), model.vae).shift
    unshifted = (1 / 8) / (a - (a - 1) / 8)  # shifted(u, a) = 1/8 solved for u
    expected = stats.norm.cdf(np.log(unshifted / (1 - unshifted)))
    assert expected < 0.01 and abs(_in_bins(default, 8)[0] / n - expected) < 5 * np.sqrt(expected / n)


def _seen(model, call) -> list[dict]:
    """What the transformer was given at each call during ``call``: its keywords."""
    seen = []
    hook = model.transformer.register_forward_pre_hook(lambda m, a, kw: seen.append(kw), with_kwargs=True)
    try:
        call()
    finally:
        hook.remove()
    return seen


def _timesteps(seen: list[dict]) -> list[int]:
    return (torch.cat([kw["timestep"] for kw in seen]) * 1000).round().long().tolist()


def test_one_timestep_validation_noises_each_sample_once_at_its_own(short, shapes_data):
    """``each_sample_at: one_timestep``: one transformer call per batch, held-out sample i at timestep i mod 8, on
    every split of the held-out set over ranks; its loss there is the MSE of that one denoising. ``all_timesteps``
    makes 8 calls per batch. The T5's 20 tokens (``model.text_tokens``) are what the transformer attends to."""
    from train.callbacks.validation import loss_sums, read_held_out

    model, where = short, str(shapes_data / "eval" / "32")
    held = read_held_out(where, 32, 10, 0, 1)
    sums = []
    seen = _seen(model, lambda: sums.append(loss_sums(model, held, EIGHT, 0, 4, one_timestep=True)))
    assert seen[0]["encoder_hidden_states"].shape[1] == 20 and seen[0]["txt_ids"].shape == (20, 3)
    assert len(seen) == 3 and _timesteps(seen) == [EIGHT[i % 8] for i in range(10)]
    assert sums[0][:, 1].tolist() == [2, 2, 1, 1, 1, 1, 1, 1]
    pairs = []
    for rank in range(3):  # the same pairs whatever the ranks: rank r of 3 holds samples r, r + 3, ...
        shard = read_held_out(where, 32, 10, rank, 3)
        times = _timesteps(_seen(model, lambda: loss_sums(model, shard, EIGHT, 0, 4, one_timestep=True)))
        pairs += [(i, t) for i, t, counted in zip(shard.indices, times, shard.counted) if counted]
    assert sorted(pairs) == [(i, EIGHT[i % 8]) for i in range(10)]
    # timestep 125's sum: samples 1 and 9, each the MSE of its one denoising there
    by_hand = sum(torch.nn.functional.mse_loss(*model.denoise(*_held_one(model, held, i, 125))[:2]).double()
                  for i in (1, 9))
    assert torch.allclose(sums[0][1, 0], by_hand, rtol=1e-5)
    one = read_held_out(where, 32, 1, 0, 1)
    assert _timesteps(_seen(model, lambda: loss_sums(model, one, EIGHT, 0, 4))) == EIGHT  # every timestep, a call each


def _held_one(model, held, i: int, t: int):
    from train.callbacks.validation import noise_for

    latents = model.scaled(model.vae.encode(held.images[i:i + 1]).latent_dist.mean)
    return latents, model.encode_captions([held.captions[i]]), noise_for(0, i, t, latents.shape[1:])[None], \
        torch.tensor([t])


def test_the_validation_loss_is_unweighted_where_training_weighs_by_sigma_sqrt(short, shapes_data):
    """With ``loss_weighting: sigma_sqrt`` (1 / t^2: infinite at t = 0) training weighs each sample's MSE; validation
    reports the MSE itself, at t = 0 too."""
    from dataclasses import replace

    from train.callbacks.validation import loss_sums, read_held_out

    model = short

    held = read_held_out(str(shapes_data / "eval" / "32"), 32, 2, 0, 1)
    kept = model.flow
    try:
        model.flow = replace(kept, weighting="sigma_sqrt")
        sums = loss_sums(model, held, [0, 500], 0, 2)
        outputs = model.denoise(*_held_one(model, held, 0, 500))
        assert torch.allclose(model.per_sample_loss(outputs), 4 * torch.nn.functional.mse_loss(*outputs[:2]))
    finally:
        model.flow = kept
    for k, t in enumerate([0, 500]):
        by_hand = sum(torch.nn.functional.mse_loss(*model.denoise(*_held_one(model, held, i, t))[:2]).double()
                      for i in range(2))
        assert torch.isfinite(sums[k, 0]) and torch.allclose(sums[k, 0], by_hand, rtol=1e-5), (t, sums[k], by_hand)


def test_tiny_flux_refuses_fewer_t5_tokens_than_its_clip_ids(shapes_data, components):
    over = tiny_overrides(shapes_data, components, Path("unused"), res=32, **{"model.text_tokens": 19})
    with pytest.raises(WorkbenchError, match="'model.text_tokens' must be at least 20 for tiny-flux") as e:
        build_model(load_config(CONFIG, over))
    assert "\n" not in str(e.value)


GUIDED = {"model.transformer": '{"guidance_embeds": true}', "model.guidance_scale": 4.0, "model.text_tokens": 20}


@pytest.fixture(scope="module")
def guided(shapes_data, components):
    """tiny-flux with Flux.1-dev's guidance input, told guidance 4 in training, in eval mode."""
    return build_model(load_config(CONFIG, tiny_overrides(shapes_data, components, Path("unused"), res=32,
                                                          **GUIDED))).eval()


def _fed_and_out(module, call) -> tuple[dict, torch.Tensor]:
    """What ``module``'s first call in ``call`` was given (keywords) and gave (its sample)."""
    seen = []
    hook = module.register_forward_hook(lambda m, a, kw, out: seen.append((kw, out[0] if isinstance(out, tuple)
                                                                           else out.sample)), with_kwargs=True)
    try:
        call()
    finally:
        hook.remove()
    return seen[0]


def test_a_guidance_distilled_transformer_is_told_the_guidance_flux_pipeline_tells_it(guided):
    """FluxPipeline at guidance 4 (the model's ``guidance_scale``) feeds its first step pure noise at t = 1 with the
    guidance as a (B,) float32 tensor; training's denoise at t = 1 feeds the same, and the transformer gives the same
    output."""
    from models.families import pack_latents

    pipe = guided.pipeline_with(guided.transformer)
    pipe.tokenizer_2.model_max_length = 20  # the pipeline pads T5's ids to max_sequence_length, here 20
    noise = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    sampled, sampled_out = _fed_and_out(guided.transformer, lambda: pipe(
        PROMPTS[0], num_inference_steps=1, width=32, height=32, latents=pack_latents(noise), guidance_scale=4.0,
        max_sequence_length=20, output_type="latent"))
    text = guided.encode_text(_ids(guided, PROMPTS[:1]))
    trained, trained_out = _fed_and_out(guided.transformer, lambda: guided.denoise(torch.zeros_like(noise), text, noise,
                                                                                   torch.tensor([1000.0])))
    assert sampled["timestep"].item() == 1.0 and torch.equal(trained["timestep"], sampled["timestep"])
    assert torch.equal(trained["guidance"], sampled["guidance"]) and trained["guidance"].tolist() == [4.0]
    assert trained["guidance"].dtype == sampled["guidance"].dtype == torch.float32
    assert torch.equal(trained["hidden_states"], sampled["hidden_states"])
    assert torch.equal(trained["encoder_hidden_states"], sampled["encoder_hidden_states"])
    assert torch.equal(trained_out, sampled_out)


def test_a_guidance_distilled_tiny_flux_trains_a_step(shapes_data, components, tmp_path):
    """One batch of `dwb train` with the guidance input: the guidance embedder gets gradients (AdamW's moments of its
    weights move) and the weights stay finite."""
    from train.trainer import build_trainer

    over = tiny_overrides(shapes_data, components, tmp_path / "ckpt", res=32, max_duration="1ba", save_interval="1ba",
                          eval_interval="null", preview_interval="null", **{"ema.enabled": "false"}, **GUIDED)
    trainer = build_trainer(load_config(CONFIG, over))
    trainer.fit()
    transformer, optimizer = trainer.state.model.transformer, trainer.state.optimizers[0]
    embedder = list(transformer.time_text_embed.guidance_embedder.parameters())
    assert embedder and all(int(optimizer.state[p]["step"]) == 1 for p in embedder)
    assert all(optimizer.state[p]["exp_avg"].abs().sum() > 0 for p in embedder)
    assert all(torch.isfinite(p).all() for p in transformer.parameters())
    trainer.close()
