"""Samplers by the names A1111 shows, each built from a scheduler config (a pipeline's own), so the
checkpoint's noise schedule (SD2's scaled-linear betas) and prediction type carry over.

Light to import (diffusers loads on first use), so command lines can list the names.
"""
from __future__ import annotations

from ..errors import WorkbenchError

# name -> (diffusers scheduler class, settings on top of the base config)
SAMPLERS: dict[str, tuple[str, dict]] = {
    "DDIM": ("DDIMScheduler", {}),
    "Euler": ("EulerDiscreteScheduler", {}),
    "Euler a": ("EulerAncestralDiscreteScheduler", {}),
    "Heun": ("HeunDiscreteScheduler", {}),
    "LMS": ("LMSDiscreteScheduler", {}),
    "DPM++ 2M": ("DPMSolverMultistepScheduler", dict(algorithm_type="dpmsolver++", solver_order=2, use_karras_sigmas=False)),
    "DPM++ 2M Karras": ("DPMSolverMultistepScheduler", dict(algorithm_type="dpmsolver++", solver_order=2,
                                                             use_karras_sigmas=True)),
    "UniPC": ("UniPCMultistepScheduler", {}),
    "PNDM": ("PNDMScheduler", dict(skip_prk_steps=True)),
}


# Results rows and sample manifests written before the sampler had one name call it "scheduler".
OLD_SAMPLER_KEY = "scheduler"


def with_sampler_key(record: dict) -> dict:
    """``record`` (a results row, a manifest line) with an older file's ``scheduler`` key read as ``sampler``."""
    if OLD_SAMPLER_KEY in record and "sampler" not in record:
        record["sampler"] = record.pop(OLD_SAMPLER_KEY)
    return record


def check_sampler(name: str) -> None:
    """A one-line error for a name that is not in SAMPLERS (callers check before any work starts)."""
    if name not in SAMPLERS:
        raise WorkbenchError(f"unknown sampler {name!r}; choose one of: {', '.join(SAMPLERS)}")


# The same names along a rectified flow (SD3, Flux.1): the flow's own Euler and Heun, and DPM-Solver++ and UniPC
# stepping the flow's sigmas (shifted as the checkpoint's scheduler shifts them).
FLOW_SAMPLERS: dict[str, tuple[str, dict]] = {
    "Euler": ("FlowMatchEulerDiscreteScheduler", {}),
    "Heun": ("FlowMatchHeunDiscreteScheduler", {}),
    "DPM++ 2M": ("DPMSolverMultistepScheduler", dict(algorithm_type="dpmsolver++", solver_order=2,
                                                     use_flow_sigmas=True, prediction_type="flow_prediction")),
    "UniPC": ("UniPCMultistepScheduler", dict(use_flow_sigmas=True, prediction_type="flow_prediction")),
}


def is_flow(base_config: dict) -> bool:
    """Whether a scheduler config describes a rectified flow (diffusers' flow-matching schedulers)."""
    return str(base_config.get("_class_name", "")).startswith("FlowMatch") or bool(base_config.get("use_flow_sigmas"))


def make_sampler(name: str, base_config: dict):
    """A fresh scheduler (schedulers hold per-call state) of sampler ``name``, from ``base_config``: along the
    flow where ``base_config`` is a flow's (``FLOW_SAMPLERS``), else over its diffusion schedule."""
    check_sampler(name)
    import diffusers

    if is_flow(base_config):
        if name not in FLOW_SAMPLERS:
            raise WorkbenchError(f"{name!r} does not sample a rectified flow; choose one of: "
                                 f"{', '.join(FLOW_SAMPLERS)}")
        cls, settings = FLOW_SAMPLERS[name]
        if settings.get("use_flow_sigmas"):
            settings = {**settings, "flow_shift": base_config.get("shift", 1.0)}
        return getattr(diffusers, cls).from_config(base_config, **settings)
    cls, settings = SAMPLERS[name]
    return getattr(diffusers, cls).from_config(base_config, **settings)


def sampler_name(scheduler) -> str:
    """The SAMPLERS name of a scheduler object (its class name when it matches none of them)."""
    cls, cfg = type(scheduler).__name__, scheduler.config
    for name, (want, settings) in (FLOW_SAMPLERS if is_flow(cfg) else SAMPLERS).items():
        if cls == want and all(cfg.get(k) == v for k, v in settings.items()):
            return name
    return cls
