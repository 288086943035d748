"""How an image is made when nobody says otherwise: one set of defaults for every command that generates.

`dwb sample`, the app, `dwb evaluate` (and the sample sets `dwb human-eval` reads) start from these, so a
checkpoint, prompt and seed give the same image in each. A command that must differ says so in its
``--help`` and records the value it used (the demo's tiny model at guidance 3, evaluate's guidance sweep).

Light to import (no torch): command lines show these values in their help.
"""
from __future__ import annotations

from ..errors import WorkbenchError

DEFAULT_GUIDANCE = 7.5  # classifier-free guidance: SD2's and diffusers' usual scale
DEFAULT_STEPS = 25
# At 20 steps it drew the tiny model's one-object prompts fully right more often than DDIM did on the same
# checkpoints and seeds (BENCHMARKS.md, "One-object prompts above 0.5"); the same for every checkpoint kind,
# built from the checkpoint's own noise schedule (train.generation.samplers).
DEFAULT_SAMPLER = "DPM++ 2M"
DEFAULT_SIZE = None  # the checkpoint's native size (train.generation.native_size)

# What one image may ask for, in `dwb sample` and in the app (whose flags may change them; its server also limits
# the work per request and per client, app.generate.Limits).
MAX_STEPS = 150
MIN_SIZE, MAX_SIZE, SIZE_STEP = 16, 1024, 8  # sides are multiples of 8: the VAE's scale factor
MAX_GUIDANCE = 30.0
MAX_SEED = 2**32 - 1  # seeds are 32-bit, as in A1111 and ComfyUI; -1 asks for a random one

# Which weights of a checkpoint: a Composer checkpoint may hold raw and EMA weights; other kinds hold one set.
WEIGHT_CHOICES = ("auto", "ema", "raw")
DEFAULT_WEIGHTS = "auto"  # EMA where the checkpoint holds EMA weights, else the raw (or only) ones


def weights_to_use(choice: str, has_ema: bool | None) -> str:
    """What a record says was used, "ema", "raw" or "stored" (the one set a diffusers folder, single file or
    hub model holds: ``has_ema`` None), for a choice among WEIGHT_CHOICES. Opening "ema" of a checkpoint
    without EMA weights is refused where the weights are read (``train.checkpoints``)."""
    if choice not in WEIGHT_CHOICES:
        raise WorkbenchError(f"weights must be one of {', '.join(WEIGHT_CHOICES)}, got {choice!r}")
    if has_ema is None:
        return "stored"
    if choice == "auto":
        return "ema" if has_ema else "raw"
    return choice
