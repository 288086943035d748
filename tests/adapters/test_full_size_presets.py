"""The full-size LoRA configs (configs/sdxl-lora.yaml, sd35-lora.yaml, flux-dev-lora.yaml) build offline: each reads
as a training config, and its adapter, added by peft to the family's full-size denoiser on the meta device
(``adapter_size``: nothing downloaded, nothing allocated), has the weights its config's comment states: rank x (in +
out) for every Linear layer its targets name, as peft matches a target (the path, or a path ending in "." + it)."""
from __future__ import annotations

import re

import pytest
import torch

from ..conftest import REPO

CONFIGS = ["sdxl-lora.yaml", "sd35-lora.yaml", "flux-dev-lora.yaml"]


def stated(config: str) -> tuple[int, int, int]:
    """(weights, MB in float32, MB in float16) as the config's comment states them."""
    comment = " ".join(line.lstrip("# ") for line in (REPO / "configs" / config).read_text().splitlines())
    m = re.search(r"\(([\d,]+) weights, (\d+) MB in float32, (\d+) MB in float16", comment)
    assert m, f"{config} states no adapter size"
    return int(m.group(1).replace(",", "")), int(m.group(2)), int(m.group(3))


@pytest.mark.parametrize("config", CONFIGS)
def test_each_full_size_lora_config_builds_offline_and_states_its_adapters_size(config):
    from models.adapters import preset_of
    from models.adapters.sizing import adapted_on_meta, variant_of_hub_id
    from train.config import load_config

    cfg = load_config(REPO / "configs" / config)
    a = cfg.adapter
    size, denoiser = adapted_on_meta(cfg.model.init_from, a.type, a.rank, a.alpha, a.targets)
    targets = a.targets or preset_of(variant_of_hub_id(cfg.model.init_from)[0].name).targets
    layers = {}  # the base model's Linear layers the targets name (peft wraps each: its base_layer)
    for path, m in denoiser.named_modules():
        path = path.removesuffix(".base_layer")
        if isinstance(m, torch.nn.Linear) and "lora_" not in path and any(
                path == t or path.endswith("." + t) for t in targets):
            layers[path] = m
    expected = sum(a.rank * (m.in_features + m.out_features) for m in layers.values())
    assert layers and size.parameters == expected and size.rank == a.rank
    weights, mb32, mb16 = stated(config)
    assert (size.parameters, round(size.file_bytes() / 1e6), round(size.file_bytes("float16") / 1e6)) == \
        (weights, mb32, mb16)
    assert size.parameters < size.denoiser_parameters / 50  # the base stays out of every file
