"""Learned human-preference scores: what the four scorers share, and the one place that loads them.

PickScore (``pickscore.py``), HPSv2.1 (``hps.py``), ImageReward (``imagereward.py``) and the LAION
aesthetic predictor (``aesthetic.py``) each score one image, given its caption (the aesthetic score ignores
the caption), as one number per image. ``RowScorer`` keeps those numbers per image like the CLIP score,
so each gets the same 95% interval over prompts, the same per-category table and the same paired
comparison (``row.mean_values``).

Weights come from a local file or folder, the Hugging Face cache, or the hub when online
(``weights_file``); what is missing is a one-line error naming the file to download and where to put it.
Each scorer takes the images as the authors' code does: as PIL images, through the authors' preprocessing.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from models.errors import WorkbenchError, first_line


# config key -> (the scorer's module, its class): the keys are the results' column names (names.py)
SCORERS = {"pickscore": ("pickscore", "PickScorer"), "hps": ("hps", "HpsScorer"),
           "imagereward": ("imagereward", "ImageRewardScorer"), "aesthetic": ("aesthetic", "AestheticScorer")}


def is_hub_id(ref: str) -> bool:
    """``owner/name``: not a path that exists, not absolute, not relative by a dot."""
    return ref.count("/") == 1 and not Path(ref).exists() and not ref.startswith((".", "/", "~"))


def weights_file(ref: str | Path, filename: str, what: str, repo: str | None = None, where: str | None = None) -> Path:
    """``filename`` from ``ref``: that file itself, a folder holding it, or a hub repo id (the Hugging Face
    cache first, then the hub when online). Anything else is a one-line error naming the download."""
    ref = str(ref)
    path = Path(ref).expanduser()
    hint = (f"download {filename} (huggingface-cli download {repo} {filename}) and give its path or folder"
            if repo else f"download {filename} ({where}) and give its path")
    if path.is_file():
        return path
    if path.is_dir():
        if (path / filename).is_file():
            return path / filename
        raise WorkbenchError(f"{what}: {path} has no {filename}: {hint}")
    if not is_hub_id(ref):
        raise WorkbenchError(f"{what} weights not found: {ref} is neither a file nor a folder: {hint}")
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(ref, filename))
    except Exception as e:  # offline and not cached, or no such repo or file
        raise WorkbenchError(f"{what} weights not found: {filename} of {ref} is not in the Hugging Face cache and the "
                             f"hub did not give it ({first_line(e)}): {hint}") from None


def pretrained_folder(cls, ref: str | Path, what: str, repo: str, **kwargs):
    """``cls.from_pretrained(ref)`` (a folder, the cache, or the hub); one line naming the download otherwise."""
    ref = str(ref)
    if not Path(ref).expanduser().is_dir() and not is_hub_id(ref):
        raise WorkbenchError(f"{what} weights not found: {ref} is not a folder (download {repo} with "
                             f"`huggingface-cli download {repo} --local-dir FOLDER` and give FOLDER)")
    try:
        return cls.from_pretrained(str(Path(ref).expanduser()) if Path(ref).expanduser().is_dir() else ref, **kwargs)
    except Exception as e:
        raise WorkbenchError(f"{what} weights not found in {ref} ({first_line(e)}): download {repo} with "
                             f"`huggingface-cli download {repo} --local-dir FOLDER` and give FOLDER") from None


def load_state(path: Path, what: str) -> dict:
    """A PyTorch checkpoint's tensors (weights only: no code runs from the file)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise WorkbenchError(f"cannot read the {what} weights {path}: {first_line(e)}") from None


def to_pil(images: torch.Tensor) -> list:
    """(B, 3, H, W) uint8 -> PIL images: what each authors' preprocessing takes."""
    from PIL import Image

    return [Image.fromarray(a) for a in images.permute(0, 2, 3, 1).cpu().numpy()]


def linear_stack(input_size: int) -> torch.nn.Sequential:
    """The head ImageReward and the LAION aesthetic predictor publish: five linear layers (dropout between the
    first four, no activation), 1024 -> 128 -> 64 -> 16 -> 1, kept as ``layers`` (state-dict keys
    ``layers.0``, ``layers.2``, ``layers.4``, ``layers.6``, ``layers.7``)."""
    nn = torch.nn
    return nn.Sequential(nn.Linear(input_size, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
                         nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1))


class Head(torch.nn.Module):
    """``linear_stack`` under the name ``layers``, as the published files keep it."""

    def __init__(self, input_size: int):
        super().__init__()
        self.layers = linear_stack(input_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def load_preference_scorers(keys: dict[str, str | None], device: str | torch.device = "cpu",
                            clip: str | None = None) -> dict:
    """The scorers asked for, by column name, from ``{key: weights}`` (None: not asked); ``clip`` is
    the run's CLIP model, which the aesthetic predictor reuses when it is ViT-L/14."""
    import importlib

    scorers = {}
    for key, ref in keys.items():
        if ref:
            module, cls = SCORERS[key]
            scorer = getattr(importlib.import_module(f"{__package__}.{module}"), cls)
            scorers[key] = scorer(ref, device=device, **({"clip": clip} if key == "aesthetic" else {}))
    return scorers


def scores_of(scorer, images: torch.Tensor, captions: list[str]) -> np.ndarray:
    """One scorer's (B,) float64 scores of a batch."""
    with torch.no_grad():
        return np.asarray(scorer(images, captions), dtype=np.float64).reshape(len(captions))
