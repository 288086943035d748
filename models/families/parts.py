"""The parts several families share, at full size, as their published configs give them: the CLIP and T5 text
encoders and the VAEs. A family's module picks from here and adds its denoiser."""
from __future__ import annotations

from .family import Part

_CLIP = dict(vocab_size=49408, max_position_embeddings=77, bos_token_id=0, eos_token_id=2, pad_token_id=1)
# OpenAI CLIP ViT-L/14's text tower: SD 1.x's encoder, the first of SDXL's, SD3's and Flux.1's
CLIP_L = dict(_CLIP, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
              projection_dim=768, hidden_act="quick_gelu")
# OpenCLIP ViT-H/14 (SD 2.x: 23 of its 24 layers, conditioning on the penultimate one)
OPENCLIP_H = dict(_CLIP, hidden_size=1024, intermediate_size=4096, num_hidden_layers=23, num_attention_heads=16,
                  projection_dim=512, hidden_act="gelu")
# OpenCLIP ViT-bigG/14 with its projection: SDXL's and SD3's second encoder (its pooled output conditions too)
OPENCLIP_BIGG = dict(_CLIP, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
                     projection_dim=1280, hidden_act="gelu")
# T5 v1.1 XXL's encoder: SD3's third text encoder and Flux.1's second
T5_XXL = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
              feed_forward_proj="gated-gelu", is_gated_act=True, dense_act_fn="gelu_new", relative_attention_num_buckets=32)

# The keys that size each shared part (``Part.sizes``)
CLIP_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "max_position_embeddings", "projection_dim")
T5_SIZES = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads", "relative_attention_num_buckets")
VAE_SIZES = ("sample_size", "in_channels", "out_channels", "latent_channels", "block_out_channels", "layers_per_block",
             "norm_num_groups", "down_block_types", "up_block_types")

_VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
            act_fn="silu", norm_num_groups=32)


def clip_text(config: dict, projection: bool = False) -> Part:
    return Part("transformers", "CLIPTextModelWithProjection" if projection else "CLIPTextModel", config, CLIP_SIZES)


def t5_encoder() -> Part:
    return Part("transformers", "T5EncoderModel", T5_XXL, T5_SIZES)


def vae(latent_channels: int, scaling_factor: float, shift_factor: float | None = None, sample_size: int = 512) -> Part:
    """The KL autoencoder all these families share the layout of: 4 latent channels (SD 1/2, SDXL) or 16 without
    the quantisation convolutions (SD3, Flux.1), each with the scale (and shift) its latents are normalised by."""
    extra = {} if shift_factor is None else dict(shift_factor=shift_factor, use_quant_conv=False,
                                                 use_post_quant_conv=False)
    return Part("diffusers", "AutoencoderKL", dict(_VAE, latent_channels=latent_channels, sample_size=sample_size,
                                                   scaling_factor=scaling_factor, **extra), VAE_SIZES)
