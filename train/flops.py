"""Training FLOPs of a config's denoiser, counted: one batch at the config's batch size and resolution through
the model's forward, loss and backward under PyTorch's ``FlopCounterMode`` (matrix products and convolutions,
forward and backward), the frozen VAE and text encoder left out: they cost the same whatever the denoiser, and a
run on precomputed latents does not pay them. So two recipes compare at equal training compute by counting, not
by a rule of thumb such as 6 x parameters x tokens (which a UNet's convolutions do not follow)."""
from __future__ import annotations

import torch

from .config import TrainConfig


def batch_flops(cfg: TrainConfig) -> float:
    """The FLOPs of one training batch of ``cfg``'s denoiser."""
    from torch.utils.flop_counter import FlopCounterMode

    from .model import Draws
    from .trainer import build_model

    model = build_model(cfg).train()
    n, side = cfg.global_train_batch_size, cfg.data.resolution
    generator = torch.Generator().manual_seed(0)
    batch = {"image": torch.rand(n, 3, side, side, generator=generator) * 2 - 1,
             # random ids of each tower's tokenizer, at the length it pads to
             **{key: torch.randint(0, len(tokenizer), ids.shape, generator=generator)
                for (key, ids), tokenizer in zip(model.caption_ids([""] * n).items(),
                                                 (model.tokenizer, model.tokenizer_2))},
             # an image batch's size conditioning (SDXL's): square images, uncropped
             "original_size": torch.full((n, 2), side), "crop_top_left": torch.zeros(n, 2, dtype=torch.long)}
    latents, text = model.latents_and_text(batch)
    with FlopCounterMode(display=False) as counter:
        noise = torch.randn_like(latents)
        t = model.draw_timesteps(Draws(), n, latents.device)
        model.per_sample_loss(model.denoise(latents, text, noise, t)).mean().backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())
