"""PickScore (Kirstain et al. 2023, "Pick-a-Pic"): a CLIP-H fine-tuned on people's choices between two images
of one prompt; the score is the CLIP logit, 100 x cos(image, caption) with the model's learned scale.

Loaded as its authors document it: transformers' ``AutoModel`` of ``yuvalkirstain/PickScore_v1`` with the
processor of ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K`` (the model's own folder is tried first: a local
copy usually holds both). Over models it ranks as people do (Spearman 0.917 in the Pick-a-Pic paper,
where FID gives -0.900); on HPD v2's test set it agrees with people's choices 79.8% of the time (HPSv2's
README).
"""
from __future__ import annotations

from pathlib import Path

import torch

from models.checkpoints import fingerprint

from .preference import pretrained_folder, to_pil
from .weights import PREFERENCE_WEIGHTS

DEFAULT_PICKSCORE = PREFERENCE_WEIGHTS["pickscore"]
PROCESSOR = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"


def load_pickscore(ref: str | Path):
    """(model, processor): the model from ``ref``, its processor from ``ref`` or else from ``PROCESSOR``."""
    from transformers import AutoModel, AutoProcessor

    model = pretrained_folder(AutoModel, ref, "PickScore", DEFAULT_PICKSCORE).eval()
    try:
        processor = AutoProcessor.from_pretrained(str(ref))
    except Exception:  # the hub's PickScore_v1 ships no processor files: its authors use LAION's CLIP-H's
        processor = pretrained_folder(AutoProcessor, PROCESSOR, "PickScore's processor", PROCESSOR)
    return model, processor


class PickScorer:
    """``scorer(images, captions)``: each image's PickScore against its own caption."""

    def __init__(self, ref: str | Path, device: str | torch.device = "cpu"):
        model, self.processor = load_pickscore(ref)
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.name = f"pickscore:{Path(str(ref)).name}@{fingerprint(model)}"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, captions: list[str]) -> torch.Tensor:
        pixels = self.processor(images=to_pil(images), return_tensors="pt")["pixel_values"].to(self.device)
        text = self.processor(text=captions, padding=True, truncation=True, max_length=77, return_tensors="pt")
        image_embs = self.model.get_image_features(pixel_values=pixels)
        text_embs = self.model.get_text_features(**{k: v.to(self.device) for k, v in text.items()})
        image_embs = image_embs / image_embs.norm(dim=-1, keepdim=True)
        text_embs = text_embs / text_embs.norm(dim=-1, keepdim=True)
        return (self.model.logit_scale.exp() * (image_embs * text_embs).sum(-1)).float().cpu()
