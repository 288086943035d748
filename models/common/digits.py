"""How an interval and a p-value are printed, so that the digits never contradict the words beside them.

A verdict says "better" when an interval lies clear of a threshold (0 for a difference, 50% for a
preference) and p < 0.05; rounding must not undo that on the page. Intervals are rounded outward (the
printed interval holds the computed one) with three significant digits of their width, and with more
decimals where a bound clear of the threshold would otherwise print on it. A p-value under 0.05 that two
digits would round to 0.05 (0.0498) prints "p < 0.05".
"""
from __future__ import annotations

import math

MAX_DECIMALS = 12


def _decimals(lo: float, hi: float) -> int:
    """Three significant digits of the interval's width (of its size when it has no width; 0 for whole numbers)."""
    width = hi - lo
    if width > 0:
        return max(0, 2 - math.floor(math.log10(width)))
    size = max(abs(lo), abs(hi))
    return 0 if size == 0 or float(size).is_integer() else max(0, 2 - math.floor(math.log10(size)))


def outward(lo: float, hi: float, decimals: int) -> tuple[float, float]:
    """``lo`` rounded down and ``hi`` up to ``decimals`` (a last-bit error in lo x 10^d does not move a step)."""
    scale = 10.0 ** decimals
    return math.floor(round(lo * scale, 6)) / scale, math.ceil(round(hi * scale, 6)) / scale


def interval_decimals(lo: float, hi: float, threshold: float = 0.0) -> int:
    """Decimals for an interval: three significant digits of its width, more while rounding outward would print
    a bound that is clear of ``threshold`` on it or past it."""
    decimals = _decimals(lo, hi)
    while decimals < MAX_DECIMALS:
        plo, phi = outward(lo, hi, decimals)
        if not ((lo > threshold and plo <= threshold) or (hi < threshold and phi >= threshold)):
            break
        decimals += 1
    return decimals


def interval_text(estimate: float, lo: float, hi: float, threshold: float = 0.0, signed: bool = False) -> str:
    """``estimate [lo, hi]``, the bounds rounded outward with ``interval_decimals``."""
    d = interval_decimals(lo, hi, threshold)
    plo, phi = outward(lo, hi, d)
    sign = "+" if signed else ""
    return f"{estimate:{sign}.{d}f} [{plo:{sign}.{d}f}, {phi:{sign}.{d}f}]"


def round_up(x: float, digits: int = 2) -> float:
    """``x`` > 0 rounded up to ``digits`` significant digits."""
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(x)))
    return math.ceil(round(x * scale, 6)) / scale


def p_value_text(p: float, threshold: float = 0.05, floor: float = 0.0, bound: bool = False) -> str:
    """"p = 0.012"; "p < 0.05" for a p under ``threshold`` that two digits would round to it; "p <= x" at the
    smallest p the method resolves (``floor``) and for an upper bound (``bound``), x rounded up; "p < 0.001"."""
    if (floor and p <= floor * (1 + 1e-9)) or (bound and p < 1):
        return f"p <= {round_up(max(p, floor)):.2g}"
    if p < 0.001:
        return "p < 0.001"
    text = f"{p:.2g}"
    if p < threshold <= float(text):
        return f"p < {threshold:g}"
    return f"p = {text}"


def flip_text(count: int, exact: bool, unit: str) -> str:
    """How many removed prompts or votes would flip a verdict, as every surface prints it beside the interval: "flips
    without 3 prompts", "flips without at most 4 prompts" (``exact`` False: an upper bound from a greedy search),
    "flips without 7 of its votes" (``unit`` "vote": the leading side's own votes)."""
    noun = f"of its {unit}s" if unit == "vote" else f"{unit}{'' if count == 1 else 's'}"  # "1 of its votes"
    return f"flips without {'' if exact else 'at most '}{count} {noun}"
