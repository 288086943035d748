"""The SD2 noise schedule a model is trained on, and the sampler a pipeline starts with over it."""
from __future__ import annotations

from diffusers import DDIMScheduler, DDPMScheduler

from ..generation import DEFAULT_SAMPLER, make_sampler

# The SD2 training noise schedule: DDPM, scaled-linear betas 0.00085 to 0.012 over 1000 steps.
NOISE_SCHEDULE = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")


def ddpm_scheduler(prediction_type: str) -> DDPMScheduler:
    return DDPMScheduler(**NOISE_SCHEDULE, prediction_type=prediction_type, clip_sample=False)


def inference_scheduler(prediction_type: str):
    """The pipeline's default sampler (DEFAULT_SAMPLER) over the training schedule, with SD2's timestep
    spacing: "leading", offset 1 (20 steps: 951, 901, ..., 1)."""
    base = DDIMScheduler(**NOISE_SCHEDULE, prediction_type=prediction_type, clip_sample=False,
                         set_alpha_to_one=False, steps_offset=1, timestep_spacing="leading")
    return make_sampler(DEFAULT_SAMPLER, base.config)
