"""The HTML page, structurally: self-contained, sections present when their data is, the
report JSON embedded and parseable, every user string escaped."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from fxlens.analyzer.core.report import Report
from fxlens.reports.escape import dot_escape, html_escape, json_script, markdown_escape
from fxlens.reports.html import clean_svg, render_html
from tests.models import evil_names

SVG = ('<?xml version="1.0"?>\n<!DOCTYPE svg>\n<svg width="100pt" height="50pt" '
       'viewBox="0 0 100 50" xmlns="http://www.w3.org/2000/svg"><g id="n1" class="node">'
       "<title>n1</title></g><script>alert(3)</script></svg>")


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.ids: set[str] = set()
        self.data: list[str] = []
        self._in_data = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(str(found["id"]))
        if tag == "script":
            self.scripts.append(found)
            self._in_data = found.get("type") == "application/json"

    def handle_endtag(self, tag: str) -> None:
        self._in_data = False

    def handle_data(self, data: str) -> None:
        if self._in_data:
            self.data.append(data)


def parse(page: str) -> _Tags:
    tags = _Tags()
    tags.feed(page)
    return tags


def test_self_contained_with_sections(gpt_report: Report) -> None:
    page = render_html(gpt_report, SVG)
    tags = parse(page)
    assert {"summary", "modules", "ops", "hotspots", "memory", "graph", "module-table",
            "ops-table", "op-filter", "graph-view", "memory-chart", "details",
            "fusion"} <= tags.ids  # fusion and its findings: on every inference report
    assert not ({"roofline", "quant", "diff"} & tags.ids)
    assert len(tags.scripts) == 2 and all("src" not in s for s in tags.scripts)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "<link rel=\"stylesheet\"" not in page and "@import" not in page


def test_report_json_is_embedded_whole(gpt_report: Report) -> None:
    data = json.loads("".join(parse(render_html(gpt_report, None)).data))
    assert data["report"] == json.loads(gpt_report.to_json())
    assert data["view"]["blocks"] == ["blocks.0", "blocks.1"]


def test_embedded_json_is_one_json_script_of_the_page_data(evil_report: Report) -> None:
    """The page writes the report's JSON before graphviz is done and the view's after; the
    two pieces read as `json_script` of the whole, hidden characters and all."""
    text = "".join(parse(render_html(evil_report, None)).data)
    assert text == json_script(json.loads(text))
    assert set(json.loads(text)) == {"report", "view"}


def test_graph_svg_is_inlined_clean(gpt_report: Report) -> None:
    page = render_html(gpt_report, SVG)
    assert '<g id="n1" class="node">' in page
    assert "alert(3)" not in page and "<?xml" not in page and 'width="100pt"' not in page
    assert 'id="graph-missing"' in render_html(gpt_report, None)
    assert clean_svg(SVG).startswith("<svg")


def test_memory_chart_marks_the_peak(gpt_report: Report) -> None:
    page = render_html(gpt_report, None)
    chart = page[page.index('<svg id="memory-chart"'):]
    chart = chart[:chart.index("</svg>")]
    peak = gpt_report.to_dict()["memory"]["peak_node"]
    assert f'data-node="{peak}"' in chart and "peak " in chart and "<polyline" in chart


def test_optional_sections_render_when_present(evil_report: Report) -> None:
    tags = parse(render_html(evil_report, None, diff_html="<p id='diff-body'>d</p>"))
    assert {"fusion", "quant", "diff", "diff-body"} <= tags.ids


def test_user_strings_never_become_markup(evil_report: Report) -> None:
    page = render_html(evil_report, None)
    assert evil_names.SCRIPT_NAME not in page
    assert "<img" not in page and "<b>model" not in page
    assert html_escape(evil_names.SCRIPT_NAME) in page     # shown as text in the tables
    assert "</script" not in "".join(parse(page).data)
    assert page.count("<script") == 2 and page.count("</script>") == 2


@pytest.mark.parametrize("text", [evil_names.SCRIPT_NAME, evil_names.QUOTE_NAME, "a\nb|c_d"])
def test_one_escaper_per_format(text: str) -> None:
    assert "<" not in html_escape(text) and '"' not in html_escape(text)
    assert "<" not in json_script({"k": text}) and json.loads(json_script({"k": text}))["k"] == text
    assert re.fullmatch(r'([^"\\]|\\.)*', dot_escape(text))
    assert "\n" not in markdown_escape(text) and "<" not in markdown_escape(text)


@pytest.fixture(scope="module")
def step_report() -> Report:
    from fxlens.analyzer.core.loaded import LoadedModel
    from fxlens.api import AnalysisOptions, analyze_loaded
    from tests.models import tiny_gpt

    module, inputs = tiny_gpt.build()
    return analyze_loaded(LoadedModel(module, inputs, "tiny_gpt", "tiny_gpt.py"),
                          AnalysisOptions(train=True, device="h100", strict=True))


def test_memory_chart_has_tooltips_and_the_room_a_device_leaves(step_report: Report) -> None:
    from dataclasses import replace

    from fxlens.analyzer.core.sections import Memory, Training

    page = render_html(step_report, None)
    chart = page[page.index('<svg id="memory-chart"'):]
    chart = chart[:chart.index("</svg>")]
    assert chart.count('class="tip"') >= 20 and "live after #" in chart
    assert 'class="capacity"><title>' not in chart and "(off the chart)" in chart  # 80 GiB ≫ peak
    training = step_report.require(Training)
    assert training.fit is not None
    peak = max(step_report.require(Memory).timeline)
    tight = replace(training.fit, device_bytes=training.peak_breakdown.persistent_bytes
                    + peak // 2)
    crowded = render_html(step_report.with_(replace(training, fit=tight)), None)
    line = re.search(r'<line [^>]*class="capacity"><title>([^<]*)</title>', crowded)
    assert line is not None and "left for these" in line.group(1)


def test_roofline_chart_has_ticks_on_both_log_axes(step_report: Report) -> None:
    page = render_html(step_report, None)
    chart = page[page.index('<svg id="roofline-chart"'):]
    chart = chart[:chart.index("</svg>")]
    labels = re.findall(r'class="tick" text-anchor="(?:middle|end)">([^<]+)</text>', chart)
    assert {"1", "10"} <= set(labels) and any(label.endswith(" G") for label in labels)
