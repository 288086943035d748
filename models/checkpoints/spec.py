"""The model spec a checkpoint carries, so any checkpoint can be rebuilt without its config or data.

Saved through a Composer callback's state (``train.callbacks.ModelSpec``): architecture, prediction type, the UNet/VAE/text-encoder
configs and the tokenizer's files (and the second tower's own tokenizer's, where it has one). Plain dicts,
lists and strings only, so checkpoints load with ``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

SPEC_FORMAT = "diffusion-workbench/1"  # SD 2's layout: a UNet, one CLIP tower, the diffusion schedule
# A model of a family (``models.families``): its denoiser under the family's name for it ("transformer"), how it
# noises ("flow": rectified flow's shift, logit-normal draws and weighting), and its second text tower where it has
# one ("text_encoder_2": SDXL's second CLIP tower, Flux.1's T5) with its own tokenizer's files where it has one
# ("tokenizer_2"; without, it reads the first tokenizer's ids); SD3's three towers as its pipeline names them
# ("text_encoder_3": its T5, with "tokenizer_2" CLIP-G's tokenizer and "tokenizer_3" T5's). Readers take both formats.
SPEC_FORMAT_FAMILY = "diffusion-workbench/2"
SPEC_FORMATS = (SPEC_FORMAT, SPEC_FORMAT_FAMILY)


def plain_data(value):
    """JSON round trip: tuples to lists, and nothing a weights-only unpickler would refuse."""
    return json.loads(json.dumps(value, default=str))


def tokenizer_files(tokenizer) -> dict[str, str]:
    """A tokenizer's files as ``{name: text}``, the text files a tokenizer loads from (``tokenizer_files``): a fast
    tokenizer's ``tokenizer.json`` holds the whole tokenizer, so T5's SentencePiece model (binary) is left out, and
    with it a config's ``add_prefix_space`` (FLUX.1's T5 tokenizer sets it), which asks to convert that model again
    (the prefix space is in ``tokenizer.json``'s pre-tokenizer already)."""
    from ..readers import TOKENIZER_FILES

    if tokenizer is None:
        return {}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        saved = [p for p in Path(tmp).iterdir() if p.is_file()]
        files = {p.name: p.read_text() for p in saved if p.name in TOKENIZER_FILES}
    if len(files) < len(saved) and "tokenizer.json" in files and "tokenizer_config.json" in files:
        config = json.loads(files["tokenizer_config.json"])
        if isinstance(config, dict) and config.pop("add_prefix_space", None) is not None:
            files["tokenizer_config.json"] = json.dumps(config, indent=2, ensure_ascii=False)
    return files


def make_spec(model, architecture: str, resolution: int, training: dict | None = None,
              recommended: dict | None = None, family: str | None = None) -> dict:
    """The spec of ``model``; ``training`` (`dwb train`'s data and schedule) is what a model card shows,
    ``recommended`` the generation settings it is meant to be sampled at (``recommended``); ``family`` where the
    architecture does not say it (a model fine-tuned from a checkpoint of that family)."""
    from ..families import family_or_ours
    from .architectures import ARCHITECTURES

    family = family or ARCHITECTURES.get(architecture, {}).get("family")
    flow = getattr(model, "flow", None)
    towers = {name: getattr(model, name, None) for name in ("text_encoder_2", "text_encoder_3")}
    # the tokenizers beside the first by their pipeline names (SD3's: CLIP-G's, T5's), or the second tower's own
    tokenizers = model.spec_tokenizers() if hasattr(model, "spec_tokenizers") else \
        {"tokenizer_2": getattr(model, "tokenizer_2", None)}
    return {
        "format": SPEC_FORMAT_FAMILY if family else SPEC_FORMAT,
        "architecture": architecture,
        **({"family": family} if family else {}),
        "prediction_type": model.prediction_type,
        "resolution": resolution,
        family_or_ours(family).denoiser: plain_data(dict(model.denoiser.config)),
        **({"flow": plain_data(dataclasses.asdict(flow))} if flow is not None else {}),
        "vae": plain_data(dict(model.vae.config)),
        "text_encoder": plain_data(model.text_encoder.config.to_dict()),
        **{name: plain_data(tower.config.to_dict()) for name, tower in towers.items() if tower is not None},
        "tokenizer": tokenizer_files(model.tokenizer),
        **{name: tokenizer_files(tokenizer) for name, tokenizer in tokenizers.items() if tokenizer is not None},
        # the T5 tokens each caption was padded to (Flux.1's and SD3's ``model.text_tokens``), which sampling reads
        **({"text_tokens": int(model.text_tokens)} if getattr(model, "text_tokens", None) else {}),
        **({"training": plain_data(training)} if training else {}),
        **({"recommended": plain_data(recommended)} if recommended else {}),
    }
