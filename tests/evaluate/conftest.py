"""Fixtures for the evaluate tests: a randomly initialised Inception-v3 weights file, a tiny CLIP, tiny checkpoints."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ..conftest import REPO, tiny_overrides


@pytest.fixture(scope="session")
def inception_weights(tmp_path_factory) -> Path:
    """The Inception-v3 architecture torch-fidelity uses, random weights (seeded), saved as a state dict."""
    import torch_fidelity.feature_extractor_inceptionv3 as fe

    out = tmp_path_factory.mktemp("inception") / "weights-inception-2015-12-05-6726825d.pth"
    with pytest.MonkeyPatch.context() as mp:  # build the module without its pretrained weights
        mp.setattr(fe, "load_state_dict_from_url", lambda *a, **k: {})
        mp.setattr(fe.FeatureExtractorInceptionV3, "load_state_dict", lambda self, sd, *a, **k: None)
        torch.manual_seed(0)
        model = fe.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
    torch.save(model.state_dict(), out)
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
