"""Stable Diffusion 1.x and 2.x: one UNet conditioned on one CLIP text encoder's last (1.x) or penultimate (2.x)
hidden states, a 4-channel VAE, a discrete diffusion schedule (epsilon, or v for SD 2.x at 768 px)."""
from __future__ import annotations

from .family import ORIGINAL_SD, Assembly, Family, Part, SingleFile, Variant
from .parts import CLIP_L, OPENCLIP_H, clip_text, vae

# The keys that size a UNet (``Part.sizes``): SDXL's too
UNET_SIZES = ("sample_size", "in_channels", "out_channels", "block_out_channels", "layers_per_block",
              "attention_head_dim", "transformer_layers_per_block", "cross_attention_dim", "norm_num_groups",
              "addition_time_embed_dim", "projection_class_embeddings_input_dim", "down_block_types", "up_block_types")
# The SD2 training noise schedule (SD 1/2's and SDXL's): DDPM, scaled-linear betas 0.00085 to 0.012 over 1000 steps
NOISE_SCHEDULE = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
PREDICTION_TYPE = (("prediction_type", "prediction_type", str),)  # a UNet's spec says what it predicts
# Built here, an SD pipeline starts with the workbench's default sampler over the training schedule, with SD2's
# timestep spacing: "leading", offset 1 (20 steps: 951, 901, ..., 1); no safety checker
SD_ASSEMBLY = Assembly(
    scheduler=dict(NOISE_SCHEDULE, _class_name="DDIMScheduler", clip_sample=False, set_alpha_to_one=False,
                   steps_offset=1, timestep_spacing="leading"),
    settings=PREDICTION_TYPE, default_sampler=True,
    options={"safety_checker": None, "feature_extractor": None, "requires_safety_checker": False})
DIFFUSION_SAMPLERS = ("DDIM", "Euler", "Euler a", "Heun", "LMS", "DPM++ 2M", "DPM++ 2M Karras", "UniPC", "PNDM")


def unet(cross_attention_dim: int, attention_head_dim, linear: bool, sample_size: int = 64) -> Part:
    return Part("diffusers", "UNet2DConditionModel", dict(
        sample_size=sample_size, in_channels=4, out_channels=4, flip_sin_to_cos=True, freq_shift=0,
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3, block_out_channels=(320, 640, 1280, 1280),
        layers_per_block=2, downsample_padding=1, mid_block_scale_factor=1, act_fn="silu", norm_num_groups=32,
        norm_eps=1e-5, cross_attention_dim=cross_attention_dim, attention_head_dim=attention_head_dim,
        use_linear_projection=linear), UNET_SIZES)


def _sd_family(name: str, label: str, variant: Variant, marks: tuple[str, ...], size: int) -> Family:
    return Family(name=name, label=label, pipeline="StableDiffusionPipeline", denoiser="unet",
                  text_encoders=("text_encoder",), schedule="diffusion", samplers=DIFFUSION_SAMPLERS, native_size=size,
                  size_range=(256, 1024), latent_channels=4,
                  # an inpainting model's folder (its 9-channel UNet) is saved as the inpainting pipeline
                  folder_classes=frozenset({"StableDiffusionPipeline", "StableDiffusionInpaintPipeline"}),
                  single_file_marks=marks, single_file_text_marks=("cond_stage_model.",), variants=(variant,),
                  assembly=SD_ASSEMBLY, single_file=SingleFile(ORIGINAL_SD, ("unet", "vae", "text_encoder")),
                  img2img_pipeline="StableDiffusionImg2ImgPipeline", inpaint_pipeline="StableDiffusionInpaintPipeline",
                  controlnet_pipeline="StableDiffusionControlNetPipeline",
                  prompt_weights=("LAST_HIDDEN_STATES_NORMALIZED", "PENULTIMATE_HIDDEN_STATES_NORMALIZED"),
                  lora_layout="kohya",
                  # no safety checker: the pipelines warn unless told it is not required
                  pipeline_options={"safety_checker": None, "requires_safety_checker": False})


# Published: "an 860M UNet and 123M text encoder" (SD 1.x model cards): the UNet's figure.
SD1 = _sd_family("sd1", "Stable Diffusion 1.x", Variant(
    "1.5", {"unet": unet(768, 8, linear=False), "text_encoder": clip_text(CLIP_L), "vae": vae(4, 0.18215)},
    published_parameters=860e6, published_parts=("unet",), hub_id="stable-diffusion-v1-5/stable-diffusion-v1-5"),
    marks=("cond_stage_model.transformer.",), size=512)

# Published: a UNet of 865M parameters (the SD 2 model cards); 2-base samples at 512 px with epsilon.
SD2 = _sd_family("sd2", "Stable Diffusion 2.x", Variant(
    "2-base", {"unet": unet(1024, (5, 10, 20, 20), linear=True), "text_encoder": clip_text(OPENCLIP_H),
               "vae": vae(4, 0.18215)},
    published_parameters=865e6, published_parts=("unet",), hub_id="stabilityai/stable-diffusion-2-base"),
    marks=("cond_stage_model.model.",), size=512)
