"""Validation loss: the training objective's MSE, unweighted (what MLPerf reports), on held-out data at fixed
timesteps, fixed noise, no caption dropout, under the run's autocast. Each sample is noised at every timestep, or
(``one_timestep``, MLPerf's text_to_image reference) held-out sample i at timestep i mod the number of timesteps only.

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


def full_denoiser(unet, dtype: torch.dtype = torch.float32):
    """The denoiser (a UNet or a transformer) to draw with on rank 0 and the fingerprint of its weights as a
    checkpoint holds them (``models.checkpoints.fingerprint``): itself, or under FSDP a plain copy of its full
    weights in ``dtype`` (``drawing_copy``), gathered by every rank (the other ranks get None, None)."""
    from composer.utils import dist
    from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel, StateDictType

    from models.checkpoints import fingerprint

    if not isinstance(unet, FullyShardedDataParallel):
        return unet, fingerprint(unet)
    with FullyShardedDataParallel.state_dict_type(unet, StateDictType.FULL_STATE_DICT,
                                                  FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        weights = unet.state_dict()
    if dist.get_global_rank() != 0:
        return None, None
    return drawing_copy(unet.module, weights, unet.compute_device, dtype)  # the weights were offloaded to the CPU


def drawing_copy(inner, weights: dict, device: torch.device, dtype: torch.dtype):
    """A plain copy of ``inner`` (its class and config) holding ``weights`` on ``device`` in ``dtype``, and the
    fingerprint of ``weights``. It is made on the meta device and takes the tensors themselves (``assign``):
    made the usual way, every weight was first drawn at random on rank 0's CPU and thrown away while the other
    ranks waited. Below float32 its forward runs under autocast, as training's does, so that the pipeline's
    float32 parts can hand it their float32 tensors."""
    import itertools

    from models.checkpoints import fingerprint
    from models.errors import WorkbenchError

    with torch.device("meta"):
        copy = type(inner).from_config(inner.config)
    copy.load_state_dict(weights, assign=True)
    for name, tensor in itertools.chain(copy.named_parameters(), copy.named_buffers()):
        if tensor.is_meta:
            raise WorkbenchError(f"the full {type(inner).__name__} gathered for drawing holds no {name}")
    weights_hash = fingerprint(copy)  # of the float32 weights, as the checkpoint of this batch holds them
    # torch's own cast: diffusers' ``to`` warns at every cast with a dtype, though none of the UNet, SD3's or
    # Flux.1's transformer keeps modules in float32 (their ``_keep_in_fp32_modules`` are None)
    torch.nn.Module.to(copy, device=device, dtype=dtype)
    if dtype != torch.float32:
        copy.forward = torch.autocast(device.type, dtype=dtype)(copy.forward)
    return copy, weights_hash


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
    from ..data import image_to_tensor
    from models.datasets import open_local

    data = open_local(path, where=f"config key 'validation.path' ({path})")
    n = min(len(data), max_samples)
    own = list(range(rank, n, world))
    padding = -(-n // world) - len(own)
    indices = own + [0] * padding
    images = [image_to_tensor(data[i]["image"], resolution) for i in indices]
    return HeldOut(indices, torch.stack(images), [data[i]["caption"] for i in indices],
                   torch.tensor([1.0] * len(own) + [0.0] * padding, dtype=torch.float64))


def timestep_rows(indices: list[int], count: int, one_timestep: bool) -> list[list[int]]:
    """For each denoiser call over held-out samples ``indices``, each sample's row in the ``count`` timesteps: every
    row in turn (``count`` calls), or one call with sample i at row i mod count (``one_timestep``: MLPerf's reference
    noises each held-out sample at one of its 8 timesteps in turn; the index is the split's, whatever the rank)."""
    if one_timestep:
        return [[i % count for i in indices]]
    return [[k] * len(indices) for k in range(count)]


@torch.no_grad()
def loss_sums(model, held: HeldOut, timesteps: list[int], seed: int, batch_size: int,
              one_timestep: bool = False) -> torch.Tensor:
    """(len(timesteps), 2) float64: the sum of per-sample losses and the sample count, per timestep. A loss is the
    plain MSE to the target (``weighted=False``), MLPerf's figure: a training weighting such as sigma_sqrt's 1 / t^2
    would make t = 0 infinite."""
    device = next(model.denoiser.parameters()).device
    sums = torch.zeros(len(timesteps), 2, dtype=torch.float64)
    for start in range(0, len(held.indices), batch_size):
        idx = held.indices[start:start + batch_size]
        counted = held.counted[start:start + batch_size]
        images = held.images[start:start + batch_size].to(device)
        latents = model.scaled(model.vae.encode(images).latent_dist.mean)
        text = model.encode_captions(held.captions[start:start + batch_size], device)
        for rows in timestep_rows(idx, len(timesteps), one_timestep):
            noise = torch.stack([noise_for(seed, i, timesteps[k], latents.shape[1:]) for i, k in zip(idx, rows)])
            steps = torch.tensor([timesteps[k] for k in rows], dtype=torch.long).to(device)
            per_sample = model.per_sample_loss(model.denoise(latents, text, noise.to(device, latents.dtype), steps),
                                               weighted=False)
            losses = per_sample.double().cpu() * counted
            for k in sorted(set(rows)):
                chosen = torch.tensor([row == k for row in rows])
                sums[k, 0] += losses[chosen].sum()
                sums[k, 1] += counted[chosen].sum()
    return sums


def summarise(sums: torch.Tensor, timesteps: list[int], prefix: str) -> dict[str, float]:
    """``{prefix}/loss`` and ``{prefix}/loss_{band}`` (mean over samples and the band's timesteps; a band whose
    timesteps no sample was noised to, with fewer held-out samples than timesteps in one_timestep, is left out)."""
    out = {f"{prefix}/loss": float(sums[:, 0].sum() / sums[:, 1].sum())}
    for name, _, _ in BANDS:
        rows = [k for k, t in enumerate(timesteps) if band_of(t) == name]
        if rows and sums[rows, 1].sum() > 0:
            out[f"{prefix}/loss_{name}"] = float(sums[rows, 0].sum() / sums[rows, 1].sum())
    return out


def validation_figures(model, held: HeldOut, timesteps: list[int], seed: int, batch_size: int,
                       prefix: str, one_timestep: bool = False) -> dict[str, float]:
    """The model's figures in eval mode (no caption dropout), every rank's shard summed (``gathered``)."""
    was_training = model.training
    model.eval()
    try:
        sums = loss_sums(model, held, timesteps, seed, batch_size, one_timestep)
        return summarise(gathered(sums), timesteps, prefix)
    finally:
        model.train(was_training)


def gathered(sums: torch.Tensor) -> torch.Tensor:
    """Every rank's float64 sums, summed: on the device the group serves (``models.common.all_reduce``)."""
    from models.common import all_reduce

    return all_reduce(sums)


def ema_of(state: State):
    from composer.algorithms import EMA

    return next((a for a in state.algorithms if isinstance(a, EMA) and a.ema_model is not None), None)


class ValidationLoss(Callback):
    """Every ``interval`` batches: ``validation/loss`` for the raw weights and
    ``validation_ema/loss`` for the EMA weights when EMA is running, overall and per timestep band."""

    def __init__(self, path: str, resolution: int, interval: int, timesteps: list[int], max_samples: int,
                 seed: int, batch_size: int, one_timestep: bool = False):
        self.path, self.resolution, self.interval = path, resolution, interval
        self.timesteps, self.max_samples, self.seed, self.batch_size = list(timesteps), max_samples, seed, batch_size
        self.one_timestep = one_timestep  # each sample at one timestep (``timestep_rows``), else at every one
        from composer.utils import dist

        # read now, so that a missing or unreadable split fails before the first step
        self.held = read_held_out(path, resolution, max_samples, dist.get_global_rank(), dist.get_world_size())
        self.last: dict = {}  # the latest figures, saved in every checkpoint

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.BATCH_END and due(state, self.interval):
            self.last = {"batch": int(state.timestamp.batch), **self.measure(state)}
            logger.log_metrics({k: v for k, v in self.last.items() if k != "batch"})

    def measure(self, state: State) -> dict[str, float]:
        """The raw weights' figures, then the EMA weights', under the run's autocast (``in_run_precision``)."""
        model = unwrap(state.model)
        options = (self.held, self.timesteps, self.seed, self.batch_size)
        with in_run_precision(state):
            figures = validation_figures(model, *options, "validation", self.one_timestep)
        ema = ema_of(state)
        if ema is not None:
            ema.ema_model.swap_params(model=state.model)
            try:
                with in_run_precision(state):
                    figures.update(validation_figures(model, *options, "validation_ema", self.one_timestep))
            finally:
                ema.ema_model.swap_params(model=state.model)
        return figures

    def state_dict(self) -> dict:
        return {"last": dict(self.last)}

    def load_state_dict(self, state: dict) -> None:
        self.last = dict(state.get("last", {}))


def in_run_precision(state: State):
    """The autocast training's forward runs under (Composer's precision context for the run's precision): bf16
    under amp_bf16 on a GPU, nothing in fp32. Outside it, validation and previews ran the denoiser in float32."""
    from composer.core.precision import get_precision_context

    return get_precision_context(state.precision, state.precision_config)


def due(state: State, interval: int) -> bool:
    """At every ``interval``-th batch."""
    return int(state.timestamp.batch) % interval == 0
