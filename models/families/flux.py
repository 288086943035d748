"""Flux.1: a rectified-flow transformer of 19 double-stream and 38 single-stream blocks over 16-channel latents
packed into 2x2 patches, conditioned on T5-XXL's states and CLIP-L's pooled output. Flux.1-dev takes its
guidance scale as an input (distilled from classifier-free guidance: no negative prompt); Flux.1-schnell is
distilled to a few steps and takes none."""
from __future__ import annotations

from .family import Assembly, Family, Part, SingleFile, Variant
from .parts import CLIP_L, clip_text, t5_encoder, vae

FLUX_SAMPLERS = ("Euler", "DPM++ 2M", "UniPC")  # the pipeline sets its own sigmas: Heun's scheduler cannot take them

# The keys that size Flux.1's transformer (``Part.sizes``)
TRANSFORMER_SIZES = ("patch_size", "in_channels", "num_layers", "num_single_layers", "attention_head_dim",
                     "num_attention_heads", "joint_attention_dim", "pooled_projection_dim", "axes_dims_rope")


def transformer(guidance_embeds: bool) -> Part:
    return Part("diffusers", "FluxTransformer2DModel", dict(
        patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=guidance_embeds,
        axes_dims_rope=(16, 56, 56)), TRANSFORMER_SIZES)


def _parts(guidance_embeds: bool) -> dict[str, Part]:
    return {"transformer": transformer(guidance_embeds), "text_encoder": clip_text(CLIP_L),
            "text_encoder_2": t5_encoder(), "vae": vae(16, 0.3611, shift_factor=0.1159, sample_size=1024)}


# Flux.1's flow sampler with its resolution shift: exp(mu) for mu linear in the image's tokens (``flow.patches_shift``,
# what training draws t with), at any size the pipeline draws
FLUX_ASSEMBLY = Assembly(scheduler={
    "_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 1.0,
    "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256,
    "max_image_seq_len": 4096})
# ``flux1-dev.safetensors``: the transformer alone in Black Forest Labs' names
FLUX_FILE = SingleFile("flux-bfl", ("transformer",))

# Published: "a 12 billion parameter rectified flow transformer" (both models' cards).
FLUX = Family(
    name="flux", label="Flux.1", pipeline="FluxPipeline", denoiser="transformer",
    text_encoders=("text_encoder", "text_encoder_2"), schedule="flow", samplers=FLUX_SAMPLERS,
    native_size=1024, size_range=(256, 2048), latent_channels=16, latent_packing=2,
    second_tokenizer="T5TokenizerFast", text_length_option="max_sequence_length",
    folder_classes=frozenset({"FluxPipeline"}), single_file_marks=("double_blocks.",),
    single_file_text_marks=("text_encoders.",), assembly=FLUX_ASSEMBLY, single_file=FLUX_FILE,
    variants=(Variant("dev", _parts(True), published_parameters=12e9, published_parts=("transformer",),
                      guidance="distilled", guidance_scale=3.5, steps=28, hub_id="black-forest-labs/FLUX.1-dev"),
              Variant("schnell", _parts(False), published_parameters=12e9, published_parts=("transformer",),
                      guidance="none", guidance_scale=0.0, steps=4, hub_id="black-forest-labs/FLUX.1-schnell")),
    pick_variant=lambda config: "dev" if config.get("guidance_embeds", True) else "schnell",
    img2img_pipeline="FluxImg2ImgPipeline", inpaint_pipeline="FluxInpaintPipeline", takes_clip_skip=False)


# What a Flux.1-style transformer trained here reads, in the layout FluxPipeline gives it (its ``_pack_latents`` and
# ``_prepare_latent_image_ids``; tests/train/test_flux_training.py holds them equal): latents in 2x2 patches, one
# token each, with (0, row, column) position ids; text tokens with ids of zeros.
def pack_latents(latents):
    """(B, C, H, W) latents -> (B, H/2 x W/2, 4C) tokens, patch by patch in rows."""
    b, c, h, w = latents.shape
    patches = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(tokens, height: int, width: int):
    """``pack_latents`` undone: (B, H/2 x W/2, 4C) tokens -> (B, C, H, W) for latents of ``height`` x ``width``."""
    b, _, packed = tokens.shape
    patches = tokens.view(b, height // 2, width // 2, packed // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return patches.reshape(b, packed // 4, height, width)


def latent_ids(height: int, width: int):
    """(H/2 x W/2, 3) position ids of the packed tokens of ``height`` x ``width`` latents: (0, row, column)."""
    import torch

    rows, cols = torch.meshgrid(torch.arange(height // 2), torch.arange(width // 2), indexing="ij")
    return torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(-1, 3).float()


def text_ids(tokens: int):
    """(tokens, 3) position ids of the T5 tokens: zeros (Flux.1 places text by RoPE on none of its axes)."""
    import torch

    return torch.zeros(tokens, 3)
