"""Training FLOPs of a config's denoiser, counted: one batch at the config's batch size and resolution through
the model's forward, loss and backward under PyTorch's ``FlopCounterMode`` (matrix products, convolutions and
attention, forward and backward), the frozen VAE and text encoder left out: they cost the same whatever the
denoiser, and a run on precomputed latents does not pay them. So two recipes compare at equal training compute by
counting, not by a rule of thumb such as 6 x parameters x tokens (which a UNet's convolutions do not follow)."""
from __future__ import annotations

import torch

from .config import TrainConfig


def attention_flops(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """One fused attention's forward: the two matrix products of attention written out (q k^T, then the softmax's
    weights times v), as PyTorch counts its CUDA kernels."""
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query, key, value)


def attention_backward_flops(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    """One fused attention's backward: the four products autograd runs for attention written out (the gradients of
    the weights and of v, then of q and of k). PyTorch's formula for its CUDA kernels adds a fifth, the flash
    kernels' recomputing of q k^T; left out here, so a model counts the same whichever kernel runs it (on a CPU
    PyTorch 2.7 picks the fused kernel or the matmul path by shape)."""
    b, h, s_q, d_q = query
    s_k, d_v = key[2], value[3]
    return 2 * b * h * s_q * s_k * (d_v + d_v + d_q + d_q)


def attention_formulas() -> dict:
    """FLOP formulas for each fused attention op PyTorch dispatches to: the CPU's (for which ``FlopCounterMode``
    has none and counts 0), CUDA's, and the one other accelerators' backends implement."""
    aten = torch.ops.aten
    forward = (aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention,
               aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_cudnn_attention,
               aten._scaled_dot_product_fused_attention_overrideable)
    backward = (aten._scaled_dot_product_flash_attention_for_cpu_backward,
                aten._scaled_dot_product_flash_attention_backward,
                aten._scaled_dot_product_efficient_attention_backward,
                aten._scaled_dot_product_cudnn_attention_backward,
                aten._scaled_dot_product_fused_attention_overrideable_backward)
    return {**dict.fromkeys(forward, attention_flops), **dict.fromkeys(backward, attention_backward_flops)}


def flop_counter():
    """A ``FlopCounterMode`` that counts attention on every device, as written out."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping=attention_formulas())


def count_batch(cfg: TrainConfig):
    """The counter after one training batch of ``cfg``'s denoiser (its totals per op in ``get_flop_counts()``)."""
    from .recipes import Draws
    from .recipes import build_model

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
    with flop_counter() as counter:
        noise = torch.randn_like(latents)
        t = model.draw_timesteps(Draws(), n, latents.device)
        model.per_sample_loss(model.denoise(latents, text, noise, t)).mean().backward()
    model.zero_grad(set_to_none=True)
    return counter


def batch_flops(cfg: TrainConfig) -> float:
    """The FLOPs of one training batch of ``cfg``'s denoiser."""
    return float(count_batch(cfg).get_total_flops())
