"""The samplers a pipeline built here starts with (each family's ``Assembly``), and the DDPM schedule a UNet trains on."""
from __future__ import annotations

from diffusers import DDPMScheduler

from ..families import NOISE_SCHEDULE, Family, family_named
from ..generation import DEFAULT_SAMPLER, make_sampler


def ddpm_scheduler(prediction_type: str) -> DDPMScheduler:
    return DDPMScheduler(**NOISE_SCHEDULE, prediction_type=prediction_type, clip_sample=False)


def family_scheduler(family: Family, settings: dict):
    """The sampler a pipeline of ``family`` built here starts with (``Family.assembly``), at what a trained model sets
    (``settings``: its prediction type, its flow's shift)."""
    import diffusers

    assembly = family.assembly
    config = {**assembly.scheduler, **{key: settings[key] for key, _, _ in assembly.settings}}
    scheduler = getattr(diffusers, config["_class_name"]).from_config(config)
    return make_sampler(DEFAULT_SAMPLER, scheduler.config) if assembly.default_sampler else scheduler


def inference_scheduler(prediction_type: str):
    """The sampler an SD 1/2 pipeline built here starts with."""
    return family_scheduler(family_named("sd2"), {"prediction_type": prediction_type})
