"""CLIP score: 100 x cos(image embedding, caption embedding) per image, averaged over images.

As torchmetrics computes it (no clipping at zero, no 2.5 weight of Hessel et al. 2021), so values lie in
[-100, 100] and match published "CLIP score" tables for text-to-image models. Scores are kept per image:
the manifest records each, and the row's interval resamples them by prompt.

The CLIP model comes from a local folder or a hub id, loaded here and handed to torchmetrics' per-sample
function, so any CLIP the transformers library reads works offline.
"""
from __future__ import annotations

from pathlib import Path

import torch

from models.errors import WorkbenchError, first_line
from models.checkpoints import fingerprint

DEFAULT_CLIP = "openai/clip-vit-large-patch14"


def load_clip(ref: str | Path):
    """(CLIPModel, CLIPProcessor) from a folder or hub id; one-line error when neither loads."""
    from transformers import CLIPModel, CLIPProcessor

    ref = str(ref)
    local = Path(ref)
    if (local.is_absolute() or ref.startswith(".") or ref.count("/") != 1) and not local.is_dir():
        raise WorkbenchError(f"CLIP model folder not found: {ref} (give a folder with config.json or a hub id)")
    try:
        return CLIPModel.from_pretrained(ref).eval(), CLIPProcessor.from_pretrained(ref)
    except Exception as e:
        raise WorkbenchError(f"cannot load CLIP model from {ref}: {first_line(e)}") from None


class ClipImageExtractor:
    """CLIP image embeddings (unit norm, float64) for CMMD; a ``FeatureExtractor`` like Inception's.

    Images go through the CLIP model's own processor (its resize and centre crop) from (B, 3, H, W) uint8.
    """

    def __init__(self, model, processor, device: str | torch.device = "cpu", name: str = "clip"):
        self.model, self.processor = model.to(device), processor
        self.device = torch.device(device)
        self.dim = int(model.config.projection_dim)
        self.name = f"clip-image:{name}"
        self.weights_hash = fingerprint(model)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        pixels = self.processor(images=list(images.permute(0, 2, 3, 1).cpu().numpy()), return_tensors="pt")
        emb = self.model.get_image_features(pixel_values=pixels["pixel_values"].to(self.device))
        return torch.nn.functional.normalize(emb.to(torch.float64), dim=1).cpu()


class ClipScorer:
    """Per-image CLIP score: ``update(images, captions)`` per batch returns each image's score.

    Each score is computed by torchmetrics' own per-sample function (``_clip_score_update``, what
    ``CLIPScore.update`` sums), so the mean is torchmetrics' CLIP score without its clipping at zero.
    """

    def __init__(self, ref: str | Path, device: str | torch.device = "cpu"):
        model, processor = load_clip(ref)
        self.model, self.processor = model.to(device), processor
        self.device = torch.device(device)
        self.name = str(ref)
        self.scores: list[torch.Tensor] = []

    @torch.no_grad()
    def update(self, images: torch.Tensor, captions: list[str]) -> torch.Tensor:
        """``images``: (B, 3, H, W) uint8 -> (B,) float64 scores, 100 x cos(image, caption)."""
        from torchmetrics.functional.multimodal.clip_score import _clip_score_update

        score, _ = _clip_score_update(list(images.to(self.device)), captions, self.model, self.processor)
        self.scores.append(score.to(torch.float64).cpu())
        return self.scores[-1]

    def compute(self) -> float:
        return float(torch.cat(self.scores).mean())

    def reset(self) -> None:
        self.scores = []

    def image_extractor(self) -> ClipImageExtractor:
        """The same CLIP's image embeddings, for CMMD."""
        return ClipImageExtractor(self.model, self.processor, self.device, name=Path(self.name).name or self.name)
