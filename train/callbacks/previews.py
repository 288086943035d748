"""Previews: a grid of fixed prompts x fixed seeds every ``preview_interval`` batches, through the one generation
path (``train.generation``), written beside the checkpoints with its parameters and sent to the loggers.

The pipeline is built around the training model's own modules with the same inference scheduler and sampler
a checkpoint opens with, so a preview cell is what `dwb sample` of the checkpoint at that batch draws for the
same prompt, seed, sampler, steps and size. Rank 0 draws; the others wait at the next step's gradient
exchange. The training RNG is saved and restored around it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from composer.core import Callback, Event, State
from composer.loggers import Logger

from .validation import due, ema_of, unwrap


def preview_pipeline(model):
    from ..checkpoints import build_pipeline

    return build_pipeline(model.unet, model.vae, model.text_encoder, model.tokenizer, model.prediction_type)


class Previews(Callback):
    def __init__(self, folder: str | Path, interval: int, prompts: list[str], seeds: list[int], *, steps: int,
                 guidance: float, size: int, sampler: str | None, ema: bool):
        self.folder, self.interval = Path(folder), interval
        self.prompts, self.seeds = list(prompts), list(seeds)
        self.settings = dict(steps=steps, guidance=guidance, size=size, sampler=sampler)
        self.ema = ema

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        from composer.utils import dist

        if event != Event.BATCH_END or not due(state, self.interval) or dist.get_global_rank() != 0:
            return
        batch = int(state.timestamp.batch)
        grid = self.draw(state, f"ba{batch}")
        logger.log_images(np.asarray(grid), name="previews", channels_last=True, step=batch)

    def draw(self, state: State, name: str):
        from PIL import Image

        from ..generation import write_grid

        model = unwrap(state.model)
        ema = ema_of(state) if self.ema else None
        was_training = model.training
        model.eval()
        if ema is not None:
            ema.ema_model.swap_params(model=state.model)
        out = self.folder / f"{name}.png"
        try:
            with torch.random.fork_rng(devices=[]):
                write_grid(preview_pipeline(model), out, self.prompts, self.seeds,
                           title=f"{name}{' EMA' if ema is not None else ''}", settings=self.generation_settings(),
                           weights="raw" if ema is None else "ema")
        finally:
            if ema is not None:
                ema.ema_model.swap_params(model=state.model)
            model.train(was_training)
        self.write_parameters(name, ema is not None)
        with Image.open(out) as grid:
            return grid.convert("RGB")

    def generation_settings(self):
        """The previews' settings as the one generation path takes them (its PNG parameters record them too)."""
        from ..generation import Settings

        size = self.settings["size"]
        return Settings(steps=self.settings["steps"], guidance=self.settings["guidance"], width=size, height=size,
                        sampler=self.settings["sampler"])

    def write_parameters(self, name: str, ema: bool) -> None:
        from ..common import write_text_whole

        params = {"prompts": self.prompts, "seeds": self.seeds, **self.settings, "ema": ema, "batch": name}
        write_text_whole(self.folder / f"{name}.json", json.dumps(params, indent=2))
