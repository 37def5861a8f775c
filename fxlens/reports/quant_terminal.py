"""Terminal tables for the ``quant`` section: most sensitive layers, the plan, the risks.

Pure: Report → rich renderables. Layers are ranked by their calibrated score at the section's
``score_format`` when there is one (output SQNR, or KL of the softmax for logits: the
calibration's ``metric``), else by the data-free score (lowest first).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Quant, QuantLayer, QuantPlan, QuantRisk
from fxlens.reports.units import binary_bytes, si


def quant_parts(report: Report, top: int = 10) -> list[RenderableType]:
    section = report.get(Quant)
    if section is None:
        return []
    parts: list[RenderableType] = [layer_table(section, top)]
    if section.plan is not None:
        parts.append(plan_table(section.plan))
    if section.risks:
        parts.append(risk_table(section.risks))
    return parts


def _db(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _stat(stats: Mapping[str, Any], key: str) -> str:
    value = stats.get(key)
    return _db(float(value)) if isinstance(value, (int, float)) else ""


def _rank_key(row: QuantLayer, fmt: str) -> float:
    for scores in (row.calibrated_score_db, row.output_sqnr_db, row.data_free_sqnr_db):
        value = (scores or {}).get(fmt)
        if value is not None:
            return float(value)
    return math.inf


def layer_table(section: Quant, top: int) -> Table:
    fmt = section.score_format
    calibrated = section.calibration is not None
    metric = section.calibration.metric if section.calibration is not None else "sqnr"
    rows = sorted(section.layers, key=lambda r: _rank_key(r, fmt))
    by = ("calibrated KL of the softmax" if metric == "kl" else "calibrated top-1 flips"
          if metric == "agreement" else "calibrated output SQNR") if calibrated else (
          "data-free SQNR")
    title = (f"quantization sensitivity · {section.status} · most sensitive first "
             f"(by {by} at {fmt}, dB)")
    table = Table(title=title, title_justify="left")
    shown = [f for f in section.formats if f == fmt or f.startswith("int4")]
    columns = ["layer", "params", "max/std", "kurt."] + [f"w {f}" for f in shown]
    measured = ["output"] + ([metric] if metric != "sqnr" else []) + ["act. outliers"]
    columns += ["score"] + (measured if calibrated else []) + ["risks"]
    if section.plan is not None:
        columns.append("plan")
    for name in columns:
        table.add_column(name, justify="left" if name in ("layer", "risks", "plan")
                         else "right", overflow="fold")
    for row in rows[:top]:
        cells = [row.layer or "(root)", si(row.params), _stat(row.stats, "max_over_std"),
                 _stat(row.stats, "kurtosis")]
        cells += [_db(row.weight_sqnr_db.get(f)) for f in shown]
        cells.append(_db(row.data_free_sqnr_db.get(fmt)) or row.status)
        if calibrated:
            cells.append(_db((row.output_sqnr_db or {}).get(fmt)))
            if metric != "sqnr":
                cells.append(_db((row.calibrated_score_db or {}).get(fmt)))
            cells.append(str((row.activation or {}).get("outlier_channels", "")))
        cells.append(", ".join(row.risks))
        if section.plan is not None:
            cells.append(row.precision or "")
        table.add_row(*cells)
    table.caption = " · ".join([f"{len(rows)} layers; SQNR higher is safer", *section.notes])
    return table


def plan_table(plan: QuantPlan) -> Table:
    table = Table(title=f"quantization plan · {plan.name} · activations {plan.activations}",
                  show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    counts: dict[str, int] = {}
    for fmt in plan.precision.values():
        counts[fmt] = counts.get(fmt, 0) + 1
    table.add_row("layers", ", ".join(f"{n} × {f}" for f, n in sorted(counts.items())))
    table.add_row("weight memory", f"{binary_bytes(plan.weight_bytes)} (from "
                  f"{binary_bytes(plan.original_bytes)}, scales included)")
    table.add_row("compression", f"{plan.compression_ratio:.2f}×")
    if plan.budget_bytes is not None:
        verdict = Text("fits", style="bold green") if plan.fits else Text(
            "does not fit", style="bold red")
        table.add_row(f"budget {binary_bytes(plan.budget_bytes)}", verdict)
    table.add_row("predicted output SQNR",
                  f"{_db(plan.predicted_output_sqnr_db) or '∞'} dB ({plan.basis})")
    return table


def risk_table(risks: Sequence[QuantRisk]) -> Table:
    table = Table(title="quantization risks (structure)", title_justify="left")
    for name in ("code", "layers", "why", "fix"):
        table.add_column(name)
    for risk in risks:
        layers = risk.layers
        shown = ", ".join(layers[:3]) + (f" … (+{len(layers) - 3})" if len(layers) > 3 else "")
        table.add_row(risk.code, shown, risk.message, risk.fix)
    return table
