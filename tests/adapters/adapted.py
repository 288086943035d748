"""Tiny pipelines of each family with an adapter added by peft and its weights set to seeded random values (peft
starts LoRA's up weights at zero, which would draw the base model's image and test nothing), and the image each
draws: what "the same image" is compared on."""
from __future__ import annotations

import copy

import numpy as np
import torch

from models.families import family_named

FOLDERS = {"sdxl": "sdxl", "sd3": "sd3", "flux": "flux-dev"}  # family -> its tests/family_fixtures.py folder
PROMPT, SEED = "a red circle left of a blue square", 7


def pipeline(family: str, family_folders: dict):
    """The family's tiny pipeline: SD 1's and SD 2's from tests/checkpoints/fixtures.py, the others from the
    session's diffusers folders (written by diffusers' own save_pretrained)."""
    if family in ("sd1", "sd2"):
        from ..checkpoints.fixtures import reduced_pipeline

        return reduced_pipeline(family)
    import diffusers

    pipe = getattr(diffusers, family_named(family).pipeline).from_pretrained(family_folders[FOLDERS[family]])
    pipe.set_progress_bar_config(disable=True)
    return pipe


def made_once(make):
    """``family -> make(family)``, each family's made once (a module fixture's memo of tiny pipelines)."""
    made = {}

    def get(family: str):
        if family not in made:
            made[family] = make(family)
        return made[family]

    return get


def denoiser_of(pipe, family: str) -> torch.nn.Module:
    return getattr(pipe, family_named(family).denoiser)


def fresh(pipe, family: str, base: torch.nn.Module):
    """The same pipeline around a copy of the denoiser as it was before any adapter: plain diffusers loads files
    into it."""
    return type(pipe)(**{**pipe.components, family_named(family).denoiser: copy.deepcopy(base)})


def randomize(denoiser: torch.nn.Module, seed: int = 1, std: float = 0.3) -> None:
    """Every adapter weight drawn from N(0, std) (seeded); DoRA's magnitudes scaled by 1 + N(0, 0.2) around
    peft's start (the base weight's norms), so the magnitudes matter and stay of the base's size."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in denoiser.named_parameters():
            if "magnitude" in name:
                p.mul_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            elif any(part in name for part in ("lora_A", "lora_B", "hada_", "lokr_")):
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def draw(pipe, family: str, scale: float | None = None) -> np.ndarray:
    """One 16 px image in 2 steps without classifier-free guidance (half the denoiser's work; the adapter acts the
    same on either branch), the adapter at ``scale`` through the pipeline's own attention kwargs (the UNets'
    ``cross_attention_kwargs``, SD3's and Flux.1's ``joint_attention_kwargs``)."""
    kwargs = {}
    if scale is not None:
        kwargs["joint_attention_kwargs" if family in ("sd3", "flux") else "cross_attention_kwargs"] = {"scale": scale}
    return pipe(PROMPT, num_inference_steps=2, height=16, width=16, guidance_scale=1.0, output_type="np",
                generator=torch.Generator().manual_seed(SEED), **kwargs).images[0]


def tiny_unet() -> torch.nn.Module:
    """SD 2's UNet at reduced size (tests/checkpoints/fixtures.py's), without a pipeline around it."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=8, block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=64,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        attention_head_dim=[4, 8], use_linear_projection=True)
