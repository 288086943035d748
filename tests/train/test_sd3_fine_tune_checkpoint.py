"""A full fine-tune of an SD3 the user holds, with its CLIP-L, CLIP-G and T5 (``model.init_from``): its checkpoint's
spec describes the three towers and their own tokenizers, so `dwb sample` and `dwb export` open it through the
checkpoint door and draw what the trained model draws; previews draw with the run's ``model.text_tokens`` T5 tokens,
as training read them, not the pipeline's default 256. Base: the tiny SD3 written by diffusers' ``save_pretrained``
(tests/family_fixtures.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

PROMPT = "a red circle left of a blue square"
TOKENS = 12  # the run's T5 tokens: fewer than the pipeline's default 256, which would draw another image


@pytest.fixture(scope="module")
def sd3_run(shapes_data, family_folders, tmp_path_factory):
    """(the run's overrides, its checkpoint): one batch of 2 at a high lr (the image must move), no EMA."""
    from train.config import load_config
    from train.trainer import train

    folder = tmp_path_factory.mktemp("sd3-fine-tune") / "checkpoints"
    keys = [f"model.init_from={family_folders['sd3']}", f"data.path={shapes_data / '16'}", "data.resolution=16",
            f"model.text_tokens={TOKENS}", "global_train_batch_size=2", "device_train_microbatch_size=2",
            "optimizer.lr=0.02", "scheduler.t_warmup=0ba", "max_duration=1ba", "save_interval=1ba",
            "ema.enabled=false", "eval_interval=null", "progress_bar=false", "loggers=[]", f"save_folder={folder}"]
    train(load_config(None, keys))
    return keys, folder / "ep0-ba1-rank0.pt"


def drawn(pipe) -> np.ndarray:
    from models.generation import Settings, generate_images

    return generate_images(pipe, [PROMPT], [7], Settings(steps=2, guidance=2.0, width=16, height=16,
                                                         sampler="Euler"))[0]


def test_sample_and_export_open_the_three_tower_fine_tune_and_draw_what_it_draws_at_its_t5_tokens(
        sd3_run, family_folders, dwb, tmp_path):
    import diffusers

    from models.checkpoints import model_weights, read_checkpoint
    from models.families import family_named
    from train.config import load_config
    from train.trainer import build_model

    keys, checkpoint = sd3_run
    spec = read_checkpoint(checkpoint)["spec"]
    assert {"text_encoder_2", "text_encoder_3", "tokenizer_2", "tokenizer_3"} <= set(spec)
    assert spec["text_encoder_3"]["model_type"] == "t5" and spec["text_tokens"] == TOKENS
    model = build_model(load_config(None, keys)).eval()
    model.load_state_dict(model_weights(read_checkpoint(checkpoint), ema=False), strict=True)
    trained = model.pipeline_with(model.transformer)  # as previews draw
    assert family_named("sd3").text_length(trained) == {"max_sequence_length": TOKENS}
    want = drawn(trained)
    base = diffusers.StableDiffusion3Pipeline.from_pretrained(family_folders["sd3"])
    assert np.abs(want.astype(int) - drawn(base)).max() > 2, "the fine-tune changed no pixel"

    def plain(tokens: int) -> np.ndarray:  # SD3's own pipeline call at that many T5 tokens
        image = trained(PROMPT, num_inference_steps=2, guidance_scale=2.0, width=16, height=16,
                        max_sequence_length=tokens, generator=torch.Generator("cpu").manual_seed(7),
                        output_type="np").images[0]
        return (image * 255).round().astype(np.uint8)

    assert np.array_equal(want, plain(TOKENS)) and not np.array_equal(want, plain(256))
    out = tmp_path / "sample.png"
    done = dwb("sample", str(checkpoint), str(out), "--prompt", PROMPT, "--seed", "7", "--steps", "2",
               "--guidance", "2", "--size", "16", "--sampler", "Euler", "--seeds", "1", "--per-image")
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.asarray(Image.open(tmp_path / "sample" / "00000-7.png").convert("RGB")), want)
    folder = tmp_path / "exported"
    done = dwb("export", str(checkpoint), str(folder))
    assert done.returncode == 0, done.stderr
    exported = diffusers.StableDiffusion3Pipeline.from_pretrained(folder)  # plain diffusers, T5 included
    assert exported.text_encoder_3 is not None
    np.testing.assert_array_equal(drawn(exported), want)


def test_class_images_are_drawn_at_the_runs_t5_tokens(family_folders, tmp_path):
    """`dwb data dreambooth --class-text-tokens` draws the base's class images as SD3's pipeline draws at that many
    T5 tokens, the count the run trains with, and keeps them apart from those at the pipeline's default."""
    import diffusers

    from train.data import ClassPrompt, cached_class_images
    from train.data.class_images import cache_key

    request = ClassPrompt(str(family_folders["sd3"]), PROMPT, 1, 16, seed=7, steps=2, guidance=2.0, sampler="Euler",
                          text_tokens=TOKENS)
    files, drawn_now = cached_class_images(request, tmp_path, device="cpu", say=lambda _: None)
    base = diffusers.StableDiffusion3Pipeline.from_pretrained(family_folders["sd3"])
    base.set_progress_bar_config(disable=True)
    image = base(PROMPT, num_inference_steps=2, guidance_scale=2.0, width=16, height=16, max_sequence_length=TOKENS,
                 generator=torch.Generator("cpu").manual_seed(7), output_type="np").images[0]
    assert drawn_now == 1
    np.testing.assert_array_equal(np.asarray(Image.open(files[0]).convert("RGB")),
                                  (image * 255).round().astype(np.uint8))
    default = ClassPrompt(**{**request.__dict__, "text_tokens": None})
    assert cache_key(default, "hash", "stored") != cache_key(request, "hash", "stored")  # kept apart in the cache
