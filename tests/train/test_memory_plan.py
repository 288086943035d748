"""The memory plan's frozen parts (``train.trainer.frozen_size``), counted before any is made, against the parts
``build_model`` then makes: the VAE and text towers each tiny recipe loads from ``model.pretrained`` or builds. What
each rank holds in all, per layout, is checked against real runs in test_scale.py and test_multiprocess.py."""
from __future__ import annotations

import shutil

import pytest
import torch

from ..conftest import REPO, tiny_overrides


def frozen_held(model) -> int:
    """Bytes of the frozen parts a built model holds: every parameter and buffer outside its denoiser."""
    from models.checkpoints import module_size

    return sum(module_size(part)[1] for part in model.children() if part is not model.denoiser)


@pytest.mark.parametrize("config", ["tiny-phase1", "tiny-sdxl-phase1", "tiny-mmdit-phase1", "tiny-flux"])
def test_the_plan_counts_the_frozen_parts_each_recipe_makes(config, shapes_data, components, tmp_path):
    """The VAE and CLIP tower from the pretrained files' headers, and the towers the recipe builds (SDXL's second
    CLIP tower, Flux.1's T5, at the tokenizer's vocabulary) on the meta device: what the built model holds."""
    from train.config import load_config
    from train.trainer import build_model, frozen_size

    cfg = load_config(REPO / "configs" / f"{config}.yaml", tiny_overrides(shapes_data, components, tmp_path))
    planned, held = frozen_size(cfg)[1], frozen_held(build_model(cfg))
    assert abs(planned - held) <= 0.01 * held, (planned, held)


def test_half_precision_files_are_planned_as_the_float32_they_load_as(shapes_data, components, tmp_path):
    """A pretrained VAE and text tower saved in float16: their headers declare the values, and the loaders hold
    them in float32, as the plan counts them (twice the bytes of the files' tensors)."""
    from safetensors.torch import load_file, save_file

    from train.config import load_config
    from train.trainer import build_model, frozen_size

    half = tmp_path / "half"
    shutil.copytree(components, half)
    stored = 0
    for file in [*half.glob("vae/*.safetensors"), *half.glob("text_encoder/*.safetensors")]:
        tensors = {k: v.half() if v.is_floating_point() else v for k, v in load_file(file).items()}
        save_file(tensors, file)
        stored += sum(t.numel() * t.element_size() for t in tensors.values())
    cfg = load_config(REPO / "configs" / "tiny-phase1.yaml", tiny_overrides(shapes_data, half, tmp_path / "c"))
    model = build_model(cfg)
    assert {p.dtype for p in (*model.vae.parameters(), *model.text_encoder.parameters())} == {torch.float32}
    planned = frozen_size(cfg)[1]
    assert abs(planned - frozen_held(model)) <= 0.01 * planned and planned > 1.9 * stored
