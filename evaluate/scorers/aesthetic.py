"""The LAION aesthetic predictor ("improved aesthetic predictor", Schuhmann 2022): a linear head on CLIP
ViT-L/14's unit-norm image embedding, fitted to people's 1-10 ratings (SAC, LAION-Logos, AVA); LAION-5B's
"aesthetic 4.5+" and "6+" subsets, and so this workbench's seed data filter, are this score's thresholds.

Loaded as published: the head ``sac+logos+ava1-l14-linearMSE.pth`` (five linear layers under ``layers``,
``preference.Head``) on the image embedding of OpenAI's CLIP ViT-L/14 (``openai/clip-vit-large-patch14``
in transformers, or the run's ``--clip`` when that is ViT-L/14), normalised to unit length as the
predictor's own inference does. The caption plays no part. It measures appeal, not agreement with the
prompt; its authors publish no agreement with pairwise choices.
"""
from __future__ import annotations

from pathlib import Path

import torch

from models.checkpoints import fingerprint
from models.errors import WorkbenchError

from .clip import DEFAULT_CLIP, load_clip
from .preference import Head, load_state, to_pil, weights_file
from .weights import PREFERENCE_WEIGHTS

AESTHETIC_FILE = PREFERENCE_WEIGHTS["aesthetic"]
WHERE = "the improved-aesthetic-predictor repository of christophschuhmann on GitHub"


def load_head(ref: str | Path) -> Head:
    """The predictor's head from its file; its input size is read from the file (768 for ViT-L/14)."""
    path = weights_file(ref, AESTHETIC_FILE, "aesthetic predictor", where=WHERE)
    state = load_state(path, "aesthetic predictor")
    if "layers.0.weight" not in state:
        raise WorkbenchError(f"{path} is not the aesthetic predictor's head (no layers.0.weight)")
    head = Head(state["layers.0.weight"].shape[1])
    try:
        head.load_state_dict(state)
    except RuntimeError as e:
        raise WorkbenchError(f"{path} is not the aesthetic predictor's head ({e!s:.200})") from None
    return head.eval()


class AestheticScorer:
    """``scorer(images, captions)``: each image's predicted aesthetic rating (the captions are not used)."""

    def __init__(self, ref: str | Path, device: str | torch.device = "cpu", clip: str | None = None):
        self.head = load_head(ref)
        dim = self.head.layers[0].in_features
        model, self.processor = load_clip(clip) if clip else (None, None)
        if model is None or model.config.projection_dim != dim:  # the run's CLIP is not ViT-L/14: OpenAI's is
            model, self.processor = load_clip(DEFAULT_CLIP)
        if model.config.projection_dim != dim:
            raise WorkbenchError(f"the aesthetic predictor takes {dim}-d CLIP ViT-L/14 image embeddings, but "
                                 f"{DEFAULT_CLIP} gives {model.config.projection_dim}-d ones")
        self.device = torch.device(device)
        self.model, self.head = model.to(self.device), self.head.to(self.device)
        self.name = f"aesthetic:{Path(str(ref)).name}@{fingerprint(self.head)}"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, captions: list[str]) -> torch.Tensor:
        pixels = self.processor(images=to_pil(images), return_tensors="pt")["pixel_values"].to(self.device)
        emb = self.model.get_image_features(pixel_values=pixels)
        emb = emb / emb.norm(dim=-1, keepdim=True)
        return self.head(emb).squeeze(-1).float().cpu()
