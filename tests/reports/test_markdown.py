"""The Markdown summary: compact, complete headline, escaped names."""

from __future__ import annotations

from fxlens.analyzer.core.report import Report
from fxlens.reports.markdown import render_markdown
from fxlens.reports.units import si


def test_headline_and_folded_details(gpt_report: Report) -> None:
    text = render_markdown(gpt_report)
    assert text.startswith("### fxlens · tiny\\_gpt")
    assert f"| forward FLOPs | {si(gpt_report.totals.flops, 'FLOP')}" in text
    assert "| activation peak |" in text and "| coverage | 100.0% |" in text
    assert text.count("<details>") == text.count("</details>") == 3  # + fusion findings
    assert "blocks.\\*.mlp.0 ×2" in text          # the same leaf of each block, one row
    assert len(text.splitlines()) < 50  # 40 + the folded fusion findings


def test_sections_appear_when_present(evil_report: Report) -> None:
    text = render_markdown(evil_report)
    assert "1 fusion findings" in text and "FUS001" in text


def test_markup_in_names_is_escaped(evil_report: Report) -> None:
    text = render_markdown(evil_report)
    assert "<script>" not in text and "<img" not in text and "<b>" not in text
    assert "&lt;script&gt;" in text
    assert all(line.count("|") - line.count("\\|") in (0, 3, 5, 6)
               for line in text.splitlines() if line.startswith("|"))
