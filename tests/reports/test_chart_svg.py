"""A view's `Chart` as inline SVG (`fxlens.reports.chart_svg`), checked without a browser:
one point per datum placed by its value, the axes' ticks in one unit, axis names, the mark, and
user text escaped; the checkpoint section's curve drawn in HTML only (terminal and Markdown
keep its table)."""

from __future__ import annotations

import re

from fxlens.reports.axes import nice_ticks
from fxlens.reports.chart_svg import chart_svg
from fxlens.reports.view import Chart, Mark, Series

MIB = 2**20


def _chart(label: str = "this run") -> Chart:
    points = tuple((float((10 + 2 * i) * MIB), 0.001 * (6 - i)) for i in range(6))
    return Chart("memory–time curve", "budget", "recompute", "B", "s",
                 (Series("curve", points),), (Mark(label, 14.0 * MIB, 0.004),),
                 caption="a caption")


def test_the_svg_places_every_point_by_its_value() -> None:
    svg = chart_svg(_chart())
    points = [(float(x), float(y)) for x, y in re.findall(
        r'<circle class="point s0" cx="([\d.]+)" cy="([\d.]+)"', svg)]
    assert len(points) == 6
    xs, ys = zip(*points, strict=True)
    assert list(xs) == sorted(xs) and len(set(xs)) == 6          # budget grows to the right
    assert list(ys) == sorted(ys)                                # recompute falls: y grows
    steps = [b - a for a, b in zip(xs, xs[1:], strict=False)]
    assert max(steps) - min(steps) < 0.2                         # a linear axis
    polyline = re.search(r'<polyline class="line s0" points="([^"]+)"', svg)
    assert polyline is not None and len(polyline.group(1).split()) == 6
    mark = re.search(r'<circle class="mark" cx="([\d.]+)" cy="([\d.]+)"', svg)
    assert mark is not None and (float(mark.group(1)), float(mark.group(2))) == points[2]


def test_the_axes_are_labelled_in_one_unit_each() -> None:
    svg = chart_svg(_chart())
    x_ticks = re.findall(r'class="tick x-tick"[^>]*>([^<]+)<', svg)
    y_ticks = re.findall(r'class="tick y-tick"[^>]*>([^<]+)<', svg)
    assert x_ticks[0] == "10 MiB" and x_ticks[-1] == "20 MiB"     # from the least point
    assert all(t.endswith(" MiB") for t in x_ticks)
    assert y_ticks[0] == "0 ms" and all(t.endswith(" ms") for t in y_ticks)
    assert float(y_ticks[-1].split()[0]) >= 6
    assert ">budget</text>" in svg and ">recompute</text>" in svg
    assert "<title>budget 14.00 MiB: recompute 4.00 ms</title>" in svg     # the mark's tip


def test_user_text_in_a_chart_is_escaped() -> None:
    svg = chart_svg(_chart("<script>alert(1)</script>"))
    assert "<script>" not in svg and "&lt;script&gt;" in svg


def test_ticks_start_at_the_multiple_below_the_least_value() -> None:
    assert nice_ticks(93, bottom=48) == [40, 50, 60, 70, 80, 90, 100]
    assert nice_ticks(10) == [0, 2, 4, 6, 8, 10]


def test_the_checkpoint_curve_is_a_chart_in_html_and_a_table_elsewhere() -> None:
    import io

    from rich.console import Console

    from fxlens.reports.html import render_view
    from fxlens.reports.markdown import render_view as markdown_view
    from fxlens.reports.terminal import render_view as terminal_view
    from fxlens.reports.view import Detail
    from fxlens.reports.views.checkpoint import checkpoint_view
    from tests.analyzer.test_checkpoint import checkpointed, sac_of

    report = checkpointed("tiny_gpt", "3.4MB")[0]
    section = sac_of(report)
    view = checkpoint_view(report, Detail())
    assert view is not None and any(isinstance(b, Chart) for b in view.blocks)
    html = render_view(view)
    figure = html[html.index('<figure class="view-chart">'):]
    assert len(re.findall(r'<circle class="point', figure)) == len(section.curve)
    assert figure.count('<circle class="mark"') == 1
    console = Console(width=120, record=True, file=io.StringIO(), color_system=None)
    console.print(terminal_view(view))
    text = console.export_text()
    markdown = "\n".join(markdown_view(view))
    for surface in (text, markdown):
        assert "memory–time curve" in surface and "<svg" not in surface
