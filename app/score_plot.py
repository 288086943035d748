"""The Scores tab's plot: one metric against training step, GPU-hours or dollars, drawn by the app as SVG.

Why SVG of our own, not Gradio's native plots or ``gr.Plot``: the native ScatterPlot (Vega-Lite) put points on
the plot's edge and draws neither lines nor error bars, and ``gr.Plot``'s figure reaches the page as an image whose
points a browser cannot find. Here each series is a line, each row a point with its 95% interval as an error bar,
each one an SVG element placed by the same scale as the axes' ticks, so a reader (and the tests) can check every
one against the axes. The scales keep ``INSET`` pixels between the data and the plot area's edges, so no point
or bar end lies on an edge. Against GPU-hours or dollars, the rows without them are left out, and a line under the
plot says how many and why.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape

from .scores import STEP_AXIS, Metric, ScorePoint, XAxis, significant

WIDTH, HEIGHT = 860, 360
LEFT, RIGHT, TOP, BOTTOM = 76, 16, 14, 46  # room for the tick labels and the axis titles
INSET = 14
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#7f7f7f")
POINT_RADIUS, CAP = 4, 4
# The largest magnitude the scales place: a row may hold any finite float, and a FID of 1.7e308 raised
# OverflowError (the span from -1.7e308 to 1.7e308 is infinite, and so was its tick step). A value beyond is drawn
# at this bound, which leaves room for spans, tick steps and their multiples to stay finite; its tooltip and
# data-value keep the row's own.
PLOT_LIMIT = 1e300
# Spans closer than this, relative to the values' size or at all, are one value: a 4-significant-digit axis shows
# no difference, and a span of 5e-324 had no tick step (log10 of 0).
MIN_RELATIVE_SPAN, MIN_SPAN = 1e-9, 1e-200


def plotted(value: float) -> float:
    """``value`` within the scales' bounds (``PLOT_LIMIT``)."""
    return min(max(value, -PLOT_LIMIT), PLOT_LIMIT)


@dataclass(frozen=True)
class Scale:
    """Data ``lo``..``hi`` onto pixels ``start``..``end`` (``end`` above ``start`` on the y axis)."""

    lo: float
    hi: float
    start: float
    end: float

    @classmethod
    def fit(cls, values: Iterable[float], edge_start: float, edge_end: float) -> "Scale":
        """The data's extremes ``INSET`` pixels inside the plot area's edges (each value ``plotted``); one value,
        or values too close to tell apart, get a span round them."""
        values = [plotted(v) for v in values]
        lo, hi = min(values), max(values)
        if hi - lo <= max(abs(lo), abs(hi)) * MIN_RELATIVE_SPAN or hi - lo < MIN_SPAN:
            middle = lo / 2 + hi / 2
            half = abs(middle) / 10 if abs(middle) >= MIN_SPAN else 1.0
            lo, hi = middle - half, middle + half
        inset = INSET if edge_end > edge_start else -INSET
        return cls(lo, hi, edge_start + inset, edge_end - inset)

    def __call__(self, value: float) -> float:
        return self.start + (plotted(value) - self.lo) / (self.hi - self.lo) * (self.end - self.start)

    def at(self, pixel: float) -> float:
        return self.lo + (pixel - self.start) / (self.end - self.start) * (self.hi - self.lo)


def ticks(lo: float, hi: float, whole: bool = False, count: int = 5) -> list[float]:
    """About ``count`` round values (1, 2 or 5 times a power of ten apart) from ``lo`` to ``hi``; whole numbers
    only with ``whole``."""
    raw = (hi - lo) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    if whole:
        step = max(1, round(step))
    return [k * step for k in range(math.ceil(lo / step), math.floor(hi / step) + 1)]


def _colours(points: list[ScorePoint]) -> dict[str, str]:
    return {s: PALETTE[k % len(PALETTE)] for k, s in enumerate(dict.fromkeys(p.series for p in points))}


def _axes(x: Scale, y: Scale, metric: Metric, axis: XAxis) -> list[str]:
    right, bottom = WIDTH - RIGHT, HEIGHT - BOTTOM
    parts = []
    for value in ticks(y.at(bottom), y.at(TOP)):
        py = y(value)
        parts.append(f'<g class="y-tick"><line x1="{LEFT}" x2="{right}" y1="{py:.2f}" y2="{py:.2f}" stroke="#e5e7eb"/>'
                     f'<text x="{LEFT - 6}" y="{py + 4:.2f}" text-anchor="end">{significant(value)}</text></g>')
    for value in ticks(x.at(LEFT), x.at(right), whole=axis.whole):
        px = x(value)
        label = int(value) if axis.whole and abs(value) < 1e15 else significant(value)
        parts.append(f'<g class="x-tick"><line x1="{px:.2f}" x2="{px:.2f}" y1="{TOP}" y2="{bottom}" stroke="#e5e7eb"/>'
                     f'<text x="{px:.2f}" y="{bottom + 16}" text-anchor="middle">{label}</text></g>')
    parts.append(f'<text class="x-title" x="{(LEFT + right) / 2}" y="{HEIGHT - 6}" text-anchor="middle">'
                 f'{escape(axis.title)}</text>')
    parts.append(f'<text class="y-title" transform="translate(14 {(TOP + bottom) / 2}) rotate(-90)" '
                 f'text-anchor="middle">{escape(metric.title())}</text>')
    return parts


def _point(p: ScorePoint, x: Scale, y: Scale, colour: str, axis: XAxis) -> str:
    """A row's error bar (its interval, where it has one) and its point, which carries its values and a tooltip."""
    px, py, s = x(p.x(axis)), y(p.score.value), p.score
    bar = ""
    if s.lo is not None:
        top, low = y(s.hi), y(s.lo)
        bar = (f'<g class="error-bar" data-step="{p.step}" data-x="{p.x(axis)!r}" data-lo="{s.lo!r}" '
               f'data-hi="{s.hi!r}" stroke="{colour}">'
               f'<line class="bar" x1="{px:.2f}" x2="{px:.2f}" y1="{top:.2f}" y2="{low:.2f}"/>'
               f'<line x1="{px - CAP:.2f}" x2="{px + CAP:.2f}" y1="{top:.2f}" y2="{top:.2f}"/>'
               f'<line x1="{px - CAP:.2f}" x2="{px + CAP:.2f}" y1="{low:.2f}" y2="{low:.2f}"/></g>')
    where = ", ".join(t for t in (f"step {p.step}", p.cost_text()) if t)
    tooltip = f"{p.checkpoint or 'not under the app folders'}, {where}: {s.text()}"
    return (f'{bar}<circle class="point" cx="{px:.2f}" cy="{py:.2f}" r="{POINT_RADIUS}" fill="{colour}" '
            f'data-step="{p.step}" data-x="{p.x(axis)!r}" data-value="{s.value!r}" data-series="{escape(p.series)}">'
            f'<title>{escape(tooltip)}</title></circle>')


def score_plot(points: list[ScorePoint], metric: Metric, axis: XAxis = STEP_AXIS) -> str:
    """The plot of ``points`` (one metric's rows) against ``axis``, a line per series, its legend and a line saying
    how many rows it leaves out (those without a value on ``axis``), as HTML."""
    area = (f'<rect class="plot-area" x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" '
            f'height="{HEIGHT - TOP - BOTTOM}" fill="none" stroke="#9ca3af"/>')
    svg = (f'<svg class="score-plot" viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" role="img" '
           f'aria-label="{escape(metric.name)} against {escape(axis.title)}" font-size="12" font-family="sans-serif">')
    placed = [p for p in points if p.x(axis) is not None]
    note = left_out_note(len(points) - len(placed), len(points), axis)
    if not placed:
        return f'{svg}{area}</svg>{note}'
    x = Scale.fit((p.x(axis) for p in placed), LEFT, WIDTH - RIGHT)
    bounds = [v for p in placed for v in (p.score.value, p.score.lo, p.score.hi) if v is not None]
    y = Scale.fit(bounds, HEIGHT - BOTTOM, TOP)
    colours = _colours(placed)
    series = []
    for name, colour in colours.items():
        mine = sorted((p for p in placed if p.series == name), key=lambda p: (p.x(axis), p.step))
        line = " ".join(f"{x(p.x(axis)):.2f},{y(p.score.value):.2f}" for p in mine)
        series.append(f'<g class="series" data-series="{escape(name)}">'
                      f'<polyline class="line" points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
                      + "".join(_point(p, x, y, colour, axis) for p in mine) + "</g>")
    legend = "".join(f'<li><span style="display:inline-block;width:10px;height:10px;margin-right:6px;'
                     f'background:{colour}"></span>{escape(name)}</li>' for name, colour in colours.items())
    return (f'{svg}{"".join(_axes(x, y, metric, axis))}{area}{"".join(series)}</svg>'
            f'<ul class="score-legend" style="list-style:none;margin:4px 0 0 {LEFT}px;padding:0">{legend}</ul>{note}')


def left_out_note(left: int, total: int, axis: XAxis) -> str:
    """``2 of 7 rows are left out of the plot: no GPU-hours recorded (...)``; nothing when none is."""
    if not left:
        return ""
    return (f'<p class="score-left-out" style="margin:4px 0 0 {LEFT}px">{left} of {total} rows '
            f'{"is" if left == 1 else "are"} left out of the plot: {escape(axis.missing)}.</p>')
