"""Tiny random-weight checkpoints of the newer families, written by diffusers' own ``save_pretrained`` from
small configs of each family's real classes (the layouts diffusers' own tests use for these pipelines): SDXL
(two CLIP encoders, "text_time" conditioning), SD3 (MMDiT, CLIP-L + bigG + T5, 16 latent channels, a flow
schedule) and Flux.1 (dev: guidance embedded; schnell: none). Tokenizers: the real CLIP BPE vocabulary
(``models.checkpoints.clip_bpe``), and a T5 tokenizer of a few words built with the ``tokenizers`` library."""
from __future__ import annotations

from pathlib import Path

import torch

WORDS = ["<pad>", "</s>", "<unk>", *"a an the red blue green circle square triangle above below left of right small "
         "large".split()]


def _clip_tokenizer(folder: Path):
    from transformers import CLIPTokenizer

    from models.checkpoints.clip_bpe import write_clip_tokenizer

    write_clip_tokenizer(folder, pad_token="<|endoftext|>")
    return CLIPTokenizer.from_pretrained(folder)


def _t5_tokenizer(folder: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import T5TokenizerFast

    model = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    T5TokenizerFast(tokenizer_object=model, eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                    extra_ids=0).save_pretrained(folder)
    return T5TokenizerFast.from_pretrained(folder)


def _clip(projection: bool = False, width: int = 32):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(bos_token_id=0, eos_token_id=2, pad_token_id=1, vocab_size=49408, hidden_size=width,
                            intermediate_size=37, num_attention_heads=4, num_hidden_layers=2, hidden_act="gelu",
                            projection_dim=32)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config)


def _t5(width: int = 32):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=len(WORDS), d_model=width, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))


def _vae(latent_channels: int, scaling_factor: float, shift_factor: float | None = None):
    from diffusers import AutoencoderKL

    flow = {} if shift_factor is None else dict(shift_factor=shift_factor, use_quant_conv=False,
                                                use_post_quant_conv=False)
    return AutoencoderKL(block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=latent_channels,
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         sample_size=64, norm_num_groups=32, scaling_factor=scaling_factor, **flow)


def write_sdxl(out: Path, tokenizers: Path) -> Path:
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=2, sample_size=32, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, transformer_layers_per_block=(1, 2), projection_class_embeddings_input_dim=80,
        cross_attention_dim=32 + 48, norm_num_groups=32)  # both towers' states side by side
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       steps_offset=1, timestep_spacing="leading")
    # the second tower wider than the first, as bigG (1280) is than ViT-L (768): diffusers' single-file loader
    # tells the two apart by their widths
    StableDiffusionXLPipeline(vae=_vae(4, 0.13025), text_encoder=_clip(),
                              text_encoder_2=_clip(projection=True, width=48),
                              tokenizer=_clip_tokenizer(tokenizers / "clip"),
                              tokenizer_2=_clip_tokenizer(tokenizers / "clip"), unet=unet,
                              scheduler=scheduler).save_pretrained(out)
    return out


def write_sdxl_refiner(out: Path, tokenizers: Path) -> Path:
    """SDXL's refiner as diffusers' own refiner tests build it: an image-to-image pipeline without the first text
    encoder, its UNet attending to the second tower alone and taking the aesthetic score among five time ids
    (72 = 32 pooled + 5 x 8)."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLImg2ImgPipeline, UNet2DConditionModel

    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=2, sample_size=32, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, transformer_layers_per_block=(1, 2), projection_class_embeddings_input_dim=72,
        cross_attention_dim=32, norm_num_groups=32)
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                       steps_offset=1, timestep_spacing="leading")
    StableDiffusionXLImg2ImgPipeline(vae=_vae(4, 0.13025), text_encoder=None, tokenizer=None,
                                     text_encoder_2=_clip(projection=True),
                                     tokenizer_2=_clip_tokenizer(tokenizers / "clip"), unet=unet, scheduler=scheduler,
                                     requires_aesthetics_score=True).save_pretrained(out)
    return out


def write_sd3(out: Path, tokenizers: Path) -> Path:
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    # two blocks, the last attending without a context output (as every MMDiT's last), q/k RMS-normed as SD3.5's
    transformer = SD3Transformer2DModel(sample_size=32, patch_size=1, in_channels=16, out_channels=16, num_layers=2,
                                        attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32,
                                        joint_attention_dim=96, pooled_projection_dim=64, qk_norm="rms_norm")
    StableDiffusion3Pipeline(
        transformer=transformer, vae=_vae(16, 1.5305, 0.0609), text_encoder=_clip(projection=True),
        # CLIP-G wider than CLIP-L (as 1280 is than 768: diffusers' single-file loader tells them apart by width),
        # and T5 wider than both side by side (the pipeline pads the CLIP states to T5's width)
        tokenizer=_clip_tokenizer(tokenizers / "clip"), text_encoder_2=_clip(projection=True, width=48),
        tokenizer_2=_clip_tokenizer(tokenizers / "clip"), text_encoder_3=_t5(width=96),
        tokenizer_3=_t5_tokenizer(tokenizers / "t5"),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0)).save_pretrained(out)
    return out


def write_flux(out: Path, tokenizers: Path, dev: bool = True) -> Path:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    transformer = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                         pooled_projection_dim=32, axes_dims_rope=(4, 4, 8), guidance_embeds=dev)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096, shift=3.0)
    FluxPipeline(transformer=transformer, vae=_vae(16, 0.3611, 0.1159), text_encoder=_clip(),
                 tokenizer=_clip_tokenizer(tokenizers / "clip"), text_encoder_2=_t5(),
                 tokenizer_2=_t5_tokenizer(tokenizers / "t5"), scheduler=scheduler).save_pretrained(out)
    return out


def write_family_folders(root: Path) -> dict[str, Path]:
    """``{"sdxl", "sd3", "flux-dev", "flux-schnell"}`` -> a diffusers folder each, seeded for repeatability."""
    torch.manual_seed(0)
    tokenizers = root / "tokenizers"
    return {"sdxl": write_sdxl(root / "sdxl", tokenizers), "sd3": write_sd3(root / "sd3", tokenizers),
            "flux-dev": write_flux(root / "flux-dev", tokenizers),
            "flux-schnell": write_flux(root / "flux-schnell", tokenizers, dev=False)}
