"""Fine-tuning a model the user holds (``model.init_from``): the family's recipe builds the training model around the
parts the checkpoint door opens, so before any step it predicts what the source pipeline's own denoiser predicts from
the source pipeline's own text encoding (``encode_prompt``), on the source scheduler's noise schedule. Bases: tiny
random models written by diffusers' ``save_pretrained`` (SD 2 from tests/checkpoints/fixtures.py, SDXL, SD3 with its
CLIP-L, CLIP-G and T5, and Flux.1 from tests/family_fixtures.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.errors import WorkbenchError

PROMPTS = ["a red circle left of a blue square", "two green triangles"]


def init_config(source: Path, *overrides: str):
    from train.config import load_config

    return load_config(None, [f"model.init_from={source}", "data.path=unused", "data.resolution=16",
                              "model.caption_dropout=0", *overrides])


def _source_and_model(source: Path):
    import diffusers

    from models.families import family_of_folder
    from train.trainer import build_model

    family = family_of_folder(source, str(source))
    pipe = getattr(diffusers, family.pipeline).from_pretrained(source)
    model = build_model(init_config(source)).eval()
    return pipe, model


def _noised(latents: torch.Tensor, noise: torch.Tensor, pipe, t: torch.Tensor) -> torch.Tensor:
    """The source scheduler's own noising, as its training scripts call it (DDPM's ``add_noise``)."""
    from diffusers import DDPMScheduler

    return DDPMScheduler.from_config(pipe.scheduler.config).add_noise(latents, noise, t)


def sd2_prediction(pipe, model, latents, noise, t):
    text = pipe.encode_prompt(PROMPTS, "cpu", 1, False)[0]
    source = pipe.unet(_noised(latents, noise, pipe, t), t, encoder_hidden_states=text).sample
    return source, model.denoise(latents, model.encode_captions(PROMPTS), noise, t)[0]


def sdxl_prediction(pipe, model, latents, noise, t):
    text, _, pooled, _ = pipe.encode_prompt(PROMPTS, device="cpu", do_classifier_free_guidance=False)
    side = latents.shape[-1] * pipe.vae_scale_factor
    ids = pipe._get_add_time_ids((side, side), (0, 0), (side, side), text.dtype,
                                 text_encoder_projection_dim=pipe.text_encoder_2.config.projection_dim).repeat(2, 1)
    source = pipe.unet(_noised(latents, noise, pipe, t), t, encoder_hidden_states=text,
                       added_cond_kwargs={"text_embeds": pooled, "time_ids": ids}).sample
    return source, model.denoise(latents, model.encode_captions(PROMPTS), noise, t)[0]


def flux_prediction(pipe, model, latents, noise, t):
    """FluxPipeline's own packing and ids around the source transformer, noised on the flow's straight path."""
    text, pooled, text_ids = pipe.encode_prompt(PROMPTS, device="cpu", max_sequence_length=model.text_tokens)
    sigma = t.float() / 1000
    noisy = (1 - sigma.view(-1, 1, 1, 1)) * latents + sigma.view(-1, 1, 1, 1) * noise
    b, c, h, w = latents.shape
    ids = pipe._prepare_latent_image_ids(b, h // 2, w // 2, "cpu", latents.dtype)
    out = pipe.transformer(hidden_states=pipe._pack_latents(noisy, b, c, h, w), timestep=sigma,
                           guidance=torch.full((b,), model.guidance_scale), pooled_projections=pooled,
                           encoder_hidden_states=text, txt_ids=text_ids, img_ids=ids).sample
    source = pipe._unpack_latents(out, h * pipe.vae_scale_factor, w * pipe.vae_scale_factor, pipe.vae_scale_factor)
    return source, model.denoise(latents, model.encode_captions(PROMPTS), noise, t)[0]


def sd3_prediction(pipe, model, latents, noise, t):
    """StableDiffusion3Pipeline's own encoding (CLIP-L, CLIP-G and T5, at the run's T5 tokens) around the source
    transformer, noised on the flow's straight path."""
    text, _, pooled, _ = pipe.encode_prompt(PROMPTS, PROMPTS, PROMPTS, device="cpu", do_classifier_free_guidance=False,
                                            max_sequence_length=model.text_tokens)
    sigma = (t.float() / 1000).view(-1, 1, 1, 1)
    source = pipe.transformer(hidden_states=(1 - sigma) * latents + sigma * noise, timestep=t.float(),
                              encoder_hidden_states=text, pooled_projections=pooled).sample
    return source, model.denoise(latents, model.encode_captions(PROMPTS), noise, t)[0]


PREDICTIONS = {"sd2": (sd2_prediction, 4, 4), "sdxl": (sdxl_prediction, 4, 8), "sd3": (sd3_prediction, 16, 8),
               "flux": (flux_prediction, 16, 8)}


@pytest.mark.parametrize("family", ["sd2", "sdxl", "sd3", "flux"])
@torch.no_grad()
def test_a_full_fine_tune_predicts_at_step_0_what_the_source_pipeline_predicts(family, sd2_folder, family_folders):
    source_folder = sd2_folder if family == "sd2" else family_folders["flux-dev" if family == "flux" else family]
    pipe, model = _source_and_model(source_folder)
    predicted, channels, side = PREDICTIONS[family]
    source_weights = getattr(pipe, model.denoiser_name).state_dict()
    assert all(torch.equal(w, source_weights[k]) for k, w in model.denoiser.state_dict().items())
    assert all(p.requires_grad for p in model.denoiser.parameters())  # a full fine-tune trains every weight
    assert not any(p.requires_grad for p in model.vae.parameters())
    gen = torch.Generator().manual_seed(3)
    latents, noise = (torch.randn(2, channels, side, side, generator=gen) for _ in range(2))
    t = torch.tensor([100, 700])
    source, ours = predicted(pipe, model, latents, noise, t)
    assert source.abs().mean() > 0.01
    torch.testing.assert_close(ours, source, rtol=0, atol=1e-5)


def test_the_run_takes_the_source_schedule_and_prediction_type(sd2_folder):
    """The SD 2 base predicts v (its scheduler says so), and the run does, whatever model.prediction_type says."""
    from train.trainer import build_model

    model = build_model(init_config(sd2_folder, "model.prediction_type=epsilon"))
    assert model.prediction_type == "v_prediction" and model.family == "sd2"
    assert model.source["kind"] == "diffusers" and len(model.source["content_hash"]) >= 8


def test_sd3s_clip_g_ids_are_clip_ls_with_its_own_padding(family_folders):
    """Stability's CLIP-G tokenizer pads with "!": the ids made from CLIP-L's are the ones it makes itself."""
    from transformers import CLIPTokenizer

    from train.data import token_ids
    from train.recipes.sd3 import ClipIds

    folder = family_folders["sd3"]
    clip_l = CLIPTokenizer.from_pretrained(folder / "tokenizer")
    clip_g = CLIPTokenizer.from_pretrained(folder / "tokenizer_2", pad_token="!")
    captions = [*PROMPTS, "", "a " * 100]  # the empty caption, and one cut at 77 tokens
    want = token_ids(clip_g, captions)
    assert not torch.equal(want, token_ids(clip_l, captions))  # else the padding made no difference
    assert torch.equal(ClipIds(clip_l, clip_g)(token_ids(clip_l, captions)), want)
    other = CLIPTokenizer.from_pretrained(folder / "tokenizer", model_max_length=32)
    with pytest.raises(WorkbenchError, match=r"^config key 'model.init_from': SD3's two CLIP tokenizers [^\n]*$"):
        ClipIds(clip_l, other)


def test_load_path_at_an_exported_folder_says_what_it_takes_and_points_to_init_from(sd2_folder):
    from train.config import load_config
    from train.trainer import checked_load_path

    cfg = load_config(None, ["data.path=unused", f"load_path={sd2_folder}"])
    with pytest.raises(WorkbenchError, match=r"^config key 'load_path' takes a Composer checkpoint .* "
                                             r"model.init_from=[^\n]*$"):
        checked_load_path(cfg, {})


def test_one_of_our_checkpoints_starts_a_fine_tune_from_its_ema_weights(tiny_run):
    """A Composer checkpoint of the tiny architecture: the run's UNet is the checkpoint's EMA UNet, as every command
    opens it, and the architecture's family (SD 2's layout) trains it."""
    from models.checkpoints import model_weights, read_checkpoint
    from train.trainer import build_model

    path = tiny_run / "ep0-ba4-rank0.pt"
    model = build_model(init_config(path))
    ema = {k[len("unet."):]: v for k, v in model_weights(read_checkpoint(path), ema=True).items()
           if k.startswith("unet.")}
    raw = model_weights(read_checkpoint(path), ema=False)
    assert any(not torch.equal(ema[k], raw["unet." + k]) for k in ema)  # else EMA and raw could not be told apart
    assert model.source["kind"] == "composer"
    assert all(torch.equal(w, ema[k]) for k, w in model.unet.state_dict().items())
