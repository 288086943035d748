"""Aspect-ratio buckets (NovelAI's aspect-ratio bucketing, as kohya's sd-scripts and SimpleTuner do it): for a
pixel budget of side S, a set of (width, height) of about S*S pixels each, both sides multiples of a step, from
about 1:``max_aspect`` to ``max_aspect``:1, the square included.

Every bucket holds at most S*S pixels (SDXL's own buckets do too), so a batch of any bucket costs no more
memory than a batch of squares: for each width ``w`` (a multiple of the step) the height is the largest
multiple of the step with ``w * h <= S*S``. A bucket so holds more than ``S*S - step * max(w, h)`` pixels.

An image goes to the bucket whose aspect ratio is nearest its own in log space (2:1 is as far from 1:1 as
1:2), is scaled by the least factor that makes it cover the bucket, and the excess is cut off centred: the
least crop that bucket allows. An image that would have to be scaled up to cover its bucket does not go into
that budget (as a square image smaller than a bucket's side does not).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

from ..errors import WorkbenchError
from . import MAX_ASPECT

DEFAULT_MAX_ASPECT = 2.0  # 1:2 to 2:1, NovelAI's and SDXL's range (SDXL's goes to 1:4 on its finest buckets)
LATENT_STEP = 8  # the VAE downsamples by 8: a side that is not a multiple of 8 has no whole latent
# SDXL-class trainers use 64 from 512 up (NovelAI's, SDXL's own list at 1024); below 512 a step of 64 leaves a
# budget of 256 three buckets (256x256, 320x192, 192x320), a step of 32 five (down to 1.67:1). At 512 a step of
# 64 reaches 640x384 (1.67:1; 704x320 is 2.2:1), a step of 32 reaches 704x352 (2:1) in 13 buckets.
LARGE_BUDGET_STEP, SMALL_BUDGET_STEP, LARGE_BUDGET = 64, 32, 512
# The bounds of a conversion's sets (`--max-aspect 1000000 --buckets 1000000 --bucket-step 8` asked for 1.25e8
# buckets: 21.5 GB before the kernel's OOM killer ended it). The widest bucket is 4:1 either way: SDXL's
# published list reaches 1:4, and `dwb sample --aspect` and evaluate draw at most that (MAX_ASPECT).
MAX_BUCKET_ASPECT = MAX_ASPECT
# Buckets over all budgets: SDXL's list holds about 40 at 1024 (1:4 to 4:1 on a step of 64; this set 33), and
# each bucket is a dataset training draws whole batches from, so a budget cut into hundreds leaves each a few
# images. 256 admits a step of 16 at 256, 512 and 1024 together up to 4:1 (227), or a step of 8 at 1024 to 2:1.
MAX_BUCKETS = 256
# The largest budget: training takes its buckets at data.resolution, which is at most 4096 (train.config's
# MAX_RESOLUTION); a budget of 10^23 px a side was enumerated width by width until memory ran out.
MAX_BUDGET_SIDE = 4096


def default_step(side: int) -> int:
    return LARGE_BUDGET_STEP if side >= LARGE_BUDGET else SMALL_BUDGET_STEP


def check_bucket_options(sides: Sequence[int], step: int | None, max_aspect: float) -> None:
    """Refuse, in one line, a step the VAE cannot use, a budget that is not a multiple of its step (no square
    bucket), and an aspect bound below 1 or past ``MAX_BUCKET_ASPECT``."""
    if step is not None and (step <= 0 or step % LATENT_STEP):
        raise WorkbenchError(f"bucket step must be a positive multiple of {LATENT_STEP} (the VAE's factor), "
                             f"got {step}")
    if not (math.isfinite(max_aspect) and 1 <= max_aspect <= MAX_BUCKET_ASPECT):
        raise WorkbenchError(f"--max-aspect must be at least 1 (1 keeps only the square) and at most "
                             f"{MAX_BUCKET_ASPECT:g} (4:1, SDXL's widest buckets), got {_shown(max_aspect)}")
    for side in sides:
        if side % (step or default_step(side)):
            raise WorkbenchError(f"bucket {side} is not a multiple of the bucket step {step or default_step(side)} "
                                 f"(--bucket-step); its square would not be a bucket")


def check_bucket_count(sides: Sequence[int], step: int | None, max_aspect: float) -> None:
    """Refuse, in one line and before any set is made, a budget past ``MAX_BUDGET_SIDE`` and sets of more than
    ``MAX_BUCKETS`` buckets over all ``sides`` (counted up to the bound, not made)."""
    check_bucket_options(sides, step, max_aspect)
    if any(side > MAX_BUDGET_SIDE for side in sides):
        raise WorkbenchError(f"--buckets {_sides_text(sides)}: an aspect-ratio budget is at most {MAX_BUDGET_SIDE} "
                             f"px a side (training takes buckets at data.resolution, at most {MAX_BUDGET_SIDE})")
    total = 0
    for side in sides:
        total += bucket_count(side, step or default_step(side), max_aspect, MAX_BUCKETS - total)
        if total > MAX_BUCKETS:
            raise WorkbenchError(
                f"--buckets {_sides_text(sides)} with --bucket-step {step or 'the default'} and --max-aspect "
                f"{_shown(max_aspect)} make more than {MAX_BUCKETS} aspect-ratio buckets; at most {MAX_BUCKETS} are "
                f"made (a larger --bucket-step, a smaller --max-aspect or fewer --buckets make fewer)")


def bucket_count(side: int, step: int, max_aspect: float, stop_above: int) -> int:
    """How many buckets ``bucket_set`` makes of the budget, counted width by width as it makes them (each wide
    bucket has its tall transpose, the square none); stops once past ``stop_above``."""
    area, wide = side * side, 0
    for width in range(side + step, math.isqrt(int(area * max_aspect)) + step, step):
        height = area // width // step * step
        if height and width / height <= max_aspect:
            wide += 1
            if 1 + 2 * wide > stop_above:
                break
    return 1 + 2 * wide


def _shown(x: float) -> str:
    """1000000.0 as "1000000", 2.5 as itself."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _sides_text(sides: Sequence[int]) -> str:
    """The budgets as given, a long number by its digits, a long list by its first three and its last."""
    shown = [str(s) if s < 10**12 else f"(a {len(str(s)) if s.bit_length() < 13_000 else 'many'}-digit number)"
             for s in sides]
    return ",".join(shown) if len(shown) <= 8 else f"{','.join(shown[:3])},...,{shown[-1]} ({len(shown):,} budgets)"


@lru_cache(maxsize=64)
def bucket_set(side: int, step: int | None = None,
               max_aspect: float = DEFAULT_MAX_ASPECT) -> tuple[tuple[int, int], ...]:
    """The buckets (width, height) of the budget ``side`` x ``side``, sorted from the tallest to the widest."""
    check_bucket_options([side], step, max_aspect)
    step = step or default_step(side)
    area, landscape = side * side, []
    for width in range(side, math.isqrt(int(area * max_aspect)) + step, step):
        height = area // width // step * step
        if height and width / height <= max_aspect:
            landscape.append((width, height))
    buckets = set(landscape) | {(h, w) for w, h in landscape}
    return tuple(sorted(buckets, key=lambda b: b[0] / b[1]))


def nearest_bucket(size: tuple[int, int], buckets: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The bucket whose aspect ratio is nearest the size's, in log space; a tie (to 1e-9, past the logs'
    rounding) goes to the squarer bucket."""
    ratio = math.log(size[0] / size[1])
    return min(buckets, key=lambda b: (round(abs(math.log(b[0] / b[1]) - ratio), 9), abs(math.log(b[0] / b[1]))))


def cover(size: tuple[int, int], bucket: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """The size an image of ``size`` is resized to so that it covers ``bucket`` at the least scale, and the
    centred crop's top-left (left, top) in that resized image."""
    (w, h), (bw, bh) = size, bucket
    scale = cover_scale(size, bucket)
    resized = (max(bw, round(w * scale)), max(bh, round(h * scale)))
    return resized, ((resized[0] - bw) // 2, (resized[1] - bh) // 2)


def fits_without_upscaling(size: tuple[int, int], bucket: tuple[int, int]) -> bool:
    return size[0] >= bucket[0] and size[1] >= bucket[1]


def bucket_name(bucket: tuple[int, int]) -> str:
    return f"{bucket[0]}x{bucket[1]}"


def assign(size: tuple[int, int], buckets: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """The bucket an image of ``size`` goes to, or None when it would have to be scaled up to cover it (an
    image of 1 x 10000 px covers a 96 x 160 bucket only at 96 x 960000 px: never allocated)."""
    bucket = nearest_bucket(size, buckets)
    return bucket if fits_without_upscaling(size, bucket) else None


def cover_scale(size: tuple[int, int], bucket: tuple[int, int]) -> float:
    return max(bucket[0] / size[0], bucket[1] / size[1])


def aspect_bucket(aspect: tuple[float, float], side: int, step: int) -> tuple[int, int]:
    """The bucket (width, height) of the budget ``side`` x ``side`` on ``step`` nearest the aspect ``aspect`` (W, H):
    what a model trained on that budget's buckets draws at that aspect (`dwb sample --aspect`, evaluate's ``aspect``).
    The set reaches the aspect asked for where it is wider than ``DEFAULT_MAX_ASPECT``."""
    ratio = aspect[0] / aspect[1]
    return nearest_bucket(aspect, bucket_set(side, step, max(DEFAULT_MAX_ASPECT, ratio, 1 / ratio)))
