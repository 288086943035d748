"""DINOv2 image features, for the Frechet distance (FD-DINOv2) and precision, recall, density and coverage.

Stein et al. 2023 ("Exposing flaws of generative model evaluation metrics and their unfair treatment of
diffusion models", NeurIPS) found that Inception's features under-rate diffusion models and that the
Frechet distance on DINOv2 ViT-L/14 features agrees best with human raters. As their dgm-eval computes
them: each image resized to 224 x 224 (bicubic), normalised with ImageNet's mean and standard deviation,
and the final layer-normed CLS token taken (``Dinov2Model``'s ``pooler_output``: 1,024 values for
ViT-L/14, ``facebook/dinov2-large``).

The model is transformers' ``Dinov2Model`` from a local folder, or a hub id already in the local Hugging
Face cache: nothing is downloaded here.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from models.errors import WorkbenchError, first_line
from models.checkpoints import fingerprint

from .features import exact_matmul

DEFAULT_DINOV2 = "facebook/dinov2-large"
INPUT_SIZE = 224
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def load_dinov2(ref: str | Path):
    """``Dinov2Model`` from a folder or a cached hub id; a one-line error naming what to do otherwise."""
    from transformers import Dinov2Model

    ref = str(ref)
    local = Path(ref)
    if (local.is_absolute() or ref.startswith(".") or ref.count("/") != 1) and not local.is_dir():
        raise WorkbenchError(f"DINOv2 model folder not found: {ref} (give a folder with config.json, or a hub id "
                             f"such as {DEFAULT_DINOV2})")
    try:
        return Dinov2Model.from_pretrained(ref, local_files_only=True).eval()
    except OSError:
        if local.is_dir():
            raise WorkbenchError(f"{ref} holds no DINOv2 model (config.json and weights)") from None
        raise WorkbenchError(f"DINOv2 model {ref} is not in the local Hugging Face cache and is never downloaded "
                             f"here: fetch it once (`huggingface-cli download {ref}`) or give its folder") from None
    except Exception as e:  # noqa: BLE001 - a config or weights file of another model
        raise WorkbenchError(f"cannot load DINOv2 model from {ref}: {first_line(e)}") from None


class Dinov2Extractor:
    """A ``FeatureExtractor``: (B, 3, S, S) uint8 -> (B, hidden) float64 CLS features."""

    def __init__(self, ref: str | Path, device: str | torch.device = "cpu"):
        self.model = load_dinov2(ref).to(device)
        self.device = torch.device(device)
        self.dim = int(self.model.config.hidden_size)
        self.name = f"dinov2:{Path(str(ref)).name}"
        self.weights_hash = fingerprint(self.model)
        self._mean = torch.tensor(IMAGENET_MEAN, device=self.device).view(1, 3, 1, 1)
        self._std = torch.tensor(IMAGENET_STD, device=self.device).view(1, 3, 1, 1)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.device, torch.float32) / 255.0
        x = F.interpolate(x, size=(INPUT_SIZE, INPUT_SIZE), mode="bicubic", align_corners=False, antialias=True)
        with exact_matmul():
            out = self.model(pixel_values=(x - self._mean) / self._std).pooler_output
        return out.to(torch.float64).cpu()  # (B, hidden)
