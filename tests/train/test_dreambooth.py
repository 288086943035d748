"""`dwb data dreambooth`: a small folder of images into a DreamBooth dataset (captions, a trigger word, repeats,
masks, class images drawn by a base and cached, held-out images), the loss it trains with (masks on the latent
grid, class images weighed by data.prior_loss_weight), hostile folders refused, and a tiny run on one."""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from models.errors import WorkbenchError
from models.datasets import open_local
from train.data import ClassPrompt, cached_class_images, write_dreambooth

from ..checkpoints.fixtures import reduced_pipeline, write_reference_folder
from ..conftest import REPO, tiny_overrides

SIDE = 16
WH = (24, 20)  # the folder's images: width, height (stored with the shorter side at 16: 19 x 16)


def _pixels(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (WH[1], WH[0], 3), dtype=np.uint8)


def write_folder(folder: Path) -> Path:
    """a.png with its caption, b.png without (the template's), c.png with its left half transparent (an alpha
    mask), d.png with a mask file masking its right half out."""
    (folder / "masks").mkdir(parents=True)
    for i, name in enumerate("abd"):
        Image.fromarray(_pixels(i)).save(folder / f"{name}.png")
    (folder / "a.txt").write_text("sks dog  on the\ngrass\n")
    alpha = np.full((WH[1], WH[0], 1), 255, np.uint8)
    alpha[:, :WH[0] // 2] = 0
    Image.fromarray(np.concatenate([_pixels(3), alpha], axis=-1)).save(folder / "c.png")
    mask = np.full((WH[1], WH[0]), 255, np.uint8)
    mask[:, WH[0] // 2:] = 0
    Image.fromarray(mask).save(folder / "masks" / "d.png")
    return folder


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> list[Path]:
    """Two reduced SD 2.x pipelines written by diffusers, of other weights: bases of different content."""
    root = tmp_path_factory.mktemp("bases")
    other = root / "other"
    reduced_pipeline("sd2", "v_prediction", seed=1).save_pretrained(other, safe_serialization=True)
    return [write_reference_folder(root / "reference"), other]


@pytest.fixture(scope="module")
def dreambooth(tmp_path_factory, bases) -> dict:
    """The folder as a dataset at 16 px: template with a trigger word, 3 repeats, alpha masks, the last image (d.png)
    held out, 2 class images drawn by the first base."""
    root = tmp_path_factory.mktemp("dreambooth")
    folder = write_folder(root / "photos")
    prior = ClassPrompt(str(bases[0]), "a photo of a {class}", 2, SIDE, steps=2)
    summary = write_dreambooth(folder, root / "out", sizes=(SIDE,), template="a photo of sks {class}", class_word="dog",
                               repeats=3, alpha_mask=True, hold_out=1, prior=prior, say=lambda line: None)
    return {"root": root, "folder": folder, "out": root / "out", "summary": summary}


def rows(dataset_folder: Path) -> list[dict]:
    data = open_local(dataset_folder)
    return [data[i] for i in range(len(data))]


def test_captions_trigger_word_repeats_masks_and_class_images_land_in_the_dataset(dreambooth):
    samples = rows(dreambooth["out"] / str(SIDE))
    by_source = {}
    for s in samples:
        by_source.setdefault(s["meta"]["source"], []).append(s)
    assert sorted(by_source) == ["a.png", "b.png", "c.png", "class/00000.png", "class/00001.png"]  # d.png held out
    assert [len(by_source[n]) for n in ("a.png", "b.png", "c.png")] == [3, 3, 3]  # repeats
    assert {s["caption"] for s in by_source["a.png"]} == {"sks dog on the grass"}  # its NAME.txt, whitespace folded
    assert {s["caption"] for s in by_source["b.png"] + by_source["c.png"]} == {"a photo of sks dog"}  # the template
    assert {s["caption"] for s in samples if s["prior"]} == {"a photo of a dog"}
    assert [s["meta"]["source"] for s in samples if s["prior"]] == ["class/00000.png", "class/00001.png"]
    assert all(s["image"].size == (19, 16) and s["mask"].size == (19, 16) for s in by_source["a.png"])
    alpha = np.asarray(by_source["c.png"][0]["mask"])
    assert alpha[:, :8].max() == 0 and alpha[:, 11:].min() == 255  # the transparent left half masked out
    assert np.asarray(by_source["a.png"][0]["mask"]).min() == 255  # no mask: every pixel counts
    held = rows(dreambooth["out"] / "eval" / str(SIDE))
    assert [(s["meta"]["source"], s["caption"]) for s in held] == [("d.png", "a photo of sks dog")]
    masked = np.asarray(held[0]["mask"])
    assert masked[:, :8].min() == 255 and masked[:, 11:].max() == 0  # masks/d.png: the right half out
    assert dreambooth["summary"].written == {SIDE: 3 * 3 + 2}


def test_a_template_with_the_caption_in_it_captions_every_image_from_its_file(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in "ab":
        Image.fromarray(_pixels(0)).save(folder / f"{name}.png")
        (folder / f"{name}.txt").write_text(f"{name} on a table")
    write_dreambooth(folder, tmp_path / "out", sizes=(SIDE,), template="sks {class}, {caption}", class_word="mug")
    captions = [s["caption"] for s in rows(tmp_path / "out" / str(SIDE))]
    assert captions == ["sks mug, a on a table", "sks mug, b on a table"]
    (folder / "b.txt").unlink()
    with pytest.raises(WorkbenchError, match=r"b\.png has no b\.txt for the template's \{caption\}"):
        write_dreambooth(folder, tmp_path / "again", sizes=(SIDE,), template="sks {class}, {caption}", class_word="mug")


def test_a_mask_folder_of_its_own_pairs_masks_with_images_by_file_name(tmp_path):
    """kohya's layout: the masks in a folder beside the images' (``--masks``), each named as its image."""
    folder, masks = tmp_path / "photos", tmp_path / "photos_mask"
    folder.mkdir()
    masks.mkdir()
    for name in "ab":
        Image.fromarray(_pixels(0)).save(folder / f"{name}.jpg")
    half = np.full((WH[1], WH[0]), 255, np.uint8)
    half[:WH[1] // 2] = 0  # the top half left out
    Image.fromarray(half).save(masks / "a.png")
    write_dreambooth(folder, tmp_path / "out", sizes=(SIDE,), template="sks", masks=masks)
    a, b = (np.asarray(s["mask"]) for s in rows(tmp_path / "out" / str(SIDE)))
    assert a[:7].max() == 0 and a[9:].min() == 255 and b.min() == 255
    Image.fromarray(half).save(masks / "c.png")
    with pytest.raises(WorkbenchError, match=r"c\.png masks no image"):
        write_dreambooth(folder, tmp_path / "again", sizes=(SIDE,), template="sks", masks=masks)


def test_a_validation_folder_of_its_own_is_the_held_out_split(tmp_path):
    folder, held = tmp_path / "photos", tmp_path / "held"
    for where, names in ((folder, "ab"), (held, "z")):
        where.mkdir()
        for name in names:
            Image.fromarray(_pixels(0)).save(where / f"{name}.png")
    write_dreambooth(folder, tmp_path / "out", sizes=(SIDE,), template="sks {class}", class_word="cup", validation=held)
    assert [s["meta"]["source"] for s in rows(tmp_path / "out" / str(SIDE))] == ["a.png", "b.png"]
    assert [(s["meta"]["source"], s["caption"]) for s in rows(tmp_path / "out" / "eval" / str(SIDE))] == \
        [("z.png", "sks cup")]
    with pytest.raises(WorkbenchError, match="not both"):
        write_dreambooth(folder, tmp_path / "again", sizes=(SIDE,), template="sks", validation=held, hold_out=1)


def test_class_images_come_from_the_generation_path_and_are_drawn_again_only_when_base_or_prompt_changes(
        dreambooth, bases, tmp_path):
    """The dataset's write drew 2 class images of "a photo of a dog" with the first base into ``class-images``
    beside OUT; asking again reuses them, another prompt or another base draws anew."""
    from models.checkpoints import load_pipeline
    from models.generation import generate_images

    cache = dreambooth["root"] / "class-images"

    def draw(base: Path, prompt: str) -> tuple[list[Path], int]:
        return cached_class_images(ClassPrompt(str(base), prompt, 2, SIDE, steps=2), cache, say=lambda _: None)

    files = sorted(cache.glob("*/0000[01].png"))
    stamps = [f.stat().st_mtime_ns for f in files]
    assert draw(bases[0], "a photo of a dog") == (files, 0)  # the same base and prompt: from the cache
    assert [f.stat().st_mtime_ns for f in files] == stamps
    pipe = load_pipeline(bases[0])
    direct = generate_images(pipe, ["a photo of a dog"] * 2, [0, 1], ClassPrompt("x", "x", 1, SIDE, steps=2).settings())
    assert np.array_equal(np.stack([np.asarray(Image.open(f)) for f in files]), direct)  # seed 0 + i, lossless PNG
    other_prompt, drawn = draw(bases[0], "a photo of a cat")
    assert drawn == 2 and other_prompt[0].parent != files[0].parent
    other_base, drawn = draw(bases[1], "a photo of a dog")
    assert drawn == 2 and other_base[0].parent not in (files[0].parent, other_prompt[0].parent)
    assert not np.array_equal(np.asarray(Image.open(other_base[0])), np.asarray(Image.open(files[0])))
    moved = tmp_path / "moved"  # the base by its content, not its path: a link to it draws nothing
    os.symlink(bases[0], moved)
    assert draw(moved, "a photo of a dog") == (files, 0)
    assert draw(bases[1], "a photo of a dog") == (other_base, 0)
    assert sorted(p.name for p in cache.iterdir()) == sorted({f.parent.name for f in files + other_prompt + other_base})


@pytest.fixture(scope="module")
def tiny_model(shapes_data, components, tmp_path_factory):
    """The tiny architecture's model as a run builds it (no min-SNR weighting: the plain loss to compare with)."""
    from train.config import load_config
    from train.recipes import build_model

    cfg = load_config(REPO / "configs/tiny-phase1.yaml", tiny_overrides(
        shapes_data, components, tmp_path_factory.mktemp("unused"), **{"model.min_snr_gamma": "null"}))
    torch.manual_seed(0)
    return build_model(cfg).train()


def direct_masked_mse(pred: np.ndarray, target: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per sample: the mask averaged over each latent cell's pixels, then sum(w e^2) / (C sum(w)), by loops."""
    b, c, h, w = pred.shape
    f = mask.shape[-1] // w
    out = []
    for i in range(b):
        weights = np.array([[mask[i, 0, y * f:(y + 1) * f, x * f:(x + 1) * f].mean() / 255 for x in range(w)]
                            for y in range(h)])
        out.append(sum(weights[y, x] * (pred[i, k, y, x] - target[i, k, y, x]) ** 2
                       for k in range(c) for y in range(h) for x in range(w)) / (c * weights.sum()))
    return np.array(out)


def test_the_masked_loss_equals_the_masked_mse_computed_directly(tiny_model):
    gen = torch.Generator().manual_seed(1)
    pred, target = torch.randn(3, 4, 4, 4, generator=gen), torch.randn(3, 4, 4, 4, generator=gen)
    mask = torch.randint(0, 256, (3, 1, SIDE, SIDE), generator=gen, dtype=torch.uint8)
    mask[2] = 255
    t = torch.tensor([10, 500, 990])
    loss = tiny_model.loss((pred, target, t), {"mask": mask})
    expected = direct_masked_mse(pred.numpy(), target.numpy(), mask.numpy())
    assert loss.item() == pytest.approx(expected.mean(), rel=1e-5)
    unmasked = tiny_model.per_sample_loss((pred, target, t), mask=mask)[2]
    assert unmasked.item() == pytest.approx(((pred[2] - target[2]) ** 2).mean().item(), rel=1e-5)  # all 255: plain MSE


def test_a_zero_mask_on_part_of_the_image_zeroes_that_parts_gradient(tiny_model, components):
    """Through the model's own forward on a batch as the loader ships it: the denoiser's output gets no gradient on
    the latent cells under the masked-out left half, and some on the others."""
    from transformers import CLIPTokenizer

    tokens = CLIPTokenizer.from_pretrained(components / "tokenizer")(["a red circle"] * 2, padding="max_length",
                                                                      return_tensors="pt").input_ids
    mask = torch.full((2, 1, SIDE, SIDE), 255, dtype=torch.uint8)
    mask[:, :, :, :SIDE // 2] = 0
    batch = {"image": torch.randint(0, 256, (2, 3, SIDE, SIDE), dtype=torch.uint8), "input_ids": tokens, "mask": mask}
    outputs = tiny_model(batch)
    outputs[0].retain_grad()
    tiny_model.loss(outputs, batch).backward()
    grad = outputs[0].grad
    assert grad.shape[-1] == 4 and grad[..., :2].abs().max() == 0 and grad[..., 2:].abs().min() > 0
    tiny_model.zero_grad()


def test_the_prior_weight_equals_the_weighted_sum_computed_directly(dreambooth, tiny_model, components):
    """A batch of the DreamBooth dataset through the loader: class images weighed by data.prior_loss_weight, the
    batch's loss (sum over instance samples + 0.3 x sum over class samples) / batch."""
    from transformers import CLIPTokenizer

    from train.config import DataConfig
    from train.data import build_dataloader

    cfg = DataConfig(path=str(dreambooth["out"] / str(SIDE)), resolution=SIDE, shuffle=False, prior_loss_weight=0.3)
    batch = next(iter(build_dataloader(cfg, CLIPTokenizer.from_pretrained(components / "tokenizer"), 11, seed=0)))
    prior = batch["loss_weight"] != 1
    assert prior.tolist() == [False] * 9 + [True] * 2
    assert batch["loss_weight"][prior].tolist() == pytest.approx([0.3] * 2)
    assert batch["mask"].shape == (11, 1, SIDE, SIDE) and (batch["mask"][6:9, :, :, :7] == 0).all()  # c.png's alpha
    with torch.no_grad():
        outputs = tiny_model(batch)
        per_sample = tiny_model.per_sample_loss(outputs, mask=batch["mask"])
        expected = (per_sample[~prior].sum() + 0.3 * per_sample[prior].sum()) / 11
        assert tiny_model.loss(outputs, batch).item() == pytest.approx(expected.item(), rel=1e-6)
    assert (per_sample[6:9] != tiny_model.per_sample_loss(outputs)[6:9]).all()  # the mask changed c.png's loss


def _link_out(folder: Path, outside: Path) -> None:
    (folder / "a.png").unlink()
    os.symlink(outside / "secret.png", folder / "a.png")


def _link_caption(folder: Path, outside: Path) -> None:
    (folder / "a.txt").unlink()
    os.symlink(outside / "secret.txt", folder / "a.txt")


def _link_masks(folder: Path, outside: Path) -> None:
    os.rename(folder / "masks", outside / "masks")
    os.symlink(outside / "masks", folder / "masks")


def _bomb(folder: Path, outside: Path) -> None:
    Image.new("1", (9000, 9000)).save(folder / "e.png")  # 81 MP to decode from a file of about 10 KB
    assert (folder / "e.png").stat().st_size < 100_000


def _huge_caption(folder: Path, outside: Path) -> None:
    (folder / "b.txt").write_bytes(b"x" * (2**20 + 1))


def _not_an_image(folder: Path, outside: Path) -> None:
    (folder / "e.jpg").write_text("#!/bin/sh\necho not an image\n")


def _not_text(folder: Path, outside: Path) -> None:
    (folder / "b.txt").write_bytes(b"\xff\xfe\x00caption")


HOSTILE = {
    "image linked out": (_link_out, r"a\.png is a symbolic link"),
    "caption linked out": (_link_caption, r"a\.txt is a symbolic link"),
    "masks folder linked out": (_link_masks, r"masks/ is a symbolic link"),
    "decompression bomb": (_bomb, r"e\.png is 9000x9000, more than 64 MP to decode"),
    "huge caption": (_huge_caption, r"b\.txt holds more than 1 MiB"),
    "not an image": (_not_an_image, r"e\.jpg is not an image"),
    "caption not UTF-8": (_not_text, r"b\.txt is not UTF-8"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_folders_are_refused_in_one_line(case, tmp_path, dwb):
    outside = tmp_path / "outside"
    outside.mkdir()
    Image.fromarray(_pixels(9)).save(outside / "secret.png")
    (outside / "secret.txt").write_text("AWS_SECRET=hunter2")
    folder = write_folder(tmp_path / "photos")
    make, said = HOSTILE[case]
    make(folder, outside)
    run = dwb("data", "dreambooth", str(folder), str(tmp_path / "out"), "--sizes", str(SIDE),
              "--template", "a photo of sks dog", "--class-prompt", "a photo of a dog", "--class-images", "2",
              "--base", str(tmp_path / "no-such-model"))  # refused before the base is looked for, or anything drawn
    assert run.returncode != 0 and re.search(said, run.stderr), run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "hunter2" not in run.stderr
    assert not (tmp_path / "out").exists()


def test_a_dreambooth_folder_trains_a_few_batches_with_validation_on_the_held_out_image(dreambooth, shapes_data,
                                                                                       components, tmp_path):
    """Full fine-tune of the tiny model, 3 batches of 4 from the DreamBooth dataset: every batch carries its class
    images' weights and its masks into the loss, and the held-out image gives a validation loss."""
    from composer.core import Callback

    from train.callbacks import ValidationLoss
    from train.config import load_config
    from train.trainer import build_trainer

    class Batches(Callback):
        seen: list = []

        def after_loss(self, state, logger) -> None:
            self.seen.append((sorted(state.batch), float(state.loss)))

    out = dreambooth["out"]
    cfg = load_config(REPO / "configs/tiny-phase1.yaml", tiny_overrides(
        shapes_data, components, tmp_path / "checkpoints", **{
            "data.path": out / str(SIDE), "data.prior_loss_weight": 0.5, "validation.path": out / "eval" / str(SIDE),
            "global_train_batch_size": 4, "device_train_microbatch_size": 4, "max_duration": "3ba",
            "save_interval": "3ba", "eval_interval": "3ba", "preview_interval": "null", "ema.enabled": "false",
            "validation.timesteps": "[500]"}))
    trainer = build_trainer(cfg)
    trainer.state.callbacks.append(batches := Batches())
    trainer.fit()
    trainer.close()
    assert len(batches.seen) == 3 and all({"loss_weight", "mask"} <= set(keys) for keys, _ in batches.seen)
    assert all(np.isfinite(loss) for _, loss in batches.seen)
    (validation,) = [c for c in trainer.state.callbacks if isinstance(c, ValidationLoss)]
    assert validation.last["batch"] == 3 and np.isfinite(validation.last["validation/loss"])
    assert (tmp_path / "checkpoints" / "latest-rank0.pt").exists()


def test_a_lora_on_the_base_that_drew_the_class_images_trains_on_the_dreambooth_data(dreambooth, bases, shapes_data,
                                                                                   components, tmp_path):
    """DreamBooth-LoRA: the base that drew the class images, opened by `model.init_from` and adapted by a LoRA, trains
    2 batches on the dataset; every batch carries its loss terms, and the checkpoint names as its adapter's base the
    content hash the class images are cached under."""
    import json

    from composer.core import Callback

    from models.checkpoints import read_summary
    from train.config import load_config
    from train.trainer import build_trainer

    class Batches(Callback):
        seen: list = []

        def after_loss(self, state, logger) -> None:
            self.seen.append((sorted(state.batch), float(state.loss)))

    cfg = load_config(REPO / "configs/tiny-phase1.yaml", tiny_overrides(
        shapes_data, components, tmp_path / "checkpoints", **{
            "model.init_from": bases[0], "adapter.type": "lora", "adapter.rank": 2,
            "data.path": dreambooth["out"] / str(SIDE), "data.prior_loss_weight": 0.5,
            "global_train_batch_size": 4, "device_train_microbatch_size": 4, "max_duration": "2ba",
            "save_interval": "2ba", "eval_interval": "null", "preview_interval": "null", "ema.enabled": "false"}))
    trainer = build_trainer(cfg)
    trainer.state.callbacks.append(batches := Batches())
    trainer.fit()
    trainer.close()
    assert len(batches.seen) == 2 and all({"loss_weight", "mask"} <= set(keys) and np.isfinite(loss)
                                          for keys, loss in batches.seen)
    key = json.loads((Path(dreambooth["summary"].class_folder) / "key.json").read_text())
    adapter = read_summary(tmp_path / "checkpoints" / "latest-rank0.pt")["spec"]["adapter"]
    assert adapter["base"]["content_hash"] == key["base"]


def test_precomputing_a_dreambooth_dataset_is_refused_rather_than_losing_its_masks(dreambooth, components, tmp_path):
    """Latents would drop the masks and class-image flags that weigh its loss: one line, and nothing written."""
    from train.data.precompute import precompute_latents

    out = tmp_path / "latents"
    with pytest.raises(WorkbenchError, match=r"is a DreamBooth dataset \(its mask and prior weigh the loss\)") as e:
        precompute_latents(str(dreambooth["out"]), str(out), vae_ref=str(components), text_encoder_ref=str(components))
    assert "\n" not in str(e.value) and not out.exists()
