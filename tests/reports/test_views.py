"""Every section the report holds is shown on every surface: terminal, HTML and Markdown render
the same views; the headline labels each number by what it counts."""

from __future__ import annotations

import io
import re

from rich.console import Console

from fxlens.analyzer.core.report import Report
from fxlens.reports.escape import markdown_escape
from fxlens.reports.html import render_html
from fxlens.reports.markdown import render_markdown
from fxlens.reports.terminal import render_terminal
from fxlens.reports.units import si
from fxlens.reports.view import Detail
from fxlens.reports.views import views
from fxlens.reports.views.headline import headline


def terminal_text(report: Report) -> str:
    console = Console(width=160, record=True, file=io.StringIO(), color_system=None)
    console.print(render_terminal(report, full=True))
    return console.export_text()


def test_every_view_on_every_surface(full_report: Report) -> None:
    shown = views(full_report, Detail(full=True))
    assert {v.key for v in shown} >= {"training", "kv-cache", "roofline", "fusion", "quant",
                                      "plan"}
    terminal = re.sub(r"\s+", "", terminal_text(full_report))   # titles wrap to table width
    page = render_html(full_report, None)
    markdown = render_markdown(full_report)
    for view in shown:
        for table in view.tables():
            assert re.sub(r"\s+", "", table.title) in terminal, table.title
        if view.key not in ("summary", "modules", "top-ops"):   # the page's own widgets
            assert f'<section id="{view.key}">' in page, view.key
            assert (f"<summary>{view.title}</summary>" in markdown
                    or f"#### {view.title}" in markdown), view.key


def test_training_headline_counts_the_step(full_report: Report) -> None:
    """Without a plan: the step on one device, its fit and time. With one, the plan's verdict
    speaks alone: no one-GPU fit or step time beside it, the step peak said unsharded."""
    import dataclasses

    single = dataclasses.replace(full_report, sections={
        k: v for k, v in full_report.sections.items() if k != "plan"})
    labels = {f.label: f for f in headline(single)}
    assert "training step FLOPs" in labels and "forward FLOPs" not in labels
    assert labels["fits 80GiB"].value == "yes"
    assert labels["estimated step time"].detail.startswith("h100")
    assert labels["training step peak"].detail.endswith(")")      # checkpointed, and without
    markdown = render_markdown(single)
    assert markdown.index("| training step peak |") < markdown.index("<details>")
    planned = {f.label for f in headline(full_report)}
    assert any(label.startswith("plan: ") for label in planned)
    assert not planned & {"fits 80GiB", "estimated step time", "training step peak"}
    assert "unsharded step peak" in planned


def test_verdicts_carry_their_tone_on_the_page(full_report: Report) -> None:
    page = render_html(full_report, None)
    assert re.search(r'class="[^"]*tone-good[^"]*">fits<', page)


def test_runs_of_blocks_are_one_row_with_their_totals(full_report: Report) -> None:
    from fxlens.reports.views.model import modules_view

    view = modules_view(full_report, Detail(depth=3))
    labels = [row[0].text.strip() for row in view.tables()[0].rows]
    blocks = next(m for m in full_report.modules if m.path == "blocks")
    assert "0–1 ×2" in labels and not any(label == "1" for label in labels)
    run = view.tables()[0].rows[labels.index("0–1 ×2")]
    assert run[3].text == si(blocks.flops)       # the run row counts both blocks


def test_findings_of_repeated_blocks_are_grouped(full_report: Report) -> None:
    from fxlens.analyzer.core.sections import Findings
    from fxlens.reports.views.fusion import grouped_findings

    items = full_report.require(Findings).items
    groups = grouped_findings(items)
    assert len(groups) < len(items)
    assert sum(g.saved_bytes for g in groups) == sum(f.saved_bytes for f in items)
    assert any("×2" in g.module for g in groups)
    # ×N counts the blocks a group is in; a block holding the finding twice says so
    for group in groups:
        match = re.search(r" ×(\d+)(?: \((\d+) findings\))?$", group.module)
        if match:
            members = [f for f in items if f.code == group.code and f.message == group.message
                       and re.sub(r"\.\d+(?=\.|$)", ".*", f.modules[0]) == group.module[
                           :match.start()]]
            assert len({f.modules[0] for f in members}) == int(match[1])
            assert len(members) == int(match[2] or match[1])


def test_the_first_screen_leaves_breakdowns_to_full(full_report: Report) -> None:
    short = {t.title for v in views(full_report) for t in v.tables()}
    full = {t.title for v in views(full_report, Detail(full=True)) for t in v.tables()}
    assert short < full
    assert any(title.startswith("training memory by module") for title in full - short)


def test_every_headline_number_reads_the_same_on_every_surface(full_report: Report) -> None:
    terminal = terminal_text(full_report)
    page, markdown = render_html(full_report, None), render_markdown(full_report)
    for figure in headline(full_report):
        assert f"| {markdown_escape(figure.label)} | {markdown_escape(figure.value)}" in (
            markdown), figure.label
        assert figure.value in terminal and figure.label in terminal, figure.label
        assert f'<div class="v">{figure.value}</div>' in page, figure.label


def test_one_fusion_saving_per_concept_in_headline_and_table(full_report: Report) -> None:
    """The findings' total and a compiler's default saving are two figures, each labelled
    and each the same where it appears (the summary once said 33.75 MiB "saveable" beside a
    fusion table saving 6.75 MiB, with nothing telling the two apart)."""
    from fxlens.analyzer.core.sections import Findings, Fusion
    from fxlens.reports.units import binary_bytes
    from fxlens.reports.views.fusion import default_saving, findings_saving

    found, fusion = full_report.require(Findings), full_report.require(Fusion)
    findings, default = binary_bytes(findings_saving(found)), binary_bytes(default_saving(fusion))
    assert findings != default
    figure = next(f for f in headline(full_report) if f.label == "fusion findings")
    assert f"saves {findings} of traffic" in figure.detail
    assert f"default fusion: {default}" in figure.detail
    table = next(t for v in views(full_report) for t in v.tables()
                 if t.title.startswith("fusion (predicted kernels"))
    assert f"default fusion saves {default}" in table.caption
    assert f"fixes save {findings} in all" in table.caption


def test_every_surface_opens_on_the_section_the_run_asked_about(full_report: Report) -> None:
    """With a plan (the first of `ASKED` this report holds), the page's second section and the
    comment's first open section are the plan, as on the terminal's first screen."""
    page = render_html(full_report, None)
    sections = re.findall(r'<section id="([^"]+)">', page)
    assert sections[:2] == ["summary", "plan"]
    markdown = render_markdown(full_report)
    assert "#### Plan (many GPUs)" in markdown
    assert markdown.index("#### Plan (many GPUs)") < markdown.index("<summary>Fusion</summary>")
    console = Console(width=160, record=True, file=io.StringIO(), color_system=None)
    console.print(render_terminal(full_report))
    first = console.export_text()
    assert "plan · " in first and "fusion findings (top" not in first
