"""Previews: a grid of fixed prompts x fixed seeds every ``preview_interval`` batches, through the one generation
path (``models.generation``), written beside the checkpoints with its parameters and sent to the loggers.

The pipeline is built around the training model's own modules with the same inference scheduler and sampler
a checkpoint opens with, so a preview cell is what `dwb sample` of the checkpoint at that batch draws for the
same prompt, seed, sampler, steps and size. Rank 0 draws. The training RNG is saved and restored around it. It
draws under the run's autocast, as training runs its forward: under amp_bf16 on a GPU a cell is `dwb sample`'s
(float32) to bf16 precision; in fp32 (on a CPU) bit for bit.

A preview's Model hash is the fingerprint of the UNet weights it drew with (``models.checkpoints.fingerprint``:
names, shapes and bytes, raw or EMA as drawn), not a file's hash: the checkpoint of that batch is written after
the preview, and only where ``save_interval`` falls on it. The same weights opened from that checkpoint
(``load_pipeline``) give the same fingerprint, which is how a preview is matched to its checkpoint.

Under FSDP no rank works alone inside a collective: every rank swaps the EMA weights in (its own shards of them,
``train.ema``), takes part in gathering the UNet's full state dict into a plain copy on rank 0, and swaps back; rank 0
draws with the copy in between, and the other ranks wait at the swap back. Drawing through the sharded UNet on
rank 0 alone had rank 0 all-gathering weights while the others gathered the checkpoint's optimizer state: gloo
aborted, NCCL would have waited for ever. Without FSDP the other ranks go straight on, as before, and wait at the
next step's gradient exchange.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from composer.core import Callback, Event, State
from composer.loggers import Logger

from .validation import due, ema_of, full_denoiser, sharded, unwrap


class Previews(Callback):
    def __init__(self, folder: str | Path, interval: int, prompts: list[str], seeds: list[int], *, steps: int,
                 guidance: float, size: int, sampler: str | None, ema: bool):
        self.folder, self.interval = Path(folder), interval
        self.prompts, self.seeds = list(prompts), list(seeds)
        self.settings = dict(steps=steps, guidance=guidance, size=size, sampler=sampler)
        self.ema = ema
        self.copy_held = (-1, 0)  # (batch, bytes) of the full copy of the denoiser the last grid was drawn with

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        from composer.utils import dist

        from .validation import in_run_precision

        if event != Event.BATCH_END or not due(state, self.interval):
            return
        if dist.get_global_rank() != 0 and not sharded(state.model):
            return
        batch = int(state.timestamp.batch)
        with in_run_precision(state):  # the denoiser draws under training's autocast (bf16 under amp_bf16)
            grid = self.draw(state, f"ba{batch}")
        if grid is not None:
            logger.log_images(np.asarray(grid), name="previews", channels_last=True, step=batch)

    def draw(self, state: State, name: str):
        """The grid as an image on rank 0 (None on the other ranks, which only help gather the weights)."""
        from composer.utils import dist

        from models.checkpoints import module_size

        model = unwrap(state.model)
        ema = ema_of(state) if self.ema else None
        if ema is not None:
            ema.ema_model.swap_params(model=state.model)
        try:
            unet, weights_hash = full_denoiser(model.denoiser, drawing_dtype(state))
            copied = unet is not None and unet is not model.denoiser  # the copy drawn with under FSDP, on rank 0
            self.copy_held = (int(state.timestamp.batch), module_size(unet)[1] if copied else 0)
            if dist.get_global_rank() == 0:
                self.write_grid(model, unet, name, ema is not None, weights_hash)
        finally:
            if ema is not None:
                ema.ema_model.swap_params(model=state.model)
        if dist.get_global_rank() != 0:
            return None
        self.write_parameters(name, ema is not None)
        from PIL import Image

        with Image.open(self.folder / f"{name}.png") as grid:
            return grid.convert("RGB")

    def write_grid(self, model, unet, name: str, ema: bool, weights_hash: str) -> None:
        from models.generation import write_grid

        was_training = unet.training
        unet.eval()
        try:
            with torch.random.fork_rng(devices=[]):
                pipe = model.pipeline_with(unet)
                write_grid(pipe, self.folder / f"{name}.png", self.prompts, self.seeds,
                           title=f"{name}{' EMA' if ema else ''}", settings=self.generation_settings(),
                           checkpoint_hash=weights_hash, weights="ema" if ema else "raw")
        finally:
            unet.train(was_training)

    def generation_settings(self):
        """The previews' settings as the one generation path takes them (its PNG parameters record them too)."""
        from models.generation import Settings

        size = self.settings["size"]
        return Settings(steps=self.settings["steps"], guidance=self.settings["guidance"], width=size, height=size,
                        sampler=self.settings["sampler"])

    def write_parameters(self, name: str, ema: bool) -> None:
        from models.common import write_text_whole

        params = {"prompts": self.prompts, "seeds": self.seeds, **self.settings, "ema": ema, "batch": name}
        write_text_whole(self.folder / f"{name}.json", json.dumps(params, indent=2))


def drawing_dtype(state: State) -> torch.dtype:
    """The dtype training computes in, which an FSDP run's full copy for drawing is made in: bfloat16 under
    amp_bf16 (half the GPU memory of float32 on rank 0), float16 under amp_fp16, float32 otherwise (CPU ranks)."""
    from composer.core import Precision

    return {Precision.AMP_BF16: torch.bfloat16, Precision.AMP_FP16: torch.float16}.get(state.precision, torch.float32)
