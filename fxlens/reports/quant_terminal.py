"""Terminal tables for the ``quant`` section: most sensitive layers, the plan, the risks.

Pure: Report → rich renderables. Layers are ranked by their calibrated score at the section's
``score_format`` when there is one (output SQNR, or KL of the softmax for logits: the
calibration's ``metric``), else by the data-free score (lowest first).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from fxlens.analyzer.core.report import Report
from fxlens.reports.units import binary_bytes, si


def quant_parts(report: Report, top: int = 10) -> list[RenderableType]:
    section = report.sections.get("quant")
    if not isinstance(section, Mapping) or not isinstance(section.get("layers"), list):
        return []
    parts: list[RenderableType] = [layer_table(section, top)]
    if isinstance(section.get("plan"), Mapping):
        parts.append(plan_table(section["plan"]))
    if section.get("risks"):
        parts.append(risk_table(section["risks"]))
    return parts


def _db(value: Any) -> str:
    return "" if not isinstance(value, (int, float)) else f"{value:.1f}"


def _rank_key(row: Mapping[str, Any], fmt: str) -> float:
    for key in ("calibrated_score_db", "output_sqnr_db", "data_free_sqnr_db"):
        value = (row.get(key) or {}).get(fmt)
        if isinstance(value, (int, float)):
            return float(value)
    return math.inf


def layer_table(section: Mapping[str, Any], top: int) -> Table:
    fmt = str(section.get("score_format", ""))
    formats = [str(f) for f in section.get("formats", [])]
    calibration = section.get("calibration")
    calibrated = calibration is not None
    metric = str((calibration or {}).get("metric", "sqnr"))
    rows = sorted(section["layers"], key=lambda r: _rank_key(r, fmt))
    by = ("calibrated KL of the softmax" if metric == "kl" else "calibrated top-1 flips"
          if metric == "agreement" else "calibrated output SQNR") if calibrated else (
          "data-free SQNR")
    title = (f"quantization sensitivity · {section.get('status')} · most sensitive first "
             f"(by {by} at {fmt}, dB)")
    table = Table(title=title, title_justify="left")
    shown = [f for f in formats if f == fmt or f.startswith("int4")]
    columns = ["layer", "params", "max/std", "kurt."] + [f"w {f}" for f in shown]
    measured = ["output"] + ([metric] if metric != "sqnr" else []) + ["act. outliers"]
    columns += ["score"] + (measured if calibrated else []) + ["risks"]
    if section.get("plan"):
        columns.append("plan")
    for name in columns:
        table.add_column(name, justify="left" if name in ("layer", "risks", "plan")
                         else "right", overflow="fold")
    for row in rows[:top]:
        stats = row.get("stats") or {}
        cells = [row["layer"] or "(root)", si(row.get("params", 0)),
                 _db(stats.get("max_over_std")), _db(stats.get("kurtosis"))]
        cells += [_db((row.get("weight_sqnr_db") or {}).get(f)) for f in shown]
        cells.append(_db((row.get("data_free_sqnr_db") or {}).get(fmt))
                     or row.get("status", ""))
        if calibrated:
            act = row.get("activation") or {}
            cells.append(_db((row.get("output_sqnr_db") or {}).get(fmt)))
            if metric != "sqnr":
                cells.append(_db((row.get("calibrated_score_db") or {}).get(fmt)))
            cells.append(str(act.get("outlier_channels", "")))
        cells.append(", ".join(row.get("risks", [])))
        if section.get("plan"):
            cells.append(str(row.get("precision") or ""))
        table.add_row(*cells)
    notes = [str(n) for n in section.get("notes", [])]
    table.caption = " · ".join([f"{len(rows)} layers; SQNR higher is safer", *notes])
    return table


def plan_table(plan: Mapping[str, Any]) -> Table:
    table = Table(title=f"quantization plan · {plan.get('name')} · activations "
                        f"{plan.get('activations')}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    counts: dict[str, int] = {}
    for fmt in (plan.get("precision") or {}).values():
        counts[fmt] = counts.get(fmt, 0) + 1
    table.add_row("layers", ", ".join(f"{n} × {f}" for f, n in sorted(counts.items())))
    table.add_row("weight memory", f"{binary_bytes(plan['weight_bytes'])} (from "
                  f"{binary_bytes(plan['original_bytes'])}, scales included)")
    table.add_row("compression", f"{plan['compression_ratio']:.2f}×")
    if plan.get("budget_bytes") is not None:
        verdict = Text("fits", style="bold green") if plan.get("fits") else Text(
            "does not fit", style="bold red")
        table.add_row(f"budget {binary_bytes(plan['budget_bytes'])}", verdict)
    table.add_row("predicted output SQNR",
                  f"{_db(plan.get('predicted_output_sqnr_db')) or '∞'} dB ({plan.get('basis')})")
    return table


def risk_table(risks: list[Mapping[str, Any]]) -> Table:
    table = Table(title="quantization risks (structure)", title_justify="left")
    for name in ("code", "layers", "why", "fix"):
        table.add_column(name)
    for risk in risks:
        layers = list(risk.get("layers", []))
        shown = ", ".join(layers[:3]) + (f" … (+{len(layers) - 3})" if len(layers) > 3 else "")
        table.add_row(str(risk.get("code")), shown, str(risk.get("message", "")),
                      str(risk.get("fix", "")))
    return table
