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
# built from the checkpoint's own noise schedule (models.generation.samplers).
DEFAULT_SAMPLER = "DPM++ 2M"
DEFAULT_SIZE = None  # the checkpoint's native size (models.generation.native_size)
# Where a refiner takes over, as a fraction of the schedule: SDXL's published two-stage use (diffusers' "ensemble
# of expert denoisers", high_noise_frac) and A1111's and Forge's "Refiner switch at" default
DEFAULT_REFINER_SWITCH = 0.8

# What one image may ask for, in `dwb sample` and in the app (whose flags may change them; its server also limits
# the work per request and per client, app.generate.Limits).
MAX_STEPS = 150
MIN_SIZE, MAX_SIZE, SIZE_STEP = 16, 1024, 8  # sides are multiples of 8: the VAE's scale factor
MAX_GUIDANCE = 30.0
MAX_SEED = 2**32 - 1  # seeds are 32-bit, as in A1111 and ComfyUI; -1 asks for a random one
# The widest aspect an image may ask for, either way: SDXL's published bucket list reaches 1:4 (and 4:1), and a
# family's sides reach at most twice its native size (Family.size_range), so a wider bucket would not be drawable.
MAX_ASPECT = 4.0

# Which weights of a checkpoint: a Composer checkpoint may hold raw and EMA weights; other kinds hold one set.
WEIGHT_CHOICES = ("auto", "ema", "raw")
DEFAULT_WEIGHTS = "auto"  # EMA where the checkpoint holds EMA weights, else the raw (or only) ones


def weights_to_use(choice: str, has_ema: bool | None) -> str:
    """What a record says was used, "ema", "raw" or "stored" (the one set a diffusers folder, single file or
    hub model holds: ``has_ema`` None), for a choice among WEIGHT_CHOICES. Opening "ema" of a checkpoint
    without EMA weights is refused where the weights are read (``models.checkpoints``)."""
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
    if number is None or side_problem(number):
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


def side_problem(side) -> str | None:
    """What keeps ``side`` from being an image side one may ask for (None where nothing does): a whole number from
    MIN_SIZE to MAX_SIZE, a multiple of SIZE_STEP. The one rule for `--size`, a checkpoint's recommended size and the
    native size a checkpoint records, where a command draws at it."""
    if isinstance(side, bool) or not isinstance(side, int):
        return "is not a whole number"
    if not MIN_SIZE <= side <= MAX_SIZE:
        return f"is not between {MIN_SIZE} and {MAX_SIZE}"
    if side % SIZE_STEP:
        return f"is not a multiple of {SIZE_STEP}"
    return None


def parse_size(text: str) -> int | tuple[int, int]:
    """`--size`: one side ("512", a square) or "WIDTHxHEIGHT" ("768x512"), each side from MIN_SIZE to MAX_SIZE and a
    multiple of SIZE_STEP; a one-line error otherwise."""
    parts = str(text).lower().split("x")
    try:
        sides = [int(part) for part in parts]
    except ValueError:
        sides = []
    if len(sides) not in (1, 2):
        raise WorkbenchError(f"size {text!r} is neither a side (512) nor WIDTHxHEIGHT (768x512)")
    of = "" if len(sides) == 1 else f"{text}: "
    for side in sides:
        if problem := side_problem(side):
            raise WorkbenchError(f"{of}{side} {problem}")
    return sides[0] if len(sides) == 1 else (sides[0], sides[1])


def drawn_native_side(side, where: str) -> int | None:
    """The native side ``where`` records, as the side a command draws at when it is given none: held to what `--size`
    takes (``side_problem``), so that a checkpoint's own number draws nothing the flag would refuse (a spec's 16384
    took 3 GiB in 12 s, its 2048 drew for minutes on a CPU); None where it records none."""
    if side is None:
        return None
    if problem := side_problem(side):  # a number already (``Family.recorded_side``)
        raise WorkbenchError(f"{where} records a native size of {side!r} px, which {problem}: give --size")
    return side


def aspect_problem(value) -> str | None:
    """What is wrong with an aspect ratio "W:H" ("16:9", "2:1", "2.39:1"), None where nothing is: two positive
    numbers, from 1:MAX_ASPECT to MAX_ASPECT:1 (a config's rule; ``parse_aspect`` reads it)."""
    if not isinstance(value, str):  # YAML 1.1 reads an unquoted 16:9 as a base-60 integer
        return f'must be W:H in quotes, such as "16:9" (YAML reads an unquoted 16:9 as the number 969), got {value!r}'
    width, colon, height = value.strip().partition(":")
    try:
        ratio = float(width) / float(height) if colon and float(width) > 0 and float(height) > 0 else None
    except (ValueError, ZeroDivisionError):
        ratio = None
    if ratio is None or not 0 < ratio < float("inf"):
        return f"must be W:H with two positive numbers, such as 16:9 or 2:1, got {value!r}"
    if not 1 / MAX_ASPECT <= ratio <= MAX_ASPECT:
        return f"must be from 1:{MAX_ASPECT:g} to {MAX_ASPECT:g}:1, got {value}"
    return None


def parse_aspect(text) -> tuple[float, float]:
    """An aspect ratio "W:H" as (W, H); a one-line error otherwise (``aspect_problem``)."""
    problem = aspect_problem(text)
    if problem:
        raise WorkbenchError(f"aspect {problem}")
    width, _, height = text.strip().partition(":")
    return float(width), float(height)


def drawable_sides(family, least: int = MIN_SIZE, most: int = MAX_SIZE) -> tuple[int, int, int]:
    """(smallest, largest, step) of a side a model of ``family`` may be asked for: the sides from ``least`` to
    ``most`` (`--size`'s limits, or the app's) on the family's step (``Family.size_step``). The one size rule of
    `dwb sample`, the app's sliders and requests, and evaluate (``check_drawable``)."""
    step = family.size_step()
    return -(-least // step) * step, most // step * step, step


def check_drawable(family, size: tuple[int, int], where: str, limits: tuple[int, int] | None = (MIN_SIZE, MAX_SIZE)
                   ) -> None:
    """A one-line error unless every model of ``family`` draws ``size`` (width, height): both sides multiples of its
    step (``Family.size_step``: what cannot be drawn) and, where ``limits`` (least, most) are given, within them (what
    the command lets one image cost). The family's published size range is no part of it: a model that only shares
    the family's layout may be trained at any size (mosaicml/diffusion's SD 2 checkpoints at 32 px, the tiny
    transformers at 16 and 32), and is drawn at the size it was trained at."""
    width, height = size
    step = family.size_step()
    if width % step or height % step:
        raise WorkbenchError(f"{family.label} draws sides that are multiples of {step}; {where} is {width}x{height}")
    if limits is not None:
        lo, hi, _ = drawable_sides(family, *limits)
        if not (lo <= width <= hi and lo <= height <= hi):
            raise WorkbenchError(f"{where} is {width}x{height}: each side is drawn from {lo} to {hi} px")
