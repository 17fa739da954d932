"""The metric charts, as inline SVG built by pure functions (no plotting library): one small
chart per metric name, a line per rank up to ``EACH_RANK_UP_TO`` ranks, above that the mean over
the ranks with a shaded band from their minimum to their maximum. The dashboard shows them live
and the summary keeps them, so a saved notebook still shows the final picture.

Axes and text are drawn in ``currentColor`` under the theme's font colour (JupyterLab's
``--jp-ui-font-color1``, the page's own text colour elsewhere), and the lines are mid-tone colours
that read on a light and a dark background alike.
"""

from __future__ import annotations

import html
import math
from typing import Mapping, Sequence

EACH_RANK_UP_TO = 16  # more ranks are drawn as their mean and a min-max band
WIDTH, HEIGHT = 300, 170
LEFT, RIGHT, TOP, BOTTOM = 46, 10, 20, 22  # margins around the plot area (tick labels, title)
# Matplotlib's ten mid-tone colours; ranks 10 to 15 reuse the first six, dashed.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
DASH = "5 3"
BAND_COLOUR = COLOURS[0]
TEXT_STYLE = ("color:var(--jp-ui-font-color1, currentColor);font-family:var(--jp-ui-font-family, sans-serif);"
              "font-size:10px")

Series = Sequence[tuple[float, float]]  # (step, value)


def colour(index: int) -> tuple[str, str]:
    """(colour, dash pattern or "") of the ``index``-th rank drawn."""
    return COLOURS[index % len(COLOURS)], DASH if index >= len(COLOURS) else ""


def svg(name: str, series_by_rank: Mapping[int, Series], order: Sequence[int] | None = None,
        width: int = WIDTH, height: int = HEIGHT) -> str:
    """One chart of metric ``name``: a ``<polyline>`` per rank (coloured by its place in
    ``order``, by default the ranks in order) up to ``EACH_RANK_UP_TO`` ranks in ``order``;
    above that one ``<polyline>`` of the mean and one ``<path>`` of the min-max band. Each line
    is drawn with at most about two points a pixel across."""
    ranks = list(order) if order is not None else sorted(series_by_rank)
    drawn = {rank: list(series_by_rank[rank]) for rank in ranks if series_by_rank.get(rank)}
    plot_width, plot_height = width - LEFT - RIGHT, height - TOP - BOTTOM
    head = (f"<svg xmlns='http://www.w3.org/2000/svg' class='mpi-magic-chart' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' role='img' aria-label='{_attr(name)} per rank' style='{TEXT_STYLE}'>"
            f"<text x='{LEFT}' y='13' fill='currentColor' font-weight='bold'>{html.escape(name)}</text>")
    if not drawn:
        return head + f"<text x='{LEFT}' y='{TOP + plot_height / 2:.0f}' fill='currentColor'>no values yet</text></svg>"
    band = len(ranks) > EACH_RANK_UP_TO
    lines: dict[int, list[tuple[float, float]]]
    if band:
        mean, low, high = _band(drawn, max(2, plot_width // 2))
        lines, values = {-1: mean}, [v for _, v in low] + [v for _, v in high]
    else:
        lines, values = drawn, [v for points in drawn.values() for _, v in points]
    steps = [s for points in lines.values() for s, _ in points]
    x_low, x_high = _span(min(steps), max(steps), pad=False)
    y_low, y_high = _span(min(values), max(values), pad=True)

    def x_of(step: float) -> float:
        return LEFT + _clamp((step - x_low) / (x_high - x_low)) * plot_width

    def y_of(value: float) -> float:
        return TOP + (1 - _clamp((value - y_low) / (y_high - y_low))) * plot_height

    parts = [head, f"<rect x='{LEFT}' y='{TOP}' width='{plot_width}' height='{plot_height}' fill='none' "
                   "stroke='currentColor' stroke-opacity='0.35'/>"]
    for tick in _ticks(y_low, y_high, 4):
        y = y_of(tick)
        parts.append(f"<line x1='{LEFT}' x2='{LEFT + plot_width}' y1='{y:.1f}' y2='{y:.1f}' stroke='currentColor' "
                     f"stroke-opacity='0.12'/><text x='{LEFT - 4}' y='{y + 3:.1f}' fill='currentColor' "
                     f"text-anchor='end'>{_short(tick)}</text>")
    for tick in _ticks(x_low, x_high, 4):
        x = x_of(tick)
        parts.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{TOP + plot_height}' y2='{TOP + plot_height + 3}' "
                     f"stroke='currentColor' stroke-opacity='0.35'/><text x='{x:.1f}' y='{height - 8}' "
                     f"fill='currentColor' text-anchor='middle'>{_short(tick)}</text>")
    if band:
        outline = [(x_of(s), y_of(v)) for s, v in low] + [(x_of(s), y_of(v)) for s, v in reversed(high)]
        parts.append(f"<path class='mpi-magic-band' d='M{_coords(outline, ' L')} Z' fill='{BAND_COLOUR}' "
                     f"fill-opacity='0.25' stroke='none'><title>min to max over {len(drawn)} ranks</title></path>")
        parts.append(_line(mean, x_of, y_of, BAND_COLOUR, "", f"mean over {len(drawn)} ranks", plot_width))
    else:
        for index, rank in enumerate(ranks):
            if rank in drawn:
                stroke, dash = colour(index)
                parts.append(_line(drawn[rank], x_of, y_of, stroke, dash, f"rank {rank}", plot_width))
    return "".join(parts) + "</svg>"


def charts(by_name: Mapping[str, Mapping[int, Series]], limit: int = 32) -> str:
    """Every metric's chart side by side (the first ``limit`` names), with one legend for all
    of them; "" when there is none."""
    if not by_name:
        return ""
    names = list(by_name)[:limit]
    ranks = sorted({rank for name in names for rank, points in by_name[name].items() if points})
    figures = "".join(f"<div style='flex:none'>{svg(name, by_name[name], ranks)}</div>" for name in names)
    return (f"<div class='mpi-magic-metrics' style='{TEXT_STYLE};font-size:11px'>"
            f"<div style='display:flex;flex-wrap:wrap;gap:8px'>{figures}</div>{_legend(ranks)}</div>")


def _legend(ranks: list[int]) -> str:
    if len(ranks) > EACH_RANK_UP_TO:
        return (f"<div>the line: the mean over {len(ranks)} ranks at each step; "
                f"<span style='background:{BAND_COLOUR}40'>&nbsp;shaded&nbsp;</span>: from their minimum to their "
                f"maximum</div>")
    keys = []
    for index, rank in enumerate(ranks):
        stroke, dash = colour(index)
        keys.append(f"<span style='margin-right:10px;white-space:nowrap'><svg width='18' height='8'><line x1='0' "
                    f"x2='18' y1='4' y2='4' stroke='{stroke}' stroke-width='2'"
                    + (f" stroke-dasharray='{dash}'" if dash else "") + f"/></svg> rank {rank}</span>")
    return f"<div>{''.join(keys)}</div>"


def _line(points: Series, x_of, y_of, stroke: str, dash: str, label: str, plot_width: int) -> str:
    """One polyline, thinned to about two points a pixel across, with a dot at its last point
    (a single point has no line to show it)."""
    step = max(1, len(points) // (2 * plot_width))
    shown = list(points[::step])
    if shown[-1] != points[-1]:
        shown.append(points[-1])
    coords = [(x_of(s), y_of(v)) for s, v in shown]
    last_x, last_y = coords[-1]
    title = f"{html.escape(label)}: {_short(points[-1][1], 6)} at step {points[-1][0]:.6g}"
    return (f"<polyline fill='none' stroke='{stroke}' stroke-width='1.5'"
            + (f" stroke-dasharray='{dash}'" if dash else "")
            + f" points='{_coords(coords)}'><title>{title}</title></polyline>"
            f"<circle cx='{last_x:.1f}' cy='{last_y:.1f}' r='2' fill='{stroke}'/>")


def _band(series: Mapping[int, Series], bins: int) -> tuple[list, list, list]:
    """The mean, minimum and maximum over ranks in ``bins`` equal slices of the steps, each rank
    counted by its last value in a slice: (mean, low, high) as [(step, value), ...]."""
    all_steps = [s for points in series.values() for s, _ in points]
    first, last = _span(min(all_steps), max(all_steps), pad=False)
    width = (last - first) / bins
    found: dict[int, list[float]] = {}
    for points in series.values():
        last_in_bin: dict[int, float] = {}
        for step, value in points:
            last_in_bin[min(bins - 1, int(_clamp((step - first) / (last - first)) * bins))] = value
        for index, value in last_in_bin.items():
            found.setdefault(index, []).append(value)
    mean, low, high = [], [], []
    for index in sorted(found):
        values = found[index]
        at = first + (index + 0.5) * width
        mean.append((at, sum(values) / len(values)))  # (not fsum: it raises where a sum overflows)
        low.append((at, min(values)))
        high.append((at, max(values)))
    return mean, low, high


def _span(low: float, high: float, pad: bool) -> tuple[float, float]:
    """An axis's range: a little room around the values (``pad``), never empty nor overflowing."""
    low, high = max(low, -1e300), min(high, 1e300)
    if high <= low:
        room = abs(low) * 0.1 or 1.0
        return low - room, high + room
    room = (high - low) * 0.05 if pad else 0.0
    return low - room, high + room


def _ticks(low: float, high: float, count: int) -> list[float]:
    """Round values between ``low`` and ``high``, about ``count`` of them (1, 2, 2.5 or 5 times a
    power of ten apart)."""
    raw = (high - low) / count
    if not 0 < raw < math.inf:  # (a span too small for a float)
        return [low]
    magnitude = 10 ** math.floor(math.log10(raw))
    spacing = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / spacing)
    return [i * spacing for i in range(first, first + count + 2) if low <= i * spacing <= high]


_SI_PREFIXES = (("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12))  # the ones everyone reads
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _short(value: float, digits: int = 3) -> str:
    """A value in ``digits`` significant figures as a person reads it: 0.25, 1.5k, 12M, 3.4T, and
    beyond a trillion or below a thousandth as a power of ten (1.15×10¹⁸, 3×10⁻⁵); inf and nan as such."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    rounded = float(f"{value:.{digits}g}")  # first, so that 999,999 reads 1M, not 1000k
    if not math.isfinite(rounded):  # the largest floats round up past them
        rounded = value
    size = abs(rounded)
    if 1e-3 <= size < 1e3:
        return f"{rounded:.{digits}g}"
    for prefix, scale in _SI_PREFIXES:
        if scale <= size < 1e3 * scale:
            return f"{rounded / scale:.{digits}g}{prefix}"
    mantissa, exponent = f"{rounded:.{digits - 1}e}".split("e")
    return f"{float(mantissa):.{digits}g}×10{str(int(exponent)).translate(_SUPERSCRIPT)}"


def _coords(points: list[tuple[float, float]], sep: str = " ") -> str:
    return sep.join(f"{x:.1f},{y:.1f}" for x, y in points)


def _clamp(fraction: float) -> float:
    return fraction if 0 < fraction < 1 else 1.0 if fraction >= 1 else 0.0  # NaN too: 0


def _attr(text: str) -> str:
    return html.escape(text, quote=True)


def metric_lines(latest_by_name: Mapping[str, Mapping[int, float]], limit: int = 32) -> list[str]:
    """The last value of each metric in words: "loss: rank 0 0.12, rank 1 0.15" up to
    ``EACH_RANK_UP_TO`` ranks, else "loss: min 0.1 (rank 3), mean 0.12, max 0.2 (rank 7) over 64 ranks"."""
    lines = []
    for name in list(latest_by_name)[:limit]:
        latest = latest_by_name[name]
        if not latest:
            continue
        if len(latest) <= EACH_RANK_UP_TO:
            lines.append(f"{name}: " + ", ".join(f"rank {rank} {_short(value, 4)}" for rank, value in latest.items()))
        else:
            low, high = min(latest, key=latest.__getitem__), max(latest, key=latest.__getitem__)
            mean = sum(latest.values()) / len(latest)
            lines.append(f"{name}: min {_short(latest[low], 4)} (rank {low}), mean {_short(mean, 4)}, "
                         f"max {_short(latest[high], 4)} (rank {high}) over {len(latest)} ranks")
    return lines
