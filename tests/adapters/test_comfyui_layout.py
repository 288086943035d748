"""ComfyUI's own LoRA layout (``diffusion_model.`` and the original model's names) for the transformer families, read
by diffusers' own code: SD3's file applied as ComfyUI's ``load_lora`` applies a LoRA (``up @ down * alpha / rank``
added to the original model's weight of the key's name) to the tiny base in Stability's layout, which diffusers'
single-file converter (``convert_sd3_transformer_checkpoint_to_diffusers``) then reads, draws what the diffusers file
draws in plain ``load_lora_weights`` (diffusers 0.39 has no LoRA reader of SD3's original names). Flux.1's file, read
by plain ``load_lora_weights`` (its kohya converter takes ComfyUI's names), is tested on a trained run in
test_adapter_training.py."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from models.adapters import add_adapter, write_adapter
from models.adapters.presets import PRESETS
from models.errors import WorkbenchError
from models.export.comfyui_layout import write_comfyui_adapter

from .adapted import draw, fresh, pipeline, randomize, tiny_unet

ATOL = 1e-5  # the same weights through each file: float rounding (a fused layer's sum in another order)
# beyond the preset's attention: the feed-forwards and modulations, the last block's context modulation among them
# (its halves in the other order in the original), and the last block's context q/k/v without an output projection
SD3_TARGETS = (*PRESETS["sd3"].targets, "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2",
               "norm1.linear", "norm1_context.linear")


def applied_as_comfyui(path, original: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """``original`` (a single file's tensors, its model under ``prefix``) with each LoRA of the ComfyUI-layout file
    added to the weight its key names, ``up @ down * alpha / rank`` (ComfyUI's ``lora`` patch at strength 1)."""
    lora = load_file(path)
    patched = dict(original)
    layers = {k[:-len(".lora_up.weight")] for k in lora if k.endswith(".lora_up.weight")}
    assert layers and len(lora) == 3 * len(layers)  # down, up and alpha of each layer, nothing else
    for layer in layers:
        assert layer.startswith("diffusion_model.")
        weight = prefix + layer[len("diffusion_model."):] + ".weight"
        assert weight in patched, f"{layer} names no weight of the original model"
        up, down = lora[f"{layer}.lora_up.weight"], lora[f"{layer}.lora_down.weight"]
        patched[weight] = patched[weight] + up @ down * (lora[f"{layer}.alpha"].item() / down.shape[0])
    return patched


def test_an_sd3_lora_in_comfyuis_layout_draws_what_the_diffusers_file_draws(family_folders, tmp_path):
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

    from models.export.family_export import sd3_core_entries

    pipe = pipeline("sd3", family_folders)
    base = copy.deepcopy(pipe.transformer)
    base_image = draw(pipe, "sd3")
    add_adapter(pipe.transformer, "sd3", alpha=8, targets=SD3_TARGETS)
    randomize(pipe.transformer, std=0.1)
    write_adapter(pipe.transformer, "sd3", tmp_path / "diffusers.safetensors")
    write_comfyui_adapter(pipe.transformer, "sd3", tmp_path / "comfyui.safetensors")
    assert any(".x_block.attn.qkv." in k for k in load_file(tmp_path / "comfyui.safetensors"))

    loaded = fresh(pipe, "sd3", base)
    loaded.load_lora_weights(tmp_path / "diffusers.safetensors")
    want = draw(loaded, "sd3")
    assert np.abs(want - base_image).max() > 0.02, "the adapter changed no pixel"

    prefix = "model.diffusion_model."
    original = {e.name: e.make() for e in sd3_core_entries(SimpleNamespace(transformer=base, vae=pipe.vae))
                if e.name.startswith(prefix)}
    patched = applied_as_comfyui(tmp_path / "comfyui.safetensors", original, prefix)
    transformer = copy.deepcopy(base)
    transformer.load_state_dict(convert_sd3_transformer_checkpoint_to_diffusers(patched), strict=True)
    np.testing.assert_allclose(draw(fresh(pipe, "sd3", transformer), "sd3"), want, atol=ATOL)


def test_comfyuis_layout_is_refused_for_a_unet_and_for_other_kinds_in_one_line(tmp_path):
    unet = tiny_unet()
    add_adapter(unet, "sd2")
    with pytest.raises(WorkbenchError, match=r"^ComfyUI's layout is written for the transformer families "
                                             r".*kohya[^\n]*$"):
        write_comfyui_adapter(unet, "sd2", tmp_path / "a.safetensors")
    dora = tiny_unet()
    add_adapter(dora, "sd2", kind="dora")
    with pytest.raises(WorkbenchError, match=r"^a dora adapter is not written in ComfyUI's layout[^\n]*$"):
        write_comfyui_adapter(dora, "flux", tmp_path / "b.safetensors")
    assert not list(tmp_path.iterdir())
