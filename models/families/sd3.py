"""Stable Diffusion 3 and 3.5: a multimodal diffusion transformer (MMDiT; 3.5-medium's MMDiT-X adds a second
attention to its first 13 blocks) over 2x2 patches of 16-channel latents, conditioned on CLIP-L and bigG
(penultimate states and pooled outputs) and T5-XXL; trained with rectified flow, sampled along a shifted flow."""
from __future__ import annotations

from .family import Assembly, Family, Part, SingleFile, Variant
from .parts import CLIP_L, OPENCLIP_BIGG, clip_text, t5_encoder, vae

FLOW_SAMPLERS = ("Euler", "Heun", "DPM++ 2M", "UniPC")
# The keys that size an MMDiT (``Part.sizes``)
MMDIT_SIZES = ("sample_size", "patch_size", "in_channels", "out_channels", "num_layers", "attention_head_dim",
               "num_attention_heads", "joint_attention_dim", "caption_projection_dim", "pooled_projection_dim",
               "pos_embed_max_size")
T5_WIDTH = 4096  # T5-XXL's states, which every published SD3 attends to beside its CLIP states


def clip_only_options(config: dict, all_text_encoders: bool) -> dict:
    """An MMDiT without its T5 whose joint attention is narrower than T5-XXL's states was trained on its CLIP states
    alone (as `dwb train` trains one): its pipeline is called with no T5 tokens, not with 256 zero tokens it never
    saw. A published SD3 without its T5 (4,096 wide) was trained with T5's states dropped to zeros: it keeps them."""
    narrow = config.get("joint_attention_dim", T5_WIDTH) < T5_WIDTH
    return {"max_sequence_length": 0} if narrow and not all_text_encoders else {}


def mmdit(layers: int, caption_projection_dim: int, pos_embed_max_size: int, dual_attention_layers=()) -> Part:
    return Part("diffusers", "SD3Transformer2DModel", dict(
        sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=layers, attention_head_dim=64,
        num_attention_heads=layers, joint_attention_dim=4096, caption_projection_dim=caption_projection_dim,
        pooled_projection_dim=2048, pos_embed_max_size=pos_embed_max_size, qk_norm="rms_norm",
        dual_attention_layers=tuple(dual_attention_layers)), MMDIT_SIZES)


def _parts(transformer: Part) -> dict[str, Part]:
    return {"transformer": transformer, "text_encoder": clip_text(CLIP_L, projection=True),
            "text_encoder_2": clip_text(OPENCLIP_BIGG, projection=True), "text_encoder_3": t5_encoder(),
            "vae": vae(16, 1.5305, shift_factor=0.0609, sample_size=1024)}


# Built here, the flow sampler SD3's pipeline starts from, at the shift the transformer was trained with (its spec's
# ``flow.shift``); a transformer trained with one CLIP tower (with projection) has it in both CLIP slots and no T5
# (sampled with ``max_sequence_length=0``, as it was trained: ``clip_only_options``)
SD3_ASSEMBLY = Assembly(
    scheduler={"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 3.0},
    settings=(("shift", "flow.shift", float),),
    shared=(("text_encoder_2", "text_encoder"), ("tokenizer_2", "tokenizer")), absent=("text_encoder_3",))
# ``sd3.5_*.safetensors`` with its encoders, or, for a pipeline without all three, ``sd3_medium.safetensors``'s
# layout: the MMDiT and the VAE alone
SD3_FILE = SingleFile("sd3.5", ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"),
                      without_text=SingleFile("sd3-medium", ("transformer", "vae")))

# Published: "8.1 billion parameters" (3.5 Large) and "2.5 billion parameters" (3.5 Medium): the MMDiT's.
SD3 = Family(
    name="sd3", label="Stable Diffusion 3.5", pipeline="StableDiffusion3Pipeline", denoiser="transformer",
    text_encoders=("text_encoder", "text_encoder_2", "text_encoder_3"), schedule="flow", samplers=FLOW_SAMPLERS,
    native_size=1024, size_range=(512, 1536), latent_channels=16,
    folder_classes=frozenset({"StableDiffusion3Pipeline"}), single_file_marks=("joint_blocks.",),
    single_file_text_marks=("text_encoders.",), assembly=SD3_ASSEMBLY, single_file=SD3_FILE,
    variants=(Variant("3.5-large", _parts(mmdit(38, 2432, 192)), published_parameters=8.1e9,
                      published_parts=("transformer",), guidance_scale=3.5, steps=28,
                      hub_id="stabilityai/stable-diffusion-3.5-large"),
              # The card's 2.5B is no sum of its parts at the published config: the MMDiT-X counts 2.24B (the
              # 2.0B of SD3-medium's 24 blocks and the second attention of the first 13), with CLIP-L 2.37B.
              Variant("3.5-medium", _parts(mmdit(24, 1536, 384, range(13))), published_parameters=2.5e9,
                      published_parts=("transformer",), published_tolerance=0.11, guidance_scale=4.5, steps=40,
                      hub_id="stabilityai/stable-diffusion-3.5-medium")),
    pick_variant=lambda config: "3.5-large" if config.get("num_layers", 0) > 24 else "3.5-medium",
    text_options=clip_only_options, text_length_option="max_sequence_length", text_length_tokenizer="tokenizer_3",
    third_tokenizer="T5TokenizerFast", img2img_pipeline="StableDiffusion3Img2ImgPipeline",
    inpaint_pipeline="StableDiffusion3InpaintPipeline")
