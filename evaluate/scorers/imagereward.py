"""ImageReward (Xu et al. 2023, NeurIPS): BLIP's image-grounded text encoder (ViT-L/16 image tower, BERT-base
text tower cross-attending to it) and a linear head, trained on 137k expert comparisons; the score is the
head's output on the [CLS] token, standardised by the authors' mean and standard deviation (about -2 to 2;
0 is their training set's average).

Loaded as its authors publish it: ``ImageReward.pt`` and ``med_config.json`` of ``THUDM/ImageReward``,
images resized (bicubic) and centre-cropped to 224 with CLIP's mean and standard deviation, prompts through
``bert-base-uncased``'s tokenizer with BLIP's two added tokens, padded to 35. BLIP's towers are
transformers' ``BlipVisionModel`` and ``BlipTextModel`` (the same layers: the text tower's weight names are
BLIP's own; the image tower's are renamed by ``vision_key``). On ImageReward's test set it agrees with
people's choices 65.1% of the time, HPS v2 65.7% (HPSv2's README).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from models.checkpoints import fingerprint
from models.common import load_outside
from models.errors import WorkbenchError

from .preference import Head, is_hub_id, load_state, pretrained_folder, to_pil, weights_file
from .weights import PREFERENCE_WEIGHTS

IMAGEREWARD_REPO, IMAGEREWARD_FILE, MED_CONFIG = PREFERENCE_WEIGHTS["imagereward"], "ImageReward.pt", "med_config.json"
TOKENIZER = "bert-base-uncased"
MEAN, STD = 0.16717362830052426, 1.0333394966054072  # the authors' standardisation of the head's output
MAX_TOKENS = 35
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
VISION, TEXT, HEAD = "blip.visual_encoder.", "blip.text_encoder.", "mlp."
HEAD_WIDTH = 64  # BLIP's ViT-L/16: 1,024 wide, 16 heads
_VISION_NAMES = [(r"^cls_token$", "embeddings.class_embedding"), (r"^pos_embed$", "embeddings.position_embedding"),
                 (r"^patch_embed\.proj\.", "embeddings.patch_embedding."), (r"^blocks\.(\d+)\.", r"encoder.layers.\1."),
                 (r"\.norm1\.", ".layer_norm1."), (r"\.norm2\.", ".layer_norm2."), (r"\.attn\.qkv\.", ".self_attn.qkv."),
                 (r"\.attn\.proj\.", ".self_attn.projection."), (r"^norm\.", "post_layernorm.")]


def vision_key(name: str) -> str:
    """BLIP's ViT weight name -> ``BlipVisionModel``'s ("blocks.3.attn.proj.weight" -> "encoder.layers.3.self_attn.projection.weight")."""
    for pattern, replacement in _VISION_NAMES:
        name = re.sub(pattern, replacement, name)
    return name


def _part(state: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def vision_config(vision: dict):
    """BLIP's ViT as a ``BlipVisionConfig``, sizes read from its weights (eps 1e-6, as BLIP's ViT)."""
    from transformers import BlipVisionConfig

    conv = vision["patch_embed.proj.weight"]
    width, patch = conv.shape[0], conv.shape[-1]
    return BlipVisionConfig(hidden_size=width, intermediate_size=vision["blocks.0.mlp.fc1.weight"].shape[0],
                            num_hidden_layers=len({k.split(".")[1] for k in vision if k.startswith("blocks.")}),
                            num_attention_heads=width // HEAD_WIDTH, patch_size=patch, layer_norm_eps=1e-6,
                            image_size=math.isqrt(vision["pos_embed"].shape[1] - 1) * patch)


def text_config(med: dict, encoder_width: int):
    """The authors' ``med_config.json`` (a BERT config) as a ``BlipTextConfig`` cross-attending to ``encoder_width``."""
    from transformers import BlipTextConfig

    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "hidden_act", "max_position_embeddings", "layer_norm_eps", "pad_token_id")
    return BlipTextConfig(**{k: med[k] for k in keys if k in med}, encoder_hidden_size=encoder_width, is_decoder=True)


def load_tokenizer(folder: Path | None):
    """BLIP's tokenizer: ``bert-base-uncased`` (from ``folder`` when it holds vocab.txt) plus [DEC] and [ENC]."""
    from transformers import BertTokenizer

    ref = folder if folder is not None and (folder / "vocab.txt").is_file() else TOKENIZER
    tokenizer = pretrained_folder(BertTokenizer, ref, "ImageReward's tokenizer", TOKENIZER)
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tokenizer


def load_imagereward(ref: str | Path):
    """(vision tower, text tower, head, tokenizer) from the authors' files; every weight the towers need must be there."""
    from transformers.models.blip.modeling_blip import BlipVisionModel
    from transformers.models.blip.modeling_blip_text import BlipTextModel

    path = weights_file(ref, IMAGEREWARD_FILE, "ImageReward", IMAGEREWARD_REPO)
    med_path = weights_file(path.parent if not is_hub_id(str(ref)) else ref, MED_CONFIG, "ImageReward", IMAGEREWARD_REPO)
    state = load_state(path, "ImageReward")
    vision_state = _part(state, VISION)
    if "patch_embed.proj.weight" not in vision_state:
        raise WorkbenchError(f"{path} is not an ImageReward checkpoint (no {VISION}patch_embed.proj.weight)")
    vision = BlipVisionModel(vision_config(vision_state))
    med = load_outside(med_path, str(med_path))
    if not isinstance(med, dict):
        raise WorkbenchError(f"{med_path}: expected a JSON object (a BERT config), got {type(med).__name__}")
    text = BlipTextModel(text_config(med, vision.config.hidden_size), add_pooling_layer=False)
    head = Head(text.config.hidden_size)
    for module, part in ((vision, {vision_key(k): v for k, v in vision_state.items()}),
                         (text, _part(state, TEXT)), (head, _part(state, HEAD))):
        missing, _ = module.load_state_dict(part, strict=False)
        if missing:
            raise WorkbenchError(f"{path} lacks ImageReward weights: {', '.join(missing[:3])}")
    return vision.eval(), text.eval(), head.eval(), load_tokenizer(None if is_hub_id(str(ref)) else path.parent)


class ImageRewardScorer:
    """``scorer(images, captions)``: each image's ImageReward against its own caption."""

    def __init__(self, ref: str | Path, device: str | torch.device = "cpu"):
        from torchvision import transforms as T

        vision, text, head, self.tokenizer = load_imagereward(ref)
        self.device = torch.device(device)
        self.vision, self.text, self.head = vision.to(self.device), text.to(self.device), head.to(self.device)
        size = vision.config.image_size
        self.transform = T.Compose([T.Resize(size, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(size),
                                    T.ToTensor(), T.Normalize(CLIP_MEAN, CLIP_STD)])
        self.name = f"imagereward:{Path(str(ref)).name}@{fingerprint(torch.nn.ModuleList([vision, text, head]))}"

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, captions: list[str]) -> torch.Tensor:
        pixels = torch.stack([self.transform(im.convert("RGB")) for im in to_pil(images)]).to(self.device)
        image_embeds = self.vision(pixel_values=pixels).last_hidden_state
        tokens = self.tokenizer(captions, padding="max_length", truncation=True, max_length=MAX_TOKENS,
                                return_tensors="pt").to(self.device)
        out = self.text(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask,
                        encoder_hidden_states=image_embeds,
                        encoder_attention_mask=torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=self.device))
        rewards = self.head(out.last_hidden_state[:, 0, :].float()).squeeze(-1)
        return ((rewards - MEAN) / STD).float().cpu()
