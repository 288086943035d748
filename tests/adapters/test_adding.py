"""``add_adapter``: the family's preset through peft, and every bad value refused in one line before the denoiser
changes; ``write_adapter``'s refusals."""
from __future__ import annotations

import pytest

from models.adapters import PRESETS, add_adapter, adapter_kind, write_adapter
from models.errors import WorkbenchError

from .adapted import tiny_unet


@pytest.fixture
def unet():
    return tiny_unet()


@pytest.mark.parametrize("kind", ["lora", "dora", "loha", "lokr"])
def test_the_preset_fills_what_is_not_given(unet, kind):
    config = add_adapter(unet, "sd2", kind=kind, rank=8)
    preset = PRESETS["sd2"]
    assert adapter_kind(config) == kind and config.r == 8
    assert set(config.target_modules) == set(preset.targets)
    assert (config.lora_alpha if kind in ("lora", "dora") else config.alpha) == preset.alpha
    adapted = {name.rsplit(".", 1)[0] for name, _ in unet.named_modules() if name.endswith(".base_layer")}
    assert adapted == {name for name, _ in unet.named_modules()
                       if name.endswith(tuple(f".{t}" for t in preset.targets))}


@pytest.mark.parametrize("options, message", [
    ({"kind": "lycoris"}, r"unknown adapter kind 'lycoris'; the kinds are: lora, dora, loha, lokr"),
    ({"targets": ["to_q", "attn.qkv"]}, r"adapter target 'attn.qkv' names no Linear or Conv2d layer"),
    ({"targets": []}, r"an adapter needs at least one target module"),
    ({"rank": 0}, r"adapter rank 0 is outside 1 to 4096"),
    ({"rank": 2.5}, r"adapter rank 2.5 is not an integer"),
    ({"alpha": float("nan")}, r"adapter alpha nan is outside"),
    ({"dropout": 1.0}, r"adapter dropout 1.0 is outside 0 to 0.99"),
])
def test_a_bad_value_is_one_line_and_leaves_the_denoiser_as_it_was(unet, options, message):
    before = {k: v.clone() for k, v in unet.state_dict().items()}
    with pytest.raises(WorkbenchError, match=rf"^{message}[^\n]*$"):
        add_adapter(unet, "sd2", **options)
    assert not getattr(unet, "peft_config", None)
    assert unet.state_dict().keys() == before.keys()


@pytest.mark.filterwarnings("ignore:Already found a `peft_config`")  # peft's note on a second adapter
def test_a_second_adapter_of_the_same_name_is_refused_and_another_name_is_added(unet):
    add_adapter(unet, "sd2")
    with pytest.raises(WorkbenchError, match=r"^the UNet2DConditionModel already holds an adapter named 'default'$"):
        add_adapter(unet, "sd2")
    add_adapter(unet, "sd2", name="second", targets=["to_q"])  # targets found through peft's wrappers
    assert set(unet.peft_config) == {"default", "second"}


@pytest.mark.parametrize("family, layout, name, message", [
    ("sd3", "kohya", "a.safetensors", r"kohya layout is written for sd1, sd2, sdxl, flux, not sd3"),
    ("sd2", "comfy", "a.safetensors", r"unknown adapter layout 'comfy'; the layouts are: diffusers, kohya, peft"),
    ("sd2", "diffusers", "a.pt", r"an adapter file is written as \.safetensors"),
    ("sd9", "diffusers", "a.safetensors", r"unknown model family 'sd9'"),
])
def test_write_adapter_refuses_in_one_line(unet, tmp_path, family, layout, name, message):
    add_adapter(unet, "sd2")
    with pytest.raises(WorkbenchError, match=message) as refused:
        write_adapter(unet, family, tmp_path / name, layout=layout)
    assert "\n" not in str(refused.value) and not (tmp_path / name).exists()
