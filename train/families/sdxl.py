"""Stable Diffusion XL: a larger UNet conditioned on two CLIP text encoders' penultimate states side by side,
the second's pooled output, and the image's original size, crop and target size ("text_time"); a 4-channel VAE
whose latents are scaled by 0.13025; the discrete diffusion schedule and samplers of SD 1/2."""
from __future__ import annotations

from .family import Family, Part, Variant
from .parts import CLIP_L, OPENCLIP_BIGG, clip_text, vae
from .stable_diffusion import DIFFUSION_SAMPLERS

UNET = Part("diffusers", "UNet2DConditionModel", dict(
    sample_size=128, in_channels=4, out_channels=4, flip_sin_to_cos=True, freq_shift=0,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(320, 640, 1280),
    layers_per_block=2, attention_head_dim=(5, 10, 20), transformer_layers_per_block=(1, 2, 10),
    cross_attention_dim=2048, use_linear_projection=True, addition_embed_type="text_time",
    addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816, norm_num_groups=32))

# Published: "a 3.5B parameter base model" (SDXL 1.0's release): the UNet, both text encoders and the VAE.
SDXL = Family(
    name="sdxl", label="Stable Diffusion XL", pipeline="StableDiffusionXLPipeline", denoiser="unet",
    text_encoders=("text_encoder", "text_encoder_2"), schedule="diffusion", samplers=DIFFUSION_SAMPLERS,
    native_size=1024, size_range=(512, 2048), latent_channels=4,
    folder_classes=frozenset({"StableDiffusionXLPipeline"}), single_file_marks=("conditioner.embedders.",),
    single_file_text_marks=("conditioner.embedders.",),
    variants=(Variant("base", {"unet": UNET, "text_encoder": clip_text(CLIP_L),
                               "text_encoder_2": clip_text(OPENCLIP_BIGG, projection=True),
                               "vae": vae(4, 0.13025, sample_size=1024)},
                      published_parameters=3.5e9, guidance_scale=5.0, steps=30,
                      hub_id="stabilityai/stable-diffusion-xl-base-1.0"),))
