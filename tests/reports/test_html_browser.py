"""The HTML page in a real headless Chromium (Debian's chromium + chromedriver via Selenium):
no console errors, the graph renders, sorting reorders rows, clicking a node shows its details
and source line, a module named ``<script>…`` does not run. Screenshots go to tests/output/.

These run in CI (scripts/setup.sh installs chromium); they skip, saying why, only where the
browser or its driver is absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fxlens.analyzer.core.report import Report
from fxlens.reports.dot import dot_binary, graphviz_render, render_dot
from fxlens.reports.html import render_html
from tests.models import evil_names
from tests.reports.browser import chromium, chromium_missing, console_errors, wait_ready

pytestmark = pytest.mark.skipif(chromium_missing() is not None,
                                reason=f"browser tests need Chromium: {chromium_missing()}")

OUTPUT = Path(__file__).resolve().parents[1] / "output"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def open_page(driver: Any, report: Report, tmp_path: Path, name: str) -> Any:
    svg = graphviz_render(render_dot(report)).decode() if dot_binary() else None
    page = tmp_path / f"{name}.html"
    page.write_text(render_html(report, svg), encoding="utf-8")
    driver.get_log("browser")                      # drop entries of earlier pages
    driver.get(page.as_uri())
    wait_ready(driver)
    return driver


def click(driver: Any, css: str) -> None:
    from selenium.webdriver.common.by import By

    element = driver.find_element(By.CSS_SELECTOR, css)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def test_page_loads_clean_and_graph_renders(browser: Any, gpt_report: Report,
                                            tmp_path: Path) -> None:
    open_page(browser, gpt_report, tmp_path, "gpt")
    assert console_errors(browser) == []
    rows = browser.execute_script("return document.querySelectorAll('#module-table tbody tr')"
                                  ".length")
    assert rows >= 3
    if dot_binary():
        size = browser.execute_script(
            "var r = document.querySelector('#graph-view svg').getBoundingClientRect();"
            "return [r.width, r.height, document.querySelectorAll('#graph-view g.node')"
            ".length]")
        assert size[0] > 100 and size[1] > 100 and size[2] >= 5
    OUTPUT.mkdir(exist_ok=True)
    browser.save_screenshot(str(OUTPUT / "report_tiny_gpt.png"))
    assert (OUTPUT / "report_tiny_gpt.png").stat().st_size > 10_000


def test_sorting_a_column_reorders_rows(browser: Any, gpt_report: Report,
                                        tmp_path: Path) -> None:
    open_page(browser, gpt_report, tmp_path, "sort")
    order = ("return Array.from(document.querySelectorAll('#ops-table tbody tr[data-node]'))"
             ".map(r => Number(r.dataset.node))")
    before = browser.execute_script(order)
    click(browser, "#ops-table th[data-key='flops']")
    after = browser.execute_script(order)
    assert after != before
    flops = {n.id: n.flops for n in gpt_report.nodes}
    assert [flops[i] for i in after] == sorted((flops[i] for i in after), reverse=True)
    assert after[0] == max(gpt_report.nodes, key=lambda n: (n.flops, -n.id)).id
    tree = ("return Array.from(document.querySelectorAll('#module-table tbody tr'))"
            ".map(r => r.dataset.path)")
    before = browser.execute_script(tree)
    click(browser, "#module-table th[data-key='path']")
    click(browser, "#module-table th[data-key='path']")      # descending by name
    assert browser.execute_script(tree) != before


def test_filter_box_filters_ops(browser: Any, gpt_report: Report, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(browser, gpt_report, tmp_path, "filter")
    browser.find_element(By.ID, "op-filter").send_keys("layer_norm")
    expected = sum(n.target == "aten.layer_norm.default" for n in gpt_report.nodes)
    WebDriverWait(browser, 5).until(lambda d: d.find_element(By.ID, "op-count").text.startswith(
        f"{expected} of"))


@pytest.mark.skipif(dot_binary() is None, reason="graphviz's dot is not installed")
def test_clicking_a_node_shows_details_and_source(browser: Any, gpt_report: Report,
                                                  tmp_path: Path) -> None:
    open_page(browser, gpt_report, tmp_path, "click")
    head = max((n for n in gpt_report.nodes if not n.module.startswith("blocks.")),
               key=lambda n: n.flops)
    click(browser, f"#graph-view g.node[id='n{head.id}'] text")
    panel = browser.find_element("id", "details")
    assert panel.is_displayed()
    text = panel.text
    assert f"node {head.id}" in text and head.source in text and "FLOPs" in text
    assert browser.execute_script(
        f"return document.getElementById('n{head.id}').classList.contains('selected')")
    click(browser, "#graph-view g.node[id='b0'] text")          # the run of both blocks
    text = browser.find_element("id", "details").text
    assert "blocks blocks.0–1 ×2" in text and "2 alike blocks" in text and "in all" in text
    browser.execute_script("[...document.querySelectorAll('#details a')].find(a => "
                           "a.textContent.includes('modules table')).click()")
    row = browser.execute_script("var r = document.querySelector('#module-table tr.flash');"
                                 "return r && r.dataset.path")
    assert row == "blocks.0"
    assert console_errors(browser) == []


def test_non_ascii_names_read_back_from_the_page_data(browser: Any, gpt_report: Report,
                                                     tmp_path: Path) -> None:
    """The page's JSON keeps non-ASCII characters as UTF-8 (not ``\\u`` escapes): the
    script reads them back as they were, in the module tree and the ops table."""
    from dataclasses import replace

    name = "Блок·ü·模型·😀"
    modules = tuple(replace(m, type=name) if m.path == "blocks.0" else m
                    for m in gpt_report.modules)
    nodes = tuple(replace(n, source=f"{name}.py:1") for n in gpt_report.nodes)
    open_page(browser, replace(gpt_report, modules=modules, nodes=nodes), tmp_path, "utf8")
    assert console_errors(browser) == []
    tree = browser.find_element("id", "module-table").text
    ops = browser.find_element("id", "ops-table").text
    assert name in tree and f"{name}.py:1" in ops


def test_script_module_name_does_not_run(browser: Any, evil_report: Report,
                                         tmp_path: Path) -> None:
    open_page(browser, evil_report, tmp_path, "evil")
    assert browser.execute_script("return typeof window.fxlensReady") == "number"
    from selenium.common.exceptions import NoAlertPresentException

    with pytest.raises(NoAlertPresentException):
        _ = browser.switch_to.alert.text               # alert(1) never ran
    assert browser.execute_script(
        "return document.querySelectorAll('body script').length") == 2
    assert evil_names.SCRIPT_NAME in browser.find_element("id", "hotspots").text
    click(browser, "#module-table tbody tr:nth-child(2) td")
    assert evil_names.SCRIPT_NAME in browser.find_element("id", "details").text
    assert console_errors(browser) == []
    OUTPUT.mkdir(exist_ok=True)
    browser.save_screenshot(str(OUTPUT / "report_evil_names.png"))


@pytest.mark.slow
def test_every_section_renders_without_overlapping_tables(browser: Any, tmp_path: Path) -> None:
    """A training + KV cache + quantization + roofline + plan report: each section is on the
    page, visible, and no two tables' boxes intersect at 1400 px."""
    from fxlens.analyzer.core.loaded import LoadedModel
    from fxlens.api import AnalysisOptions, analyze_loaded
    from tests.models import tiny_gpt

    module, inputs = tiny_gpt.build()
    report = analyze_loaded(LoadedModel(module, inputs, "tiny_gpt", "tiny_gpt.py"),
                            AnalysisOptions(train=True, quant=True, kv_cache=True,
                                            device="h100", checkpoint=True, plan=True,
                                            gpus=8))
    open_page(browser, report, tmp_path, "sections")
    assert console_errors(browser) == []
    for key in ("training", "kv-cache", "roofline", "fusion", "quant", "plan"):
        height = browser.execute_script(
            f"return document.getElementById('{key}').getBoundingClientRect().height")
        assert height > 40, key
    boxes = browser.execute_script(
        "return [...document.querySelectorAll('.view-table table, .hot table')]"
        ".filter(t => t.offsetParent)"
        ".map(t => { const r = t.getBoundingClientRect();"
        " return [r.left + scrollX, r.top + scrollY, r.right + scrollX, r.bottom + scrollY]; })")
    overlaps = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]
                if a[0] < b[2] - 1 and b[0] < a[2] - 1 and a[1] < b[3] - 1 and b[1] < a[3] - 1]
    assert overlaps == []
    # a section's cells wrap rather than cut: no cell's text runs past its box (the notes
    # and risks of the quantization section were cut with an ellipsis at 420 px)
    clipped = browser.execute_script(
        "return [...document.querySelectorAll('.view-table td')]"
        ".filter(td => td.offsetParent && td.scrollWidth > td.clientWidth + 1)"
        ".map(td => td.textContent.slice(0, 60))")
    assert clipped == []
    OUTPUT.mkdir(exist_ok=True)
    browser.save_screenshot(str(OUTPUT / "sections.png"))


def test_free_ops_are_hidden_until_asked_for(browser: Any, gpt_report: Report,
                                             tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(browser, gpt_report, tmp_path, "free")
    total = len(gpt_report.nodes)
    costed = sum(n.status != "free" for n in gpt_report.nodes)
    assert costed < total
    count = browser.find_element(By.ID, "op-count")
    assert count.text == f"{costed} of {total} ops"
    click(browser, "#op-free")
    WebDriverWait(browser, 5).until(lambda d: count.text == f"{total} of {total} ops")


def test_module_tree_groups_runs_of_identical_blocks(browser: Any, gpt_report: Report,
                                                     tmp_path: Path) -> None:
    open_page(browser, gpt_report, tmp_path, "runs")
    labels = ("return Array.from(document.querySelectorAll("
              "'#module-table tbody tr td:first-child'))"
              ".map(td => td.textContent.replace(/^[▾▸]/, '').trim())")
    shown = browser.execute_script(labels)
    assert "0–1 ×2" in shown and "0" not in shown
    click(browser, "#module-table tbody tr[data-path='blocks.0–1'] .toggle")
    shown = browser.execute_script(labels)
    assert "0" in shown and "1" in shown


def test_a_collapsed_block_expands_in_place_and_back(browser: Any, gpt_report: Report,
                                                     tmp_path: Path) -> None:
    if dot_binary() is None:
        pytest.skip("graphviz's dot is absent (scripts/setup.sh installs it)")
    from fxlens.reports.write import PageOptions, write_pages

    write_pages(gpt_report, PageOptions(folder=tmp_path))
    browser.get_log("browser")
    browser.get((tmp_path / "report.html").as_uri())
    wait_ready(browser)
    visible = ("return [...document.querySelectorAll('#graph-view svg')]"
               ".filter(s => s.style.display !== 'none')"
               ".map(s => [...s.querySelectorAll('g.node')].map(g => g.id))")
    block0 = _block_ids(gpt_report, "blocks.0")
    legends = ("return [...document.querySelectorAll('.legend')]"
               ".filter(l => l.offsetParent).map(l => l.dataset.graph)")
    (whole,) = browser.execute_script(visible)
    assert "b0" in whole and not any(i[0] == "n" and int(i[1:]) in block0 for i in whole)
    assert "b1" not in whole and browser.execute_script(legends) == ["whole"]
    click(browser, "#graph-view g.node[id='b0']")
    (shown,) = browser.execute_script(visible)
    ops = {int(i[1:]) for i in shown if i != "legend"}
    assert ops and ops <= block0                              # blocks.0's ops, drawn
    assert browser.execute_script(legends) == ["0"]           # with their own scale's legend
    assert browser.find_element("id", "graph-back").is_displayed()
    click(browser, "#graph-back")
    (again,) = browser.execute_script(visible)
    assert again == whole and not browser.find_element("id", "graph-back").is_displayed()
    assert browser.execute_script(legends) == ["whole"]
    assert console_errors(browser) == []


def _block_ids(report: Report, block: str) -> set[int]:
    return {n.id for n in report.nodes if n.module == block or n.module.startswith(block + ".")}
