"""Rectified flow, the objective SD3 and Flux.1 are trained with: a straight path between an image's latents and
noise, and a model that predicts the velocity along it.

- **Path.** ``x_t = (1 - t) x0 + t eps`` for t in [0, 1] (t = 1 is pure noise), the velocity ``eps - x0`` its
  target (Liu et al. 2022, "Flow straight and fast"; SD3: Esser et al. 2024, arXiv 2403.03206, section 2).
- **Where t is drawn.** From a logit-normal: ``t = sigmoid(m + s n)``, n standard normal (SD3 section 3.1; m = 0,
  s = 1 was their best), or uniform in [0, 1) (the rectified-flow baseline SD3 compares against, and what MLPerf's
  Flux.1 reference draws, unshifted); then shifted towards noise for larger images, ``t' = a t / (1 + (a - 1) t)``
  (SD3 section 5.3.2, eq. 23, with a = sqrt(m / n) for m pixels against the n it was tuned at; SD3 samples with
  a = 3). Flux.1 chooses a from the number of latent patches: ``a = exp(mu)``, mu linear from 0.5 at 256 patches to
  1.15 at 4,096 (its exponential time shift is the same map with a = exp(mu)).
- **Weighting.** None (SD3's choice with logit-normal draws), or SD3's ``cosmap`` and ``sigma_sqrt`` options.
- **Sampling.** One Euler step from t to t' is ``x + (t' - t) v``.

Diffusers' ``FlowMatchEulerDiscreteScheduler`` noises and steps the same way (tests/families/test_flow.py).
Light to import: torch only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

TRAIN_TIMESTEPS = 1000  # the transformers take t scaled to diffusers' 1,000 training timesteps
WEIGHTINGS = ("none", "cosmap", "sigma_sqrt")
SAMPLINGS = ("logit_normal", "uniform")  # how t is drawn before the shift


def shifted(t: torch.Tensor, shift: float) -> torch.Tensor:
    """t moved towards noise by ``shift`` (SD3 eq. 23): a t / (1 + (a - 1) t)."""
    return shift * t / (1 + (shift - 1) * t)


def patches_shift(image_patches: int, base_patches: int = 256, max_patches: int = 4096, base_mu: float = 0.5,
                  max_mu: float = 1.15) -> float:
    """Flux.1's shift for an image of ``image_patches`` latent patches: exp(mu), mu linear in the patches."""
    slope = (max_mu - base_mu) / (max_patches - base_patches)
    return math.exp(base_mu + slope * (image_patches - base_patches))


def pixels_shift(pixels: int, base_pixels: int) -> float:
    """SD3's shift for an image of ``pixels`` against the ``base_pixels`` the schedule was tuned at: sqrt(m / n)."""
    return math.sqrt(pixels / base_pixels)


@dataclass(frozen=True)
class RectifiedFlow:
    logit_mean: float = 0.0
    logit_std: float = 1.0
    shift: float = 1.0
    weighting: str = "none"
    sampling: str = "logit_normal"

    @property
    def draws_uniform(self) -> bool:
        """Whether ``draw_t`` takes uniform draws in [0, 1) (else standard-normal ones)."""
        return self.sampling == "uniform"

    def draw_t(self, draw: torch.Tensor) -> torch.Tensor:
        """Each sample's t from its draw, then shifted: logit-normal from a standard-normal draw, or the uniform draw
        in [0, 1) itself (``draws_uniform``)."""
        t = draw if self.draws_uniform else torch.sigmoid(self.logit_mean + self.logit_std * draw)
        return shifted(t, self.shift)

    @staticmethod
    def noised(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        t = t.view(-1, *([1] * (x0.dim() - 1))).to(x0.dtype)
        return (1 - t) * x0 + t * noise

    @staticmethod
    def velocity(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The target: d x_t / d t."""
        return noise - x0

    def weights(self, t: torch.Tensor) -> torch.Tensor:
        """Each sample's loss weight at its t."""
        if self.weighting == "cosmap":
            return 2 / (math.pi * (1 - 2 * t + 2 * t**2))
        if self.weighting == "sigma_sqrt":
            return t.float() ** -2.0
        return torch.ones_like(t, dtype=torch.float32)

    @staticmethod
    def euler_step(sample: torch.Tensor, velocity: torch.Tensor, t: float, t_next: float) -> torch.Tensor:
        return sample + (t_next - t) * velocity
