"""A fine-tune of a model the user holds (``model.init_from``) on aspect-ratio buckets: before any step, the training
model predicts in every bucket what the source pipeline's own UNet predicts from its own ``encode_prompt`` and its own
size-and-crop time ids (``_get_add_time_ids``) of each image's recorded original size and crop; then the run trains
through its buckets. Base: the tiny SDXL written by diffusers' ``save_pretrained`` (tests/family_fixtures.py), the
family whose UNet is conditioned on each image's size and crop; data: shapes scenes, three in four wide or tall,
converted into the 24x40, 32x32 and 40x24 buckets of a 32 px budget."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def wide_shapes(tmp_path_factory):
    from train.shapes import write_shapes_dataset

    out = tmp_path_factory.mktemp("wide-shapes")
    write_shapes_dataset(out, 12, seed=6, sizes=(32,), n_eval=1, wide=0.75, workers=1, progress=False)
    return out / "32"


def first_batch_of_each_bucket(loader) -> dict[tuple[int, int], dict]:
    """(height, width) -> the loader's first batch of that bucket, with its samples' captions (``captions``)."""
    found = {}
    for batch in loader:
        found.setdefault(tuple(batch["image"].shape[-2:]), batch)
        if len(found) == 3:
            break
    for batch in found.values():
        batch["captions"] = [loader.dataset[int(i)]["caption"] for i in batch["sample_id"]]
    return found


def source_prediction(pipe, batch, latents, noise, t):
    """The source UNet on the DDPM-noised latents, conditioned as the SDXL pipeline conditions it, per image."""
    from diffusers import DDPMScheduler

    text, _, pooled, _ = pipe.encode_prompt(batch["captions"], device="cpu", do_classifier_free_guidance=False)
    target = tuple(batch["image"].shape[-2:])
    ids = torch.cat([pipe._get_add_time_ids(tuple(size.tolist()), tuple(crop.tolist()), target, text.dtype,
                                            text_encoder_projection_dim=pipe.text_encoder_2.config.projection_dim)
                     for size, crop in zip(batch["original_size"], batch["crop_top_left"])])
    noisy = DDPMScheduler.from_config(pipe.scheduler.config).add_noise(latents, noise, t)
    return pipe.unet(noisy, t, encoder_hidden_states=text,
                     added_cond_kwargs={"text_embeds": pooled, "time_ids": ids}).sample


def test_a_fine_tune_on_aspect_buckets_predicts_the_sources_prediction_in_each_bucket_and_trains(
        family_folders, wide_shapes, tmp_path):
    import diffusers

    from train.config import load_config
    from train.trainer import build_model, train, training_dataloader

    keys = [f"model.init_from={family_folders['sdxl']}", f"data.path={wide_shapes}", "data.resolution=32",
            "data.aspect_buckets=true", "model.caption_dropout=0", "global_train_batch_size=2",
            "device_train_microbatch_size=2", "randomness=per_sample", "max_duration=2ba", "save_interval=2ba",
            "scheduler.t_warmup=0ba", "eval_interval=null", "progress_bar=false", "loggers=[]",
            f"save_folder={tmp_path / 'checkpoints'}"]
    cfg = load_config(None, keys)
    model = build_model(cfg).eval()
    pipe = diffusers.StableDiffusionXLPipeline.from_pretrained(family_folders["sdxl"])
    batches = first_batch_of_each_bucket(training_dataloader(cfg, model))
    assert sorted(batches) == [(24, 40), (32, 32), (40, 24)]
    assert any((b["original_size"] != torch.tensor(side)).any() for side, b in batches.items())  # sizes recorded
    gen = torch.Generator().manual_seed(5)
    for side, batch in batches.items():
        with torch.no_grad():
            latents, text = model.latents_and_text(batch)
            noise = torch.randn(latents.shape, generator=gen)
            t = torch.tensor([150, 800])
            ours = model.denoise(latents, text, noise, t)[0]
            source = source_prediction(pipe, batch, latents, noise, t)
        assert ours.shape[-2:] == (side[0] // 2, side[1] // 2) and source.abs().mean() > 0.01
        torch.testing.assert_close(ours, source, rtol=0, atol=1e-5, msg=f"bucket {side}")
    train(load_config(None, keys))
    assert (tmp_path / "checkpoints" / "ep0-ba2-rank0.pt").exists()
