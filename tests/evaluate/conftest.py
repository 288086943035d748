"""Fixtures for the evaluate tests: random Inception-v3 weights, a tiny CLIP and DINOv2, tiny checkpoints."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch



@pytest.fixture(scope="session")
def inception_weights(tmp_path_factory) -> Path:
    """The Inception-v3 architecture torch-fidelity uses, seeded random weights with He initialisation (features
    O(0.1-1) that differ between images; see ``write_random_inception``), saved as a state dict."""
    from evaluate.features import write_random_inception

    return write_random_inception(tmp_path_factory.mktemp("inception"))


@pytest.fixture(scope="session")
def tiny_dinov2(tmp_path_factory) -> Path:
    """A two-layer, 32-wide ``Dinov2Model`` from config, saved as a folder.

    Initialised with a standard deviation of 0.2 instead of the config's default 0.02: at 0.02 the CLS
    token and position embeddings outweigh what the image contributes, and features (about 0.8 in size)
    varied only by 0.04 across images; at 0.2 they vary by about 0.5.
    """
    from transformers import Dinov2Config, Dinov2Model

    out = tmp_path_factory.mktemp("dinov2")
    torch.manual_seed(0)
    Dinov2Model(Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             patch_size=14, image_size=224, initializer_range=0.2)).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_clip(components, tmp_path_factory) -> Path:
    """A CLIP model with small sizes from config, with the tiny tokenizer, saved as a folder."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    out = tmp_path_factory.mktemp("clip")
    tokenizer = CLIPTokenizer.from_pretrained(components / "tokenizer")
    config = CLIPConfig(
        text_config=dict(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=77),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8),
        projection_dim=16)
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(out)
    processor = CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32},
                                                                 crop_size={"height": 32, "width": 32}),
                              tokenizer=tokenizer)
    processor.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def checkpoints(tiny_run) -> Path:
    """Two 16 px checkpoints of the tiny phase 1 (ep0-ba2, ep0-ba4): the suite's shared run."""
    return tiny_run
