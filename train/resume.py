"""Bit-identical mid-epoch resumption: restoring the RNG state where Composer would skip it.

Composer restores the checkpoint's RNG state at the start of an epoch, or while it spins a
dataloader forward to the resumed batch. A Streaming dataset resumes mid-epoch by itself (no
spinning), and in that case the saved RNG state is never applied: the resumed run draws other
noise, timesteps and caption dropouts than the uninterrupted one. ``RestoreRNG`` applies it just
after the first batch is fetched (creating the dataloader's iterator draws from the RNG too), so
the next step sees exactly the state the interrupted run had after its last checkpointed batch.
"""
from __future__ import annotations

from composer.core import Callback, Event, State
from composer.loggers import Logger
from composer.utils import reproducibility


class RestoreRNG(Callback):
    def __init__(self):
        self.pending = None

    def take_over(self, trainer) -> None:
        """Call after the Trainer is built: claim a mid-epoch RNG state Composer would drop."""
        rng = getattr(trainer, "_rng_state", None)
        state = trainer.state
        if rng is not None and int(state.timestamp.batch_in_epoch) > 0 and "train" in state.dataset_resumption:
            self.pending = rng
            trainer._rng_state = None

    def run_event(self, event: Event, state: State, logger: Logger) -> None:
        if event == Event.AFTER_DATALOADER and self.pending is not None:
            reproducibility.load_rng_state(self.pending)
            self.pending = None
