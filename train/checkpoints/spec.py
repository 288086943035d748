"""The model spec a checkpoint carries, so any checkpoint can be rebuilt without its config or data.

Saved through a Composer callback's state: architecture, prediction type, the UNet/VAE/text-encoder
configs and the tokenizer's files. Plain dicts, lists and strings only, so checkpoints load with
``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

from composer.core import Callback

SPEC_FORMAT = "diffusion-workbench/1"  # SD 2's layout: a UNet, one CLIP tower, the diffusion schedule
# A model of a family (``train.families``): its denoiser under the family's name for it ("transformer"), how it
# noises ("flow": rectified flow's shift, logit-normal draws and weighting), and its second text tower where it has
# one ("text_encoder_2": SDXL's second CLIP tower, Flux.1's T5; it reads the same tokenizer). Readers take both
# formats.
SPEC_FORMAT_FAMILY = "diffusion-workbench/2"
SPEC_FORMATS = (SPEC_FORMAT, SPEC_FORMAT_FAMILY)


def _plain(value):
    """JSON round trip: tuples to lists, and nothing a weights-only unpickler would refuse."""
    return json.loads(json.dumps(value, default=str))


def make_spec(model, architecture: str, resolution: int, training: dict | None = None,
              recommended: dict | None = None) -> dict:
    """The spec of ``model``; ``training`` (`dwb train`'s data and schedule) is what a model card shows,
    ``recommended`` the generation settings it is meant to be sampled at (``recommended``)."""
    from ..families import family_or_ours
    from .architectures import ARCHITECTURES

    tokenizer_files = {}
    if model.tokenizer is not None:
        with tempfile.TemporaryDirectory() as tmp:
            model.tokenizer.save_pretrained(tmp)
            tokenizer_files = {p.name: p.read_text() for p in Path(tmp).iterdir() if p.is_file()}
    family = ARCHITECTURES.get(architecture, {}).get("family")
    flow = getattr(model, "flow", None)
    second = getattr(model, "text_encoder_2", None)
    return {
        "format": SPEC_FORMAT_FAMILY if family else SPEC_FORMAT,
        "architecture": architecture,
        **({"family": family} if family else {}),
        "prediction_type": model.prediction_type,
        "resolution": resolution,
        family_or_ours(family).denoiser: _plain(dict(model.denoiser.config)),
        **({"flow": _plain(dataclasses.asdict(flow))} if flow is not None else {}),
        "vae": _plain(dict(model.vae.config)),
        "text_encoder": _plain(model.text_encoder.config.to_dict()),
        **({"text_encoder_2": _plain(second.config.to_dict())} if second is not None else {}),
        "tokenizer": tokenizer_files,
        **({"training": _plain(training)} if training else {}),
        **({"recommended": _plain(recommended)} if recommended else {}),
    }


class ModelSpec(Callback):
    """Carries the spec into every checkpoint (Composer saves each callback's ``state_dict``)."""

    def __init__(self, spec: dict):
        self.spec = spec

    def state_dict(self) -> dict:
        return {"spec": self.spec}

    def load_state_dict(self, state: dict) -> None:
        pass  # the spec of the run being trained wins; a mismatch is refused before loading
