"""Adapter files read back by the outside readers: a LoRA added by peft to each family's tiny denoiser, written by
``write_adapter``, loaded by plain diffusers (``load_lora_weights``, and its kohya converter for kohya files) into
a fresh copy of the base, draws the image the adapted model in memory draws, at strength 1 and 0.5."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from models.adapters import add_adapter, check_adapter_file, write_adapter
from models.adapters.presets import FLUX_TARGETS
from models.errors import WorkbenchError

from .adapted import denoiser_of, draw, fresh, pipeline, randomize

ATOL = 1e-5  # measured: 0 for the UNets, under 1e-6 for SD3 and Flux.1; each adapter moves pixels by 0.18 or more


def _adapted(family, family_folders, **options) -> dict:
    """The family's pipe, its denoiser adapted (random weights, alpha 8 over rank 4: a scale of 2 that a file must
    carry), the base denoiser's copy, and the images drawn before and after (at strength 1 and 0.5)."""
    pipe = pipeline(family, family_folders)
    denoiser = denoiser_of(pipe, family)
    base = copy.deepcopy(denoiser)
    base_image = draw(pipe, family)
    add_adapter(denoiser, family, **{"alpha": 8, **options})
    randomize(denoiser)
    full, half = draw(pipe, family), draw(pipe, family, scale=0.5)
    for a, b in ((full, base_image), (half, full), (half, base_image)):  # else the comparisons prove nothing
        assert np.abs(a - b).max() > 0.02, "the adapter, or its strength, changed no pixel"
    return {"pipe": pipe, "base": base, "base_image": base_image, "full": full, "half": half}


@pytest.fixture(scope="module")
def adapted(family_folders):
    """family -> ``_adapted`` with the family's preset, made once for this module's tests."""
    made = {}

    def get(family):
        if family not in made:
            made[family] = _adapted(family, family_folders)
        return made[family]

    return get


def _draws_as_adapted(path, family: str, got: dict) -> None:
    """Plain diffusers, given the file on a fresh copy of the base, draws the adapted image at strength 1 and 0.5."""
    loaded = fresh(got["pipe"], family, got["base"])
    loaded.load_lora_weights(path, adapter_name="style")
    np.testing.assert_allclose(draw(loaded, family), got["full"], atol=ATOL)
    loaded.set_adapters("style", adapter_weights=0.5)
    np.testing.assert_allclose(draw(loaded, family), got["half"], atol=ATOL)


@pytest.mark.parametrize("family", ["sd1", "sd2", "sdxl", "sd3", "flux"])
def test_the_diffusers_file_draws_the_adapted_image_in_plain_diffusers_at_full_and_half_strength(
        family, adapted, tmp_path):
    got = adapted(family)
    path = write_adapter(denoiser_of(got["pipe"], family), family, tmp_path / f"{family}.safetensors")
    assert check_adapter_file(path, got["base"], family).layout == "diffusers"

    _draws_as_adapted(path, family, got)


@pytest.mark.parametrize("family", ["sd1", "sd2", "sdxl"])
def test_the_kohya_file_read_by_diffusers_kohya_converter_draws_the_adapted_image(family, adapted, tmp_path):
    got = adapted(family)
    path = write_adapter(denoiser_of(got["pipe"], family), family, tmp_path / f"{family}-kohya.safetensors",
                         layout="kohya")
    assert check_adapter_file(path, got["base"], family).layout == "kohya"

    _draws_as_adapted(path, family, got)


def test_the_flux_kohya_file_with_fused_qkv_draws_the_adapted_image(family_folders, tmp_path):
    """Flux.1's kohya layer joins a block's query, key and value (``img_attn_qkv``): the three LoRAs travel as one
    of three times the rank, which diffusers' converter splits back. Checked on the double blocks: the converter
    splits a single block's fused ``linear1`` at Flux.1's full widths (3072, 3072, 3072, 12288), which the 32-wide
    tiny model does not have (test_kohya_layout.py checks ``linear1`` at full width)."""
    got = _adapted("flux", family_folders, targets=[f"transformer_blocks.0.{t}" for t in FLUX_TARGETS])
    path = write_adapter(denoiser_of(got["pipe"], "flux"), "flux", tmp_path / "flux-kohya.safetensors",
                         layout="kohya")
    assert check_adapter_file(path, got["base"], "flux").layout == "kohya"

    loaded = fresh(got["pipe"], "flux", got["base"])
    loaded.load_lora_weights(path, adapter_name="style")
    np.testing.assert_allclose(draw(loaded, "flux"), got["full"], atol=ATOL)
    loaded.set_adapters("style", adapter_weights=0.5)
    np.testing.assert_allclose(draw(loaded, "flux"), got["half"], atol=ATOL)


def test_a_kohya_sdxl_file_under_the_original_unets_names_is_checked_and_drawn_the_same(adapted, tmp_path):
    """kohya's own SDXL LoRAs name the attention blocks as the original UNet does (``input_blocks_4_1_...``):
    the same file under those names passes the check and diffusers (its ``_maybe_map_sgm_blocks_to_diffusers``)
    draws the same image from it."""
    from safetensors.torch import load_file, save

    from models.adapters.reading import _ldm_names

    got = adapted("sdxl")
    path = write_adapter(denoiser_of(got["pipe"], "sdxl"), "sdxl", tmp_path / "diffusers-names.safetensors",
                         layout="kohya")
    renames = {"lora_unet_" + k.replace(".", "_") + "_": "lora_unet_" + v.replace(".", "_") + "_"
               for k, v in _ldm_names(got["base"]).items()}
    tensors = {}
    for key, value in load_file(path).items():
        old = next((o for o in renames if key.startswith(o)), None)
        tensors[key if old is None else renames[old] + key[len(old):]] = value
    assert sum(k.startswith(("lora_unet_input_blocks", "lora_unet_output_blocks")) for k in tensors) > 10
    original = tmp_path / "original-names.safetensors"
    original.write_bytes(save(tensors))
    assert check_adapter_file(original, got["base"], "sdxl").layers == check_adapter_file(path, got["base"],
                                                                                           "sdxl").layers
    loaded = fresh(got["pipe"], "sdxl", got["base"])
    loaded.load_lora_weights(original)
    np.testing.assert_allclose(draw(loaded, "sdxl"), got["full"], atol=ATOL)


def test_a_dora_file_keeps_its_magnitudes_and_plain_diffusers_draws_the_dora_image(family_folders, tmp_path):
    got = _adapted("sd2", family_folders, kind="dora")
    path = write_adapter(denoiser_of(got["pipe"], "sd2"), "sd2", tmp_path / "dora.safetensors")
    info = check_adapter_file(path, got["base"], "sd2")
    assert info.kind == "dora"
    loaded = fresh(got["pipe"], "sd2", got["base"])
    loaded.load_lora_weights(path, adapter_name="style")
    assert any("lora_magnitude_vector" in name for name, _ in loaded.unet.named_parameters())
    np.testing.assert_allclose(draw(loaded, "sd2"), got["full"], atol=ATOL)
    loaded.set_adapters("style", adapter_weights=0.5)
    np.testing.assert_allclose(draw(loaded, "sd2"), got["half"], atol=ATOL)


def test_diffusers_drops_dora_scale_from_a_kohya_file_so_dora_is_not_written_in_that_layout(family_folders, tmp_path):
    """What diffusers 0.39 does with DoRA under kohya's names (LyCORIS' ``dora_scale``): its loader filters the
    magnitudes out with a warning and loads a plain LoRA. ``write_adapter`` therefore refuses DoRA in the kohya
    layout, in one line; the diffusers layout keeps them (the test above)."""
    from safetensors.torch import save

    from models.adapters import lora_weights
    from models.adapters.kohya import kohya_tensors

    pipe = pipeline("sd2", family_folders)
    base = copy.deepcopy(pipe.unet)
    add_adapter(pipe.unet, "sd2", kind="dora")
    randomize(pipe.unet)
    with pytest.raises(WorkbenchError, match=r"^a dora adapter is not written in the kohya layout .*dora_scale[^\n]*$"):
        write_adapter(pipe.unet, "sd2", tmp_path / "dora-kohya.safetensors", layout="kohya")

    tensors = kohya_tensors(lora_weights(pipe.unet), dict(pipe.unet.named_modules()), "sd2")
    for path, layer in pipe.unet.named_modules():
        if hasattr(layer, "lora_magnitude_vector") and "default" in layer.lora_magnitude_vector:
            key = "lora_unet_" + path.replace(".", "_") + ".dora_scale"
            tensors[key] = layer.lora_magnitude_vector["default"].weight.detach()[:, None].contiguous()
    (tmp_path / "k.safetensors").write_bytes(save(tensors))
    assert check_adapter_file(tmp_path / "k.safetensors", base, "sd2").kind == "dora"
    loaded = fresh(pipe, "sd2", base)
    loaded.load_lora_weights(tmp_path / "k.safetensors")
    names = [name for name, _ in loaded.unet.named_parameters()]
    assert any("lora_A" in n for n in names) and not any("magnitude" in n for n in names)
