"""Argparse types of the command line: numbers in a range and values a one-line parser reads, each refusal one
line naming the value (``dwb sample``'s and ``dwb export``'s, and training's and data's flags)."""
from __future__ import annotations

import argparse

from ..errors import WorkbenchError


def positive(value: str) -> int:
    n = int(value)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return n


def part_of(value: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in value.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected i/N such as 0/4, got {value!r}") from None
    if not (n >= 1 and 0 <= i < n):
        raise argparse.ArgumentTypeError(f"expected i/N with 0 <= i < N, got {value!r}")
    return i, n


def positive_number(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return x


def number_text(x: float) -> str:
    """30.0 as "30", 4294967295 as itself (not 4.29497e+09)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def between(lo, hi, kind=int, step: int | None = None):
    """An argparse type: a ``kind`` number in [lo, hi] (a multiple of ``step``), the app's limits on one image."""
    def parse(value: str):
        try:
            x = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {'whole ' if kind is int else ''}number, got {value!r}") from None
        if not lo <= x <= hi:
            raise argparse.ArgumentTypeError(f"{value} is not between {number_text(lo)} and {number_text(hi)}")
        if step and x % step:
            raise argparse.ArgumentTypeError(f"{value} is not a multiple of {step}")
        return x
    return parse


def from_parser(parse):
    """An argparse type from a parser that raises a one-line WorkbenchError."""
    def parsed(value: str):
        try:
            return parse(value)
        except WorkbenchError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parsed


def number_from(low: float, high: float, ends: bool, meaning: str = ""):
    """An argparse type: a number from ``low`` to ``high``, the ends included or not (``meaning`` says what it is)."""
    def parsed(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
        if not (low <= x <= high if ends else low < x < high):
            raise argparse.ArgumentTypeError(f"{value} is not {'from' if ends else 'between'} {low:g} "
                                             f"{'to' if ends else 'and'} {high:g}{meaning}")
        return x
    return parsed


share = number_from(0, 1, ends=True)  # a share of the samples
switch_fraction = number_from(0, 1, ends=False, meaning=" (the fraction of the steps the base takes)")  # the refiner's switch


def size_list(value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes such as 256,512, got {value!r}") from None
    if any(s <= 0 or s % 8 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be positive multiples of 8, got {value!r}")
    return sizes
