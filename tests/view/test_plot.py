"""The metric charts: inline SVG from a pure function, checked by its elements."""

from __future__ import annotations

import math
import re
import sys
import xml.etree.ElementTree as ElementTree

from mpi_magic.view.plot import EACH_RANK_UP_TO, _ticks, charts, metric_lines, svg

NS = "{http://www.w3.org/2000/svg}"


def parsed(text: str) -> ElementTree.Element:
    return ElementTree.fromstring(text)


def numbers_in(text: str) -> list[float]:
    return [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", text)]


def decay(rank: int, points: int = 500) -> list[tuple[float, float]]:
    return [(step, 2 * math.exp(-step / 100) + rank / 10) for step in range(points)]


def test_up_to_16_ranks_each_rank_has_a_line_of_its_own_colour():
    for ranks in (1, 4, EACH_RANK_UP_TO):
        root = parsed(svg("loss", {r: decay(r) for r in range(ranks)}))
        lines = root.findall(f"{NS}polyline")
        assert len(lines) == ranks and not root.findall(f"{NS}path")
        styles = {(line.get("stroke"), line.get("stroke-dasharray")) for line in lines}
        assert len(styles) == ranks, "no two ranks look alike"
        assert [line.find(f"{NS}title").text.split(":")[0] for line in lines] == [f"rank {r}" for r in range(ranks)]
        assert root.find(f"{NS}text").text == "loss", "the metric's name is the title"


def test_above_16_ranks_the_mean_is_drawn_with_a_min_max_band():
    series = {r: [(s, float(r)) for s in range(100)] for r in range(EACH_RANK_UP_TO + 1)}
    root = parsed(svg("loss", series))
    (mean,) = root.findall(f"{NS}polyline")
    (band,) = root.findall(f"{NS}path")
    assert mean.find(f"{NS}title").text.startswith("mean over 17 ranks: 8 at step")
    assert band.find(f"{NS}title").text == "min to max over 17 ranks"
    ys = numbers_in(band.get("d"))[1::2]
    mean_ys = numbers_in(mean.get("points"))[1::2]
    assert max(ys) > max(mean_ys) >= min(mean_ys) > min(ys), "the band spans the ranks, the mean lies inside"


def test_the_axes_have_round_ticks_of_steps_and_values_in_the_themes_colour():
    root = parsed(svg("loss", {0: [(0, 0.0), (1000, 1.0)]}))
    labels = [t.text for t in root.findall(f"{NS}text")]
    assert labels[0] == "loss"
    assert {"0", "0.5", "1"} <= set(labels) and {"250", "500", "750", "1k"} <= set(labels)
    assert "var(--jp-ui-font-color1, currentColor)" in root.get("style")
    assert all(t.get("fill") == "currentColor" for t in root.findall(f"{NS}text"))
    assert all(line.get("stroke") == "currentColor" for line in root.findall(f"{NS}line"))


def test_lines_are_thinned_to_about_two_points_a_pixel_and_end_at_the_last_point():
    root = parsed(svg("loss", {0: [(s, float(s % 7)) for s in range(100_000)]}))
    (line,) = root.findall(f"{NS}polyline")
    coordinates = line.get("points").split()
    assert len(coordinates) <= 2 * 300 + 2
    assert line.find(f"{NS}title").text == "rank 0: 4 at step 99999"


def test_odd_series_draw_without_nan_or_infinity():
    cases = [{0: [(0, 1e308), (1, -1e308), (2, 0.0)], 1: [(-1e308, 5.0)]},
             {0: [(3, 7.0)]},  # one point: a dot, and axes around it
             {0: [(0, 1.0), (0, 1.0)]},
             {0: [(0, 1.0), (1, 1.0 + 1e-300)]},
             {r: [(0, (-1) ** r * 1e308)] for r in range(40)}]  # a band whose mean overflows
    for series in cases:
        drawn = svg("x", series)
        root = parsed(drawn)
        assert "nan" not in drawn and "inf" not in drawn, series
        assert root.findall(f"{NS}circle")
    assert "no values yet" in svg("x", {0: []})


def test_names_are_escaped():
    drawn = charts({"a<b": {0: [(0, 1.0)]}})
    assert "a&lt;b" in drawn and "a<b" not in drawn


def test_charts_share_one_legend_and_one_colour_per_rank():
    drawn = charts({"loss": {0: decay(0), 2: decay(2)}, "acc": {2: [(0, 0.5)]}})
    assert drawn.count("<svg xmlns") == 2 and "rank 0</span>" in drawn and "rank 2</span>" in drawn
    loss, acc = (parsed(part[part.index("<svg"):part.index("</svg>") + 6]) for part in drawn.split("<div style='flex:none'>")[1:])
    rank_2 = [line for line in loss.findall(f"{NS}polyline") if line.find(f"{NS}title").text.startswith("rank 2")]
    assert rank_2[0].get("stroke") == acc.find(f"{NS}polyline").get("stroke"), "rank 2 has one colour in every chart"
    assert charts({}) == ""
    many = charts({"loss": {r: decay(r, 20) for r in range(64)}})
    assert "the mean over 64 ranks" in many and "rank 3</span>" not in many


def test_ticks_are_round_and_within_range():
    assert _ticks(0, 1, 4) == [0, 0.25, 0.5, 0.75, 1.0]
    assert _ticks(-3.7, 12.2, 4) == [0, 5, 10]
    assert _ticks(20_000, 30_000, 4) == [20_000, 22_500, 25_000, 27_500, 30_000]


def test_the_last_values_in_words():
    assert metric_lines({"loss": {0: 0.123456, 1: 0.15}}) == ["loss: rank 0 0.1235, rank 1 0.15"]
    latest = {r: float(r) for r in range(64)}
    assert metric_lines({"loss": latest}) == ["loss: min 0 (rank 0), mean 31.5, max 63 (rank 63) over 64 ranks"]


def test_values_of_any_size_read_as_numbers_a_person_reads():
    """Thousands to trillions by their SI letter, beyond them and below a thousandth as a power of
    ten; never a letter after an exponent, nor Python's e-notation."""
    def shown(value: float) -> str:
        (line,) = metric_lines({"x": {0: value}})
        return line.removeprefix("x: rank 0 ")

    cases = [(0.0, "0"), (-0.0, "0"), (0.25, "0.25"), (-3.5, "-3.5"), (0.001, "0.001"), (999.9, "999.9"),
             (999.96, "1k"), (1e3, "1k"), (1234.5, "1.234k"), (-1234567, "-1.235M"), (999_999, "1M"), (1e9, "1G"),
             (1e12, "1T"), (999.95e12, "1×10¹⁵"), (1e15, "1×10¹⁵"), (2 ** 60, "1.153×10¹⁸"), (1e21, "1×10²¹"),
             (1e24, "1×10²⁴"), (-2.5e30, "-2.5×10³⁰"), (1.5e-4, "1.5×10⁻⁴"), (-3e-5, "-3×10⁻⁵"),
             (5e-324, "4.941×10⁻³²⁴"), (1e308, "1×10³⁰⁸"), (sys.float_info.max, "1.798×10³⁰⁸"),
             (-sys.float_info.max, "-1.798×10³⁰⁸"), (math.inf, "inf"), (-math.inf, "-inf"), (math.nan, "nan")]
    assert [(value, shown(value)) for value, _ in cases] == cases
    labels = [t.text for t in parsed(svg("x", {0: [(0, 0.0), (1, 2.0 ** 60)]})).findall(f"{NS}text")]
    assert "1×10¹⁸" in labels and not any("e+" in label or "e-" in label for label in labels)
    assert parsed(svg("x", {0: [(0, 2.0 ** 60)]})).find(f"{NS}polyline/{NS}title").text == "rank 0: 1.15292×10¹⁸ at step 0"
