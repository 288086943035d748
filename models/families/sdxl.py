"""Stable Diffusion XL: a larger UNet conditioned on two CLIP text encoders' penultimate states side by side,
the second's pooled output, and the image's original size, crop and target size ("text_time"); a 4-channel VAE
whose latents are scaled by 0.13025; the discrete diffusion schedule and samplers of SD 1/2."""
from __future__ import annotations

from .family import Assembly, Family, Part, SingleFile, Variant
from .parts import CLIP_L, OPENCLIP_BIGG, clip_text, vae
from .stable_diffusion import DIFFUSION_SAMPLERS, NOISE_SCHEDULE, PREDICTION_TYPE, UNET_SIZES

UNET = Part("diffusers", "UNet2DConditionModel", dict(
    sample_size=128, in_channels=4, out_channels=4, flip_sin_to_cos=True, freq_shift=0,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(320, 640, 1280),
    layers_per_block=2, attention_head_dim=(5, 10, 20), transformer_layers_per_block=(1, 2, 10),
    cross_attention_dim=2048, use_linear_projection=True, addition_embed_type="text_time",
    addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816, norm_num_groups=32), UNET_SIZES)

# The refiner (stabilityai/stable-diffusion-xl-refiner-1.0's unet/config.json; sgm's sd_xl_refiner.yaml: 384
# channels x (1, 2, 4, 4), four transformer layers at the middle two levels, 64-wide heads): it attends to bigG's
# states alone (1280 wide) and takes five time ids, the aesthetic score in place of the target size (2 + 2 + 1).
REFINER_UNET = Part("diffusers", "UNet2DConditionModel", dict(
    sample_size=128, in_channels=4, out_channels=4, flip_sin_to_cos=True, freq_shift=0,
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    block_out_channels=(384, 768, 1536, 1536), layers_per_block=2, attention_head_dim=(6, 12, 24, 24),
    transformer_layers_per_block=4, cross_attention_dim=1280, use_linear_projection=True,
    addition_embed_type="text_time", addition_time_embed_dim=256, projection_class_embeddings_input_dim=2560,
    norm_num_groups=32), UNET_SIZES)
REFINER_TIME_IDS = 5  # original size (2), crop (2), aesthetic score (1); the base's: original and target size, crop


def variant_of_unet(config: dict) -> str:
    """"refiner" for a UNet whose added conditioning is its cross-attention states' pooled width plus five time
    embeddings (the refiner attends to bigG alone, whose states and pooled output are both 1280 wide: 1280 + 5 x 256
    = 2560); "base" otherwise (2816 = 1280 pooled + 6 x 256, beside 2048-wide states)."""
    cross, added, time = (config.get(k) for k in ("cross_attention_dim", "projection_class_embeddings_input_dim",
                                                   "addition_time_embed_dim"))
    if all(isinstance(v, int) for v in (cross, added, time)) and added == cross + REFINER_TIME_IDS * time:
        return "refiner"
    return "base"


# SDXL base's published scheduler (its scheduler/scheduler_config.json): Euler over the training schedule, with
# "leading" spacing offset by 1; the keys of the other samplers built from it (DDIM's, PNDM's) as it gives them. Built
# here, the unconditional branch of guidance is the empty caption's encoding, which caption dropout trained
# (``force_zeros_for_empty_prompt`` off: SDXL's own zeros were its training's dropout); no watermark.
SDXL_ASSEMBLY = Assembly(
    scheduler=dict(NOISE_SCHEDULE, _class_name="EulerDiscreteScheduler", timestep_spacing="leading", steps_offset=1,
                   interpolation_type="linear", use_karras_sigmas=False, clip_sample=False, set_alpha_to_one=False,
                   skip_prk_steps=True, sample_max_value=1.0),
    settings=PREDICTION_TYPE, options={"force_zeros_for_empty_prompt": False, "add_watermarker": False})
# Stability's sgm layout: the UNet, the VAE and both text encoders in one file
SDXL_FILE = SingleFile("sdxl-sgm", ("unet", "vae", "text_encoder", "text_encoder_2"), reads_published_alone=True)

# Published: "a 3.5B parameter base model" (SDXL 1.0's release): the UNet, both text encoders and the VAE. The
# refiner's UNet: 2.3B (ours: 2.260B); with bigG and the VAE it is 3.04B, and base and refiner together the
# release's "6.6B parameter model ensemble pipeline" (ours: 6.51B).
SDXL = Family(
    name="sdxl", label="Stable Diffusion XL", pipeline="StableDiffusionXLPipeline", denoiser="unet",
    text_encoders=("text_encoder", "text_encoder_2"), schedule="diffusion", samplers=DIFFUSION_SAMPLERS,
    native_size=1024, size_range=(512, 2048), latent_channels=4,
    # the refiner is saved as an image-to-image pipeline without the first text encoder, an inpainting model (its
    # 9-channel UNet) as the inpainting pipeline
    folder_classes=frozenset({"StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline",
                              "StableDiffusionXLInpaintPipeline"}),
    single_file_marks=("conditioner.embedders.",),
    single_file_text_marks=("conditioner.embedders.",), assembly=SDXL_ASSEMBLY, single_file=SDXL_FILE,
    variants=(Variant("base", {"unet": UNET, "text_encoder": clip_text(CLIP_L),
                               "text_encoder_2": clip_text(OPENCLIP_BIGG, projection=True),
                               "vae": vae(4, 0.13025, sample_size=1024)},
                      published_parameters=3.5e9, guidance_scale=5.0, steps=30,
                      hub_id="stabilityai/stable-diffusion-xl-base-1.0"),
              Variant("refiner", {"unet": REFINER_UNET, "text_encoder_2": clip_text(OPENCLIP_BIGG, projection=True),
                                  "vae": vae(4, 0.13025, sample_size=1024)},
                      published_parameters=2.3e9, published_parts=("unet",), published_tolerance=0.02,
                      hub_id="stabilityai/stable-diffusion-xl-refiner-1.0", refiner=True)),
    pick_variant=variant_of_unet, refiner_pipeline="StableDiffusionXLImg2ImgPipeline",
    img2img_pipeline="StableDiffusionXLImg2ImgPipeline", inpaint_pipeline="StableDiffusionXLInpaintPipeline",
    controlnet_pipeline="StableDiffusionXLControlNetPipeline",
    prompt_weights=("PENULTIMATE_HIDDEN_STATES_NON_NORMALIZED",), lora_layout="kohya")
