"""The model spec carried into every checkpoint of a run (``models.checkpoints.make_spec`` makes it).

Composer saves each callback's ``state_dict`` under the callback's class name, so readers find the spec at
``state["callbacks"]["ModelSpec"]["spec"]`` (``models.checkpoints``); the name is part of the file format.
"""
from __future__ import annotations

from composer.core import Callback


class ModelSpec(Callback):
    """Carries the spec into every checkpoint (Composer saves each callback's ``state_dict``)."""

    def __init__(self, spec: dict):
        self.spec = spec

    def state_dict(self) -> dict:
        return {"spec": self.spec}

    def load_state_dict(self, state: dict) -> None:
        pass  # the spec of the run being trained wins; a mismatch is refused before loading
