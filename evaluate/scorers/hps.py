"""HPSv2.1 (Wu et al. 2023, "Human Preference Score v2"): OpenCLIP's ViT-H-14 fine-tuned on HPD v2's 798k
human choices; the score is cos(image, caption) of the fine-tuned model (about 0.2 to 0.35 for real models).

Loaded as its authors publish it: OpenCLIP's ``ViT-H-14`` architecture (GELU) with ``HPS_v2.1_compressed.pt`` of ``xswu/HPSv2``, a
``{"state_dict": ...}`` file holding every weight. Images go through HPS's own evaluation transform
(``hps_pixels``), not OpenCLIP's: the image as a float tensor, its longer side resized (bicubic) to 224, the
shorter side padded with black to a square, OpenAI's mean and standard deviation; resizing the float tensor
instead of the 8-bit image moves scores by about 4e-4, forty times the tolerance of the equality test. On HPD v2's test set HPS v2 agrees with people's
choices 83.3% of the time (a single annotator: 78.1%), on ImageReward's test set 65.7% (its README).

The architecture's sizes are read from the file (widths, depths, patch, image and vocabulary sizes), with
ViT-H-14's head widths (80 in the image tower, 64 in the text tower): the published file gives ViT-H-14
exactly, and a smaller file of the same layout a smaller model of the same architecture.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from models.checkpoints import fingerprint
from models.errors import WorkbenchError

from .preference import load_state, to_pil, weights_file
from .weights import PREFERENCE_WEIGHTS

HPS_REPO, HPS_FILE = PREFERENCE_WEIGHTS["hps"], "HPS_v2.1_compressed.pt"
ARCHITECTURE = "ViT-H-14"
VISION_HEAD_WIDTH, TEXT_HEAD_WIDTH = 80, 64  # ViT-H-14's: 1,280 / 16 heads and 1,024 / 16 heads


def _layers(state: dict, prefix: str) -> int:
    return len({k[len(prefix):].split(".")[0] for k in state if k.startswith(prefix)})


def hps_model_config(state: dict) -> dict:
    """OpenCLIP's ``CLIP`` arguments for the weights in ``state`` (ViT-H-14's for the published file)."""
    conv = state["visual.conv1.weight"]
    width, patch = conv.shape[0], conv.shape[-1]
    grid = math.isqrt(state["visual.positional_embedding"].shape[0] - 1)
    text_width = state["token_embedding.weight"].shape[1]
    return {"embed_dim": state["text_projection"].shape[1],
            "vision_cfg": {"image_size": grid * patch, "layers": _layers(state, "visual.transformer.resblocks."),
                           "width": width, "head_width": VISION_HEAD_WIDTH, "patch_size": patch,
                           "mlp_ratio": state["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0] / width},
            "text_cfg": {"context_length": state["positional_embedding"].shape[0],
                         "vocab_size": state["token_embedding.weight"].shape[0], "width": text_width,
                         "heads": text_width // TEXT_HEAD_WIDTH, "layers": _layers(state, "transformer.resblocks.")}}


def load_hps(ref: str | Path):
    """(OpenCLIP model, tokenizer) with the HPS weights loaded strictly."""
    import open_clip

    path = weights_file(ref, HPS_FILE, "HPSv2.1", HPS_REPO)
    state = load_state(path, "HPSv2.1")
    state = state.get("state_dict", state)
    try:
        model = open_clip.model.CLIP(**hps_model_config(state))
        model.load_state_dict(state)
    except (KeyError, RuntimeError) as e:
        raise WorkbenchError(f"{path} is not an HPS checkpoint of OpenCLIP's {ARCHITECTURE} layout ({e!s:.200})") from None
    return model.eval(), open_clip.get_tokenizer(ARCHITECTURE)


def hps_pixels(image, size: int) -> torch.Tensor:
    """One PIL image as HPS scores it: (3, size, size), longer side resized to ``size``, padded, normalised."""
    import open_clip
    import torchvision.transforms.functional as TF

    t = TF.to_tensor(image.convert("RGB"))
    height, width = t.shape[1:]
    scale = size / max(height, width)
    if scale != 1.0:
        new = (round(height * scale), round(width * scale))
        t = TF.resize(t, list(new), TF.InterpolationMode.BICUBIC)
        pad_h, pad_w = size - new[0], size - new[1]
        t = TF.pad(t, [pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2], fill=0)
    return TF.normalize(t, open_clip.OPENAI_DATASET_MEAN, open_clip.OPENAI_DATASET_STD)


class HpsScorer:
    """``scorer(images, captions)``: each image's HPSv2.1 score against its own caption."""

    def __init__(self, ref: str | Path, device: str | torch.device = "cpu"):
        model, self.tokenizer = load_hps(ref)
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.name = f"hps:{Path(str(ref)).name}@{fingerprint(model)}"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, captions: list[str]) -> torch.Tensor:
        size = self.model.visual.image_size
        size = size[0] if isinstance(size, (tuple, list)) else size
        pixels = torch.stack([hps_pixels(im, size) for im in to_pil(images)]).to(self.device)
        image = self.model.encode_image(pixels, normalize=True)
        text = self.model.encode_text(self.tokenizer(captions).to(self.device), normalize=True)
        return (image * text).sum(-1).float().cpu()
