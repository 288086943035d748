"""The architectures `dwb train` builds, by name: the real SD2-base sizes and a tiny UNet that trains on 2 CPU
cores, a tiny MMDiT (SD3's transformer layout, trained with rectified flow) beside it, and SDXL's UNet with its two
text towers and size and crop conditioning, tiny and at SDXL-base's sizes.

Each entry gives diffusers/transformers configs; an entry with a ``family`` is built as that family's denoiser
(``models.families``), one without is SD 2's UNet. ``sd2-base``'s UNet built from its config has
865.9M parameters; its VAE and OpenCLIP ViT-H text tower (23 of 24 layers: SD2 conditions on
the penultimate layer) normally load pretrained, but can be built with random weights too.
"""
from __future__ import annotations

from ..families import family_named

SD2_BASE = {
    "unet": dict(
        sample_size=64, in_channels=4, out_channels=4, center_input_sample=False,
        flip_sin_to_cos=True, freq_shift=0,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(320, 640, 1280, 1280), layers_per_block=2, downsample_padding=1,
        mid_block_scale_factor=1, act_fn="silu", norm_num_groups=32, norm_eps=1e-5,
        cross_attention_dim=1024, attention_head_dim=(5, 10, 20, 20), use_linear_projection=True,
    ),
    "vae": dict(
        in_channels=3, out_channels=3, latent_channels=4, sample_size=512, layers_per_block=2,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(128, 256, 512, 512), act_fn="silu", norm_num_groups=32, scaling_factor=0.18215,
    ),
    "text_encoder": dict(
        vocab_size=49408, hidden_size=1024, intermediate_size=4096, num_hidden_layers=23,
        num_attention_heads=16, max_position_embeddings=77, hidden_act="gelu", projection_dim=512,
        bos_token_id=0, eos_token_id=2, pad_token_id=1,
    ),
    "hub_id": "stabilityai/stable-diffusion-2-base",
}

TINY = {
    "unet": dict(
        sample_size=8, in_channels=4, out_channels=4, flip_sin_to_cos=True, freq_shift=0,
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8,
        cross_attention_dim=64, attention_head_dim=4, use_linear_projection=True,
    ),
    # 32 px -> 8x8x4 latents (two downsamples). Trained by `dwb prepare` on the shapes data.
    "vae": dict(
        in_channels=3, out_channels=3, latent_channels=4, sample_size=32, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 64), act_fn="silu", norm_num_groups=8, scaling_factor=1.0,
    ),
    # Frozen and random. Token and position embeddings start at unit std: with CLIP's 0.02 the
    # captions are hard to tell apart, and word order (which shape is above) is nearly invisible.
    "text_encoder": dict(
        hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=20, hidden_act="quick_gelu", projection_dim=64,
    ),
    "embedding_std": 1.0,
}

# The tiny transformer: diffusers' SD3Transformer2DModel over the tiny VAE's 4-channel latents, conditioned on the
# tiny text tower's penultimate states and pooled output in both of SD3's CLIP slots (2 x 64 wide) and no T5
# tokens. At 16 px the latents are 4x4: 1x1 patches give 16 image tokens, 2x2 patches only 4.
TINY_MMDIT = {
    "family": "sd3",
    "transformer": dict(
        sample_size=8, patch_size=1, in_channels=4, out_channels=4, num_layers=4, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=128, caption_projection_dim=64, pooled_projection_dim=128,
        pos_embed_max_size=16,
    ),
    "vae": TINY["vae"],
    "text_encoder": TINY["text_encoder"],
    "embedding_std": 1.0,
    # rectified flow's resolution shift is 1 at this side and sqrt(pixels / its pixels) above it (SD3 eq. 23)
    "flow_base_resolution": 16,
}

# SD3-medium's MMDiT at full size (Esser et al. 2024: 24 joint blocks of 24 heads of 64, 2x2 patches; "2B
# parameters"), trained here with rectified flow on SD 2's frozen parts: its 4-channel VAE, and its OpenCLIP ViT-H
# tower (1,024 wide) in both of SD3's CLIP slots. A from-scratch recipe beside SD2-base's UNet, not SD3 itself.
MMDIT_MEDIUM = {
    "family": "sd3",
    "transformer": dict(
        sample_size=32, patch_size=2, in_channels=4, out_channels=4, num_layers=24, attention_head_dim=64,
        num_attention_heads=24, joint_attention_dim=2048, caption_projection_dim=1536, pooled_projection_dim=2048,
        pos_embed_max_size=192,
    ),
    "vae": SD2_BASE["vae"],
    "text_encoder": SD2_BASE["text_encoder"],
    # its pretrained VAE, text tower and tokenizer: model.pretrained names SD 2-base (no hub_id: it is no fine-tune)
    "flow_base_resolution": 256,
}

# SDXL's conditioning on the tiny UNet's levels: the penultimate states of two text towers of different widths side
# by side (64 + 96, as SDXL's ViT-L and bigG are 768 + 1280), the wider tower's pooled, projected output and six
# time ids (original size, crop, target size: 96 + 6 x 8 added inputs, as SDXL's 1280 + 6 x 256). `dwb prepare` makes
# one tower; the second is built here from its config, random and frozen as the first, with the tokenizer's ids
# for its start, end and padding (the pooled output is the end token's: with CLIP's default ids it would be the
# start token's, the same for every caption).
TINY_SDXL = {
    "family": "sdxl",
    "unet": dict(TINY["unet"], cross_attention_dim=64 + 96, addition_embed_type="text_time",
                 addition_time_embed_dim=8, projection_class_embeddings_input_dim=96 + 6 * 8),
    "vae": TINY["vae"],
    "text_encoder": TINY["text_encoder"],
    "text_encoder_2": dict(hidden_size=96, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=20, hidden_act="gelu", projection_dim=96),
    "embedding_std": 1.0,
    "builds_text_encoder_2": True,  # whatever model.pretrained holds
}

# SDXL-base at its published sizes (``models.families``' SDXL base: a 2,567.5M-weight UNet, CLIP ViT-L and OpenCLIP
# bigG with its projection, the 4-channel VAE scaled by 0.13025), trained from scratch on the frozen pretrained parts
# of model.pretrained (stabilityai/stable-diffusion-xl-base-1.0's vae/, text_encoder/, text_encoder_2/, tokenizer/).
def published(family: str, variant: str, **parts: str) -> dict:
    """An architecture of a family variant's published part configs: ``ours=theirs`` names each part."""
    configs = family_named(family).variant(variant).parts
    return {"family": family, **{ours: configs[theirs].config for ours, theirs in parts.items()}}


SDXL_BASE = published("sdxl", "base", unet="unet", vae="vae", text_encoder="text_encoder",
                      text_encoder_2="text_encoder_2")

# A tiny Flux.1-style transformer (diffusers' FluxTransformer2DModel: 2 double-stream and 2 single-stream blocks, 64
# wide, no guidance input, as schnell) over the tiny VAE's 4-channel latents packed 2x2 (16 channels a token; 32 px
# -> 8x8 latents -> 16 tokens), conditioned as Flux.1 is: T5 states (a tiny T5 encoder built here from its config,
# random and frozen, reading the tiny CLIP tokenizer's ids) and the tiny CLIP tower's pooled output.
TINY_FLUX = {
    "family": "flux",
    "transformer": dict(
        patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=4,
        joint_attention_dim=32, pooled_projection_dim=64, guidance_embeds=False, axes_dims_rope=(4, 6, 6),
    ),
    "vae": TINY["vae"],
    "text_encoder": TINY["text_encoder"],
    "embedding_std": 1.0,
    "t5_encoder": dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, feed_forward_proj="gated-gelu",
                       relative_attention_num_buckets=8, relative_attention_max_distance=32),
    "builds_t5_encoder": True,  # whatever model.pretrained holds
}

# Flux.1-schnell's transformer as published (19 double-stream and 38 single-stream blocks, 24 heads of 128, 16-channel
# latents packed 2x2, no guidance embedding), trained from scratch as MLPerf Training v5.1's text_to_image benchmark
# trains it (configs/flux-schnell-mlperf.yaml); its frozen CLIP-L, T5-XXL and 16-channel VAE load pretrained from
# model.pretrained (FLUX.1-schnell: a local folder, the HF cache or the hub).
FLUX_SCHNELL = published("flux", "schnell", transformer="transformer", vae="vae", text_encoder="text_encoder",
                         t5_encoder="text_encoder_2")

ARCHITECTURES = {"sd2-base": SD2_BASE, "tiny": TINY, "tiny-mmdit": TINY_MMDIT, "mmdit-medium": MMDIT_MEDIUM,
                 "tiny-sdxl": TINY_SDXL, "sdxl-base": SDXL_BASE,
                 "tiny-flux": TINY_FLUX, "flux-schnell": FLUX_SCHNELL}


def denoiser_config(architecture: str, overrides: dict | None = None) -> dict:
    """The architecture's denoiser config (its UNet's or transformer's) with ``overrides``."""
    arch = ARCHITECTURES[architecture]
    cfg = dict(arch.get("transformer") or arch["unet"])
    cfg.update(overrides or {})
    return cfg
