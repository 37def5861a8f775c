"""The Markdown summary: compact, complete headline, escaped names."""

from __future__ import annotations

from fxlens.analyzer.core.report import Report
from fxlens.reports.markdown import render_markdown
from fxlens.reports.units import si


def test_headline_and_folded_details(gpt_report: Report) -> None:
    text = render_markdown(gpt_report)
    assert text.startswith("### fxlens · tiny\\_gpt")
    assert f"| forward FLOPs | {si(gpt_report.totals.flops, 'FLOP')}" in text
    assert "| activation peak |" in text and "| coverage | 100.0% (" in text
    # the top ops open (what a first screen shows when no section was asked about); leaf
    # modules and every section the report holds (memory, fusion) folded
    assert text.count("<details>") == text.count("</details>") == 3
    assert "<summary>Memory</summary>" in text and "<summary>Fusion</summary>" in text
    assert "#### Top ops" in text and "<summary>Top ops</summary>" not in text
    assert "blocks.\\*.mlp.0 ×2" in text          # the same leaf of each block, one row
    assert text.index("| activation peak |") < text.index("<details>")   # the answer first


def test_sections_appear_when_present(evil_report: Report) -> None:
    text = render_markdown(evil_report)
    assert "fusion findings (top 1 of 1" in text and "FUS001" in text
    assert "w8a8" in text
    # the section the run asked about opens first, under a heading; the others stay folded
    assert "#### Quantization" in text and "<summary>Quantization</summary>" not in text
    assert text.index("#### Quantization") < text.index("<summary>Fusion</summary>")


def test_markup_in_names_is_escaped(evil_report: Report) -> None:
    text = render_markdown(evil_report)
    assert "<script>" not in text and "<img" not in text and "<b>" not in text
    assert "&lt;script&gt;" in text
    # every row of a table has its header's cell count: no name's `|` opened a cell
    tables: list[set[int]] = [set()]
    for line in text.splitlines():
        if line.startswith("|"):
            tables[-1].add(line.count("|") - line.count("\\|"))
        elif tables[-1]:
            tables.append(set())
    assert all(len(counts) <= 1 for counts in tables)
