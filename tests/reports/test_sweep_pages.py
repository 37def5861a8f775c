"""A sweep's pages as a reader sees them (issue 36): lines in order of their values, value
axes with 1-2-5 ticks, the x axis on the axis with the most values, every figure labelled by
what it counts, failures in a short column with their full text below, the Markdown table in
the open. Rows are written by hand: no model runs here."""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fxlens.reports.axes import BYTE_UNITS, FLOP_UNITS, axis_ticks, nice_ticks
from fxlens.reports.sweep import (
    chart_axes,
    render_sweep_html,
    render_sweep_markdown,
    sweep_view,
)
from fxlens.sweep import axis_value, swept_axes

PEAK_OF = "weights + activation peak (eager, simulated)"


def row(batch: int, seq_len: int, n_layer: int = 2, **figures: Any) -> dict[str, Any]:
    base = {"target": "m.py", "set": f"n_layer={n_layer}", "batch": batch, "seq_len": seq_len,
            "status": "ok", "flops": 273_580_000_000 * batch * seq_len // 1024,
            "flops_of": "forward", "peak_bytes": 3 * 2**20 * batch, "peak_of": PEAK_OF}
    return {**base, **figures}


def legend(page: str, metric: str = "flops") -> list[str]:
    chart = page.split(f'data-metric="{metric}"')[1].split("</figure>")[0]
    return re.findall(r'<span class="s\d">■ ([^<]*)</span>', chart)


def value_ticks(page: str, metric: str = "flops") -> list[str]:
    chart = page.split(f'data-metric="{metric}"')[1].split("</figure>")[0]
    return re.findall(r'text-anchor="end">([^<]*)</text>', chart)


def test_lines_are_ordered_by_value_not_as_text() -> None:
    rows = [row(b, t) for b in (1, 2, 4, 8) for t in (1024, 128, 512)]
    page = render_sweep_html(rows, swept_axes(rows), axis_value)
    assert legend(page) == ["seq_len=128", "seq_len=512", "seq_len=1024"]


def test_x_axis_is_the_swept_axis_with_the_most_values() -> None:
    rows = [row(b, 256, n_layer=n) for n in (2, 4) for b in (1, 8, 32)]
    axes = swept_axes(rows)
    assert axes == ["set:n_layer", "batch"]                 # the table keeps the grid's order
    page = render_sweep_html(rows, axes, axis_value)
    assert page.count(" vs batch</figcaption>") == 2 and " vs n_layer<" not in page
    assert legend(page) == ["n_layer=2", "n_layer=4"]
    assert chart_axes(rows, axes, axis_value) == ("batch", ["set:n_layer"])


def test_value_ticks_are_nice_numbers_in_one_unit_covering_the_data() -> None:
    rows = [row(b, 1024) for b in (1, 2, 3)]                 # FLOPs up to 820.74 G
    page = render_sweep_html(rows, swept_axes(rows), axis_value)
    labels = value_ticks(page)
    assert labels == ["0 GFLOP", "200 GFLOP", "400 GFLOP", "600 GFLOP", "800 GFLOP",
                      "1000 GFLOP"]
    assert value_ticks(page, "peak_bytes") == ["0 MiB", "2 MiB", "4 MiB", "6 MiB", "8 MiB",
                                               "10 MiB"]


@given(st.floats(min_value=1e-3, max_value=1e21, allow_nan=False))
def test_nice_ticks_cover_from_zero_with_a_1_2_5_step(top: float) -> None:
    ticks = nice_ticks(top)
    step = ticks[1]
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert ticks[0] == 0 and 2 <= len(ticks) - 1 <= 5
    assert any(math.isclose(mantissa, m) for m in (1, 2, 5, 10))
    assert ticks[-1] >= top * (1 - 1e-9) and ticks[-2] < top
    assert all(math.isclose(b - a, step, rel_tol=1e-6) for a, b in itertools.pairwise(ticks))


@pytest.mark.parametrize(("top", "units", "expected"), [
    (1.73 * 2**30, BYTE_UNITS, ["0 GiB", "0.5 GiB", "1 GiB", "1.5 GiB", "2 GiB"]),
    (240.59e9, FLOP_UNITS, ["0 GFLOP", "50 GFLOP", "100 GFLOP", "150 GFLOP", "200 GFLOP",
                            "250 GFLOP"]),
])
def test_axis_ticks_label_in_one_unit(top: float, units: Any, expected: list[str]) -> None:
    assert [label for _, label in axis_ticks(top, units)] == expected


def test_every_figure_says_what_it_counts() -> None:
    rows = [row(b, 256, time_s=1e-3 * b, mfu=0.4, fits=True) for b in (1, 2)]
    (table,) = sweep_view(rows, swept_axes(rows), axis_value).tables()
    heads = [c.name for c in table.columns]
    assert heads == ["batch", "forward FLOPs", PEAK_OF, "fits device",
                     "forward time (roofline)", "MFU"]
    page = render_sweep_html(rows, swept_axes(rows), axis_value)
    assert f"{PEAK_OF} vs batch" in page and "forward time (roofline) vs batch" in page


def test_a_failure_is_a_short_cell_with_its_full_text_in_a_note_below() -> None:
    long = "LoadError: " + "the model file raised while building its config; " * 10
    rows = [row(1, 256), row(2, 256), {**row(4, 256), "status": "error", "error": long},
            {**row(8, 256), "status": "refused", "error": "seq_len 2048 is past the limit"}]
    axes = swept_axes(rows)
    sweep, notes = sweep_view(rows, axes, axis_value).tables()
    assert sweep.columns[-1].name == "failure"
    assert [r[-1].plain for r in sweep.rows] == ["", "", "LoadError [1]", "refused [2]"]
    assert all(len(cell.plain) < 40 for r in sweep.rows for cell in r)
    assert [[c.plain for c in r] for r in notes.rows] == [
        ["[1]", long], ["[2]", "seq_len 2048 is past the limit"]]
    markdown = render_sweep_markdown(rows, axes, axis_value)
    table_lines = [line for line in markdown.split("**failed")[0].splitlines()
                   if line.startswith("|")]
    assert len(table_lines) == 2 + len(rows) and max(map(len, table_lines)) < 200
    assert long.strip()[:60] in markdown.split("**failed")[1]      # the full text, below
    page = render_sweep_html(rows, axes, axis_value)
    assert page.count("the model file raised") == 10              # once: in the note
    assert page.count('<figure class="chart"') == 2               # failed rows draw nothing


def test_sweep_md_shows_its_table_in_the_open() -> None:
    rows = [row(b, 256) for b in (1, 2)]
    markdown = render_sweep_markdown(rows, swept_axes(rows), axis_value)
    assert "<details" not in markdown and "</details>" not in markdown
    lines = markdown.splitlines()
    header = lines.index(f"| batch | forward FLOPs | {PEAK_OF} |")
    caption = next(i for i, line in enumerate(lines) if line.startswith("<sub>"))
    assert lines[caption - 1] == ""          # a blank line ends the table before its caption
    assert header < caption
