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
# Where a refiner takes over, as a fraction of the schedule: SDXL's published two-stage use (diffusers' "ensemble
# of expert denoisers", high_noise_frac) and A1111's and Forge's "Refiner switch at" default
DEFAULT_REFINER_SWITCH = 0.8

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


# The settings a checkpoint recommends it is sampled at (its spec's "recommended"; `dwb train` records its previews'
# guidance, steps and sampler, `dwb export --settings` sets them): where a command is given no value, it starts from
# these before the defaults above, and says so.
RECOMMENDED_KEYS = ("guidance", "steps", "sampler", "size")
RECOMMENDED_FILE = "recommended_settings.json"  # in a diffusers folder's root, where diffusers reads nothing


def _recommended_value(key: str, value, where: str):
    """``value`` for ``key`` as a command takes it, or a one-line WorkbenchError naming ``where``."""
    from .samplers import SAMPLERS

    def refuse(what: str):
        return WorkbenchError(f"{where}: {key} must be {what}, got {value!r}")

    if key == "sampler":
        if not isinstance(value, str) or value not in SAMPLERS:
            raise WorkbenchError(f"{where}: unknown sampler {value!r}; choose one of: {', '.join(SAMPLERS)}")
        return value
    number = _number_in(value, float if key == "guidance" else int)
    if key == "guidance":
        if number is None or not 0 <= number <= MAX_GUIDANCE:
            raise refuse(f"a number from 0 to {MAX_GUIDANCE:g}")
        return float(number)
    if key == "steps":
        if number is None or not 1 <= number <= MAX_STEPS:
            raise refuse(f"a whole number from 1 to {MAX_STEPS}")
        return number
    if number is None or not MIN_SIZE <= number <= MAX_SIZE or number % SIZE_STEP:
        raise refuse(f"a multiple of {SIZE_STEP} from {MIN_SIZE} to {MAX_SIZE}")
    return number


def _number_in(value, kind):
    """``value`` (a number, or text such as "3" from a command line) as ``kind``; None where it is not one."""
    if isinstance(value, bool):
        return None
    try:
        number = kind(value) if isinstance(value, str) else value
    except ValueError:
        return None
    if kind is int and isinstance(number, float) and number.is_integer():
        number = int(number)
    ok = isinstance(number, int) if kind is int else isinstance(number, (int, float)) and number == number
    return number if ok else None


def check_recommended(settings, where: str) -> dict:
    """Recommended settings read from a checkpoint or given by a user, checked: a dict of RECOMMENDED_KEYS with
    values a command takes, or a one-line WorkbenchError naming ``where``, the key and the value."""
    if not isinstance(settings, dict):
        raise WorkbenchError(f"{where}: recommended settings are an object of {', '.join(RECOMMENDED_KEYS)}, "
                             f"got {type(settings).__name__}")
    unknown = [k for k in settings if k not in RECOMMENDED_KEYS]
    if unknown:
        raise WorkbenchError(f"{where}: unknown setting {unknown[0]!r}; the settings are {', '.join(RECOMMENDED_KEYS)}")
    return {k: _recommended_value(k, settings[k], where) for k in RECOMMENDED_KEYS if settings.get(k) is not None}


def parse_recommended(text: str) -> dict:
    """`dwb export --settings guidance=3,steps=20,sampler=DPM++ 2M,size=512`, checked (``check_recommended``)."""
    pairs = {}
    for item in (part.strip() for part in text.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise WorkbenchError(f"--settings: expected key=value such as guidance=3, got {item!r}")
        pairs[key.strip()] = value.strip()
    return check_recommended(pairs, "--settings")


def starting_settings(given: dict, recommended: dict) -> tuple[dict, str]:
    """(guidance, steps, sampler and size to use, the line that says which came from the checkpoint): a value the
    user gave (not None) wins, then the checkpoint's recommended one, then the workbench's default. The line is
    empty where no recommended value was used."""
    defaults = {"guidance": DEFAULT_GUIDANCE, "steps": DEFAULT_STEPS, "sampler": DEFAULT_SAMPLER, "size": DEFAULT_SIZE}
    used = {k: recommended[k] for k in RECOMMENDED_KEYS if given.get(k) is None and recommended.get(k) is not None}
    chosen = {k: given[k] if given.get(k) is not None else used.get(k, defaults[k]) for k in RECOMMENDED_KEYS}
    return chosen, recommended_line(used)


def recommended_line(used: dict) -> str:
    """"guidance 3, 20 steps: the checkpoint's recommended settings" for the recommended values used ("" for none)."""
    words = {"guidance": lambda v: f"guidance {v:g}", "steps": lambda v: f"{v} steps", "sampler": str,
             "size": lambda v: f"{v} px"}
    shown = [words[k](used[k]) for k in RECOMMENDED_KEYS if k in used]
    if not shown:
        return ""
    return f"{', '.join(shown)}: the checkpoint's recommended setting{'s' if len(shown) > 1 else ''}"
