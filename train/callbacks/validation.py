"""Validation loss: the training objective on held-out data at fixed timesteps, fixed noise, no caption dropout.

The number is a function of the weights alone: sample ``i`` at timestep ``t`` always gets the noise drawn from
``seed, i, t`` (its own generator, never the training RNG), its latents are the VAE posterior's mean, and the
model runs in eval mode (no caption dropout, no other phrasing). So a checkpoint reached straight or through
a kill and a resume gives the same bits, and so does any number of ranks up to float summation order.

Sharding: rank r of N takes held-out samples r, r + N, r + 2N ...; each rank sums its per-sample losses per
timestep in float64, and one ``all_reduce`` (sum) of the sums and counts gives every rank the totals. Every
rank makes the same number of UNet calls: a rank with fewer samples (n not divisible by N, or more ranks than
samples) is padded to ceil(n / N) with copies of the first sample, weighted 0 in the sums. Under FSDP each UNet
call gathers weights from every rank, and a rank with one batch more waited in its last call for ranks that
had moved on.

Composer's own eval loop (``Evaluator``) is not used: it runs ``eval_forward`` with torchmetrics objects
over a dataloader, while this loss needs each sample at every fixed timestep with its own fixed noise, the
result split by timestep band, and a second pass with the EMA weights swapped in; a callback at
``BATCH_END`` does that in one place and logs through Composer's loggers all the same.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from composer.core import Callback, Event, State
from composer.loggers import Logger

log = logging.getLogger(__name__)

BANDS = (("low", 0, 333), ("mid", 333, 667), ("high", 667, 1000))  # timestep bands: little, some, much noise


def band_of(t: int) -> str:
    return next(name for name, lo, hi in BANDS if lo <= t < hi)


def unwrap(model):
    """The LatentDiffusion inside Composer's DDP wrapper (or the model itself: Composer's FSDP wraps its parts)."""
    return model.module if hasattr(model, "module") and not hasattr(model, "denoiser") else model


def sharded(model) -> bool:
    """Whether the training model's denoiser is sharded by FSDP (its every call a collective of all ranks)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(unwrap(model).denoiser, FullyShardedDataParallel)


def full_denoiser(unet):
    """The denoiser (a UNet or a transformer) to draw with on rank 0: itself, or under FSDP a plain copy holding
    its full weights, gathered by every rank (the other ranks get None)."""
    from composer.utils import dist
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

    if not isinstance(unet, FullyShardedDataParallel):
        return unet
    with FullyShardedDataParallel.state_dict_type(unet, StateDictType.FULL_STATE_DICT,
                                                  FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        weights = unet.state_dict()
    if dist.get_global_rank() != 0:
        return None
    inner = unet.module
    copy = type(inner).from_config(inner.config)
    copy.load_state_dict(weights)
    return copy.to(unet.compute_device)  # the gathered weights were offloaded to the CPU


def noise_for(seed: int, index: int, t: int, shape: tuple) -> torch.Tensor:
    """The fixed noise of held-out sample ``index`` at timestep ``t`` (its own generator: the training RNG is
    never touched)."""
    g = torch.Generator("cpu").manual_seed(seed * 1_000_003 + index * 1_009 + t)
    return torch.randn(shape, generator=g)


@dataclass
class HeldOut:
    """Held-out images and captions of this rank's shard, read once, padded to every rank's length."""
    indices: list[int]
    images: torch.Tensor  # (n, 3, R, R) in [-1, 1]
    captions: list[str]
    counted: torch.Tensor  # (n,) float64: 1 for this rank's samples, 0 for the padding


def read_held_out(path: str, resolution: int, max_samples: int, rank: int, world: int) -> HeldOut:
    from ..data import image_to_tensor, open_local

    data = open_local(path, where=f"config key 'validation.path' ({path})")
    n = min(len(data), max_samples)
    own = list(range(rank, n, world))
    padding = -(-n // world) - len(own)
    indices = own + [0] * padding
    images = [image_to_tensor(data[i]["image"], resolution) for i in indices]
    return HeldOut(indices, torch.stack(images), [data[i]["caption"] for i in indices],
                   torch.tensor([1.0] * len(own) + [0.0] * padding, dtype=torch.float64))


@torch.no_grad()
def loss_sums(model, held: HeldOut, timesteps: list[int], seed: int, batch_size: int) -> torch.Tensor:
    """(len(timesteps), 2) float64: the sum of per-sample losses and the sample count, per timestep."""
    device = next(model.denoiser.parameters()).device
    sums = torch.zeros(len(timesteps), 2, dtype=torch.float64)
    for start in range(0, len(held.indices), batch_size):
        idx = held.indices[start:start + batch_size]
        counted = held.counted[start:start + batch_size]
        images = held.images[start:start + batch_size].to(device)
        latents = model.scaled(model.vae.encode(images).latent_dist.mean)
        text = model.encode_captions(held.captions[start:start + batch_size], device)
        for k, t in enumerate(timesteps):
            noise = torch.stack([noise_for(seed, i, t, latents.shape[1:]) for i in idx]).to(device, latents.dtype)
            steps = torch.full((len(idx),), t, dtype=torch.long, device=device)
            per_sample = model.per_sample_loss(model.denoise(latents, text, noise, steps))
            sums[k, 0] += (per_sample.double().cpu() * counted).sum()
            sums[k, 1] += counted.sum()
    return sums


def summarise(sums: torch.Tensor, timesteps: list[int], prefix: str) -> dict[str, float]:
    """``{prefix}/loss`` and ``{prefix}/loss_{band}`` (mean over samples and the band's timesteps)."""
    out = {f"{prefix}/loss": float(sums[:, 0].sum() / sums[:, 1].sum())}
    for name, _, _ in BANDS:
        rows = [k for k, t in enumerate(timesteps) if band_of(t) == name]
        if rows:
            out[f"{prefix}/loss_{name}"] = float(sums[rows, 0].sum() / sums[rows, 1].sum())
    return out


def validation_figures(model, held: HeldOut, timesteps: list[int], seed: int, batch_size: int,
                       prefix: str) -> dict[str, float]:
    """The model's figures in eval mode (no caption dropout), every rank's shard summed (``gathered``)."""
    was_training = model.training
    model.eval()
    try:
        return summarise(gathered(loss_sums(model, held, timesteps, seed, batch_size)), timesteps, prefix)
    finally:
        model.train(was_training)


def gathered(sums: torch.Tensor) -> torch.Tensor:
    from composer.utils import dist

    if dist.get_world_size() > 1:
        dist.all_reduce(sums, reduce_operation="SUM")  # float64 on gloo; NCCL takes it on the GPU
    return sums


def ema_of(state: State):
    from composer.algorithms import EMA

    return next((a for a in state.algorithms if isinstance(a, EMA) and a.ema_model is not None), None)


class ValidationLoss(Callback):
    """Every ``interval`` batches: ``validation/loss`` for the raw weights and
    ``validation_ema/loss`` for the EMA weights when EMA is running, overall and per timestep band."""

    def __init__(self, path: str, resolution: int, interval: int, timesteps: list[int], max_samples: int,
                 seed: int, batch_size: int):
        self.path, self.resolution, self.interval = path, resolution, interval
        self.timesteps, self.max_samples, self.seed, self.batch_size = list(timesteps), max_samples, seed, batch_size
        from composer.utils import dist

        # read now, so that a missing or unreadable split fails before the first step
        self.held = read_held_out(path, resolution, max_samples, dist.get_global_rank(), dist.get_world_size())
        self.last: dict = {}  # the latest figures, saved in every checkpoint

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.BATCH_END and due(state, self.interval):
            self.last = {"batch": int(state.timestamp.batch), **self.measure(state)}
            logger.log_metrics({k: v for k, v in self.last.items() if k != "batch"})

    def measure(self, state: State) -> dict[str, float]:
        model = unwrap(state.model)
        figures = validation_figures(model, self.held, self.timesteps, self.seed, self.batch_size, "validation")
        ema = ema_of(state)
        if ema is not None:
            ema.ema_model.swap_params(model=state.model)
            try:
                figures.update(validation_figures(model, self.held, self.timesteps, self.seed, self.batch_size,
                                                  "validation_ema"))
            finally:
                ema.ema_model.swap_params(model=state.model)
        return figures

    def state_dict(self) -> dict:
        return {"last": dict(self.last)}

    def load_state_dict(self, state: dict) -> None:
        self.last = dict(state.get("last", {}))


def due(state: State, interval: int) -> bool:
    """At every ``interval``-th batch."""
    return int(state.timestamp.batch) % interval == 0
