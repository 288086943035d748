"""LoHa and LoKr, which diffusers' ``load_lora_weights`` refuses, travel in the peft layout and are read back by
peft itself: the config from the file's metadata, the weights through ``set_peft_model_state_dict``."""
from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from models.adapters import adapter_layers, add_adapter, check_adapter_file, write_adapter
from models.errors import WorkbenchError

from .adapted import pipeline, randomize


def _denoise(unet) -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    sample, states = torch.randn(1, 4, 8, 8, generator=gen), torch.randn(1, 6, 64, generator=gen)
    with torch.no_grad():
        return unet(sample, 10, encoder_hidden_states=states).sample


@pytest.mark.parametrize("kind", ["loha", "lokr"])
def test_a_loha_or_lokr_file_in_the_peft_layout_is_read_back_by_peft_to_the_same_denoiser(kind, family_folders,
                                                                                         tmp_path):
    from peft import PeftConfig, set_peft_model_state_dict

    pipe = pipeline("sd2", family_folders)
    base = copy.deepcopy(pipe.unet)
    add_adapter(pipe.unet, "sd2", kind=kind, alpha=8)
    randomize(pipe.unet)
    adapted = _denoise(pipe.unet)
    assert (adapted - _denoise(base)).abs().max() > 0.05  # else the comparison proves nothing
    with pytest.raises(WorkbenchError, match=rf"^a {kind} adapter is not written in the diffusers layout [^\n]*$"):
        write_adapter(pipe.unet, "sd2", tmp_path / "refused.safetensors")
    path = write_adapter(pipe.unet, "sd2", tmp_path / f"{kind}.safetensors", layout="peft")
    info = check_adapter_file(path, base, "sd2")
    assert (info.layout, info.kind, info.layers) == ("peft", kind, len(adapter_layers(pipe.unet)))

    with safe_open(path, "pt") as f:
        config = PeftConfig.from_peft_type(**json.loads(f.metadata()["peft_config"]))
    fresh = copy.deepcopy(base)
    fresh.add_adapter(config, adapter_name="style")
    result = set_peft_model_state_dict(fresh, {k.removeprefix("unet."): v for k, v in load_file(path).items()},
                                       adapter_name="style")
    assert not result.unexpected_keys
    torch.testing.assert_close(_denoise(fresh), adapted)

    with pytest.raises(ValueError, match="lora"):  # what diffusers 0.39 says of LoHa's and LoKr's names
        type(pipe)(**{**pipe.components, "unet": copy.deepcopy(base)}).load_lora_weights(path)
