"""The rectified-flow objective against diffusers' own implementation: the scheduler SD3 and Flux.1 sample with
(``FlowMatchEulerDiscreteScheduler``: its noising, shifted sigmas, dynamic shift and Euler step) and its SD3
training utilities (logit-normal draws, loss weightings)."""
from __future__ import annotations

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux.pipeline_flux import calculate_shift
from diffusers.training_utils import compute_density_for_timestep_sampling, compute_loss_weighting_for_sd3

from models.families.flow import RectifiedFlow, patches_shift, shifted

X0, NOISE = torch.randn(4, 16, 8, 8, generator=torch.Generator().manual_seed(0)), \
    torch.randn(4, 16, 8, 8, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_noising_and_each_euler_step_equal_the_flow_scheduler(shift):
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(sigmas=torch.linspace(1, 1 / 8, 8).numpy())  # as the Flux pipeline asks for them
    sigmas = scheduler.sigmas
    torch.testing.assert_close(sigmas[:-1], shifted(torch.linspace(1, 1 / 8, 8), shift), rtol=0, atol=1e-6)
    picked = scheduler.timesteps[[0, 2, 5, 7]]
    expected = scheduler.scale_noise(X0, picked, NOISE)
    ours = RectifiedFlow.noised(X0, NOISE, sigmas[[0, 2, 5, 7]])
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)

    sample, velocity = NOISE.clone(), RectifiedFlow.velocity(X0, NOISE)
    for i, timestep in enumerate(scheduler.timesteps):
        theirs = scheduler.step(velocity, timestep, sample).prev_sample
        sample = RectifiedFlow.euler_step(sample, velocity, float(sigmas[i]), float(sigmas[i + 1]))
        torch.testing.assert_close(sample, theirs, rtol=0, atol=1e-5)
    torch.testing.assert_close(sample, X0, rtol=0, atol=1e-4)  # a true velocity walks the straight path to x0


def test_fluxs_resolution_shift_equals_the_dynamic_shift_its_pipeline_sets():
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096)
    for patches in (256, 1024, 4096):  # 512^2, 1024^2 and 2048^2 px images in Flux.1's 2x2 patches of 1/8 latents
        scheduler.set_timesteps(sigmas=torch.linspace(1, 1 / 10, 10).numpy(), mu=calculate_shift(patches))
        ours = shifted(torch.linspace(1, 1 / 10, 10), patches_shift(patches))
        torch.testing.assert_close(scheduler.sigmas[:-1], ours, rtol=0, atol=1e-6)


def test_logit_normal_draws_and_weightings_equal_diffusers_sd3_training_utilities():
    flow = RectifiedFlow(logit_mean=0.3, logit_std=1.2)
    theirs = compute_density_for_timestep_sampling("logit_normal", 64, logit_mean=0.3, logit_std=1.2,
                                                   generator=torch.Generator().manual_seed(5))
    ours = flow.draw_t(torch.randn(64, generator=torch.Generator().manual_seed(5)))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    for weighting in ("none", "cosmap", "sigma_sqrt"):
        expected = compute_loss_weighting_for_sd3(weighting if weighting != "none" else "logit_normal", sigmas=ours)
        torch.testing.assert_close(RectifiedFlow(weighting=weighting).weights(ours), expected.float(), rtol=1e-6,
                                   atol=0)


def test_uniform_draws_equal_diffusers_uniform_timestep_density():
    """``sampling="uniform"`` unshifted is diffusers' ``compute_density_for_timestep_sampling`` for a scheme without a
    density (u ~ U[0, 1), what its Flux and SD3 trainers draw with ``--weighting_scheme none``): the same numbers from
    the same generator, and ``draws_uniform`` asks the model for uniform draws."""
    theirs = compute_density_for_timestep_sampling("none", 64, generator=torch.Generator().manual_seed(5))
    flow = RectifiedFlow(logit_mean=0.3, logit_std=1.2, sampling="uniform")
    assert flow.draws_uniform and not RectifiedFlow().draws_uniform
    assert torch.equal(flow.draw_t(torch.rand(64, generator=torch.Generator().manual_seed(5))), theirs)
