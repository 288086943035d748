"""CLIP score: 100 x cos(image embedding, caption embedding), averaged over images, through torchmetrics.

As torchmetrics computes it (no clipping at zero, no 2.5 weight of Hessel et al. 2021), so values lie in
[-100, 100] and match published "CLIP score" tables for text-to-image models.

The CLIP model comes from a local folder or a hub id, loaded here and handed to torchmetrics as a
callable returning (model, processor), so any CLIP the transformers library reads works offline.
"""
from __future__ import annotations

from pathlib import Path

import torch

from train.errors import WorkbenchError
from train.latents import fingerprint

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
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise WorkbenchError(f"cannot load CLIP model from {ref}: {first}") from None


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
    """Streaming CLIP score: ``update(images, captions)`` per batch, ``compute()`` at the end."""

    def __init__(self, ref: str | Path, device: str | torch.device = "cpu"):
        from torchmetrics.multimodal.clip_score import CLIPScore

        model, processor = load_clip(ref)
        self.model, self.processor = model, processor
        self.metric = CLIPScore(model_name_or_path=lambda: (model, processor)).to(device)
        self.device = torch.device(device)
        self.name = str(ref)

    @torch.no_grad()
    def update(self, images: torch.Tensor, captions: list[str]) -> None:
        """``images``: (B, 3, H, W) uint8."""
        self.metric.update(list(images.to(self.device)), captions)

    def compute(self) -> float:
        return float(self.metric.compute())

    def reset(self) -> None:
        self.metric.reset()

    def image_extractor(self) -> ClipImageExtractor:
        """The same CLIP's image embeddings, for CMMD."""
        return ClipImageExtractor(self.model, self.processor, self.device, name=Path(self.name).name or self.name)
