"""View of the quantization section: layers most sensitive first, the plan, the risks.

dB figures are higher-is-safer; a layer ranks by its calibrated score when calibration ran,
else by its data-free score — the same score that gives the verdicts and sizes the plan. The
caption says what each score stands on (`Quant.data_free_evidence`, `calibrated_evidence`).
Reports written before issue 16 have neither, nor a `score_metric`: their scores are SQNR.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Quant, QuantLayer, QuantPlan, QuantRisk
from fxlens.reports.units import binary_bytes, si
from fxlens.reports.view import Block, Cell, Column, Detail, Figure, Table, Tone, View


def quant_view(report: Report, detail: Detail) -> View | None:
    top = detail.top
    section = report.get(Quant)
    if section is None:
        return None
    blocks: list[Block] = [layer_table(section, top, detail.full)]
    notes = _notes(section)
    if notes:
        blocks.append(Table.of("quantization scores: what each stands on", (Column("note"),),
                               [(note,) for note in notes]))
    if section.plan is not None:
        blocks.append(plan_table(section.plan, section.score_metric or "sqnr"))
    if section.risks:
        blocks.append(risk_table(section.risks))
    return View("quant", "Quantization", tuple(blocks))


def _db(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _stat(stats: Mapping[str, Any], key: str) -> str:
    value = stats.get(key)
    return _db(float(value)) if isinstance(value, (int, float)) else ""


# the formats users ask "can this layer go to X?" about (int4 at any group size)
VERDICT_FORMATS = ("int8_per_channel", "fp8", "int4")
TONES = {"ok": Tone.GOOD, "risky": Tone.WARN, "keep higher": Tone.BAD}


def _short(fmt: str) -> str:
    return fmt.split("_")[0]


def _bits(fmt: str) -> int:
    """The bits of a format by its name (``int4_g128`` → 4, ``fp8_e4m3`` → 8)."""
    found = re.search(r"\d+", fmt)
    return int(found.group()) if found else 16


def _kept_by(row: QuantLayer, fmt: str) -> tuple[str, ...]:
    """The structural rules behind `row`'s verdict at `fmt`: they keep it at 8 bits or more."""
    return row.kept_by if _bits(fmt) < 8 and row.verdicts.get(fmt) == "keep higher" else ()


def _verdict(row: QuantLayer, fmt: str) -> Cell:
    text = row.verdicts.get(fmt, "")
    if text == "unscored":
        return Cell("—", Tone.MUTED)
    rules = _kept_by(row, fmt)
    tail = ((f" ({', '.join(rules)})", Tone.MUTED),) if rules else ()
    return Cell(text, TONES.get(text, Tone.MUTED), tail)


def _rank_key(row: QuantLayer, fmt: str) -> float:
    for scores in (row.calibrated_score_db, row.output_sqnr_db, row.data_free_sqnr_db):
        value = (scores or {}).get(fmt)
        if value is not None:
            return float(value)
    return math.inf


def _ranked_by(section: Quant) -> str:
    """The score that ranks the layers and gives the verdicts, in words."""
    if section.calibration is None:
        return "data-free KL" if section.score_metric == "kl" else "data-free SQNR"
    metric = section.calibration.metric
    return ("calibrated KL of the softmax" if metric == "kl" else "calibrated top-1 flips"
            if metric == "agreement" else "calibrated output SQNR")


# why no layer has a verdict, by the section's status
UNSCORED = {
    "random_init": "the weights look like random initialisation: load trained weights to "
                   "score the layers",
    "meta": "the weights are not loaded (meta device): load them to score the layers",
}


def _names(names: Sequence[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f" +{len(names) - shown}" if len(names) > shown else "")


def quant_verdicts(section: Quant) -> tuple[Figure, ...]:
    """The first screen's answer to "can it go to int4?" (the section's 4-bit format, else its
    score format): how many layers can, which are risky or to keep higher, most sensitive
    first; then the plan's size and predicted damage."""
    fmt = next((f for f in section.formats if f.startswith("int4")), section.score_format)
    scored = [r for r in sorted(section.layers, key=lambda r: _rank_key(r, fmt))
              if r.status == "scored"]
    by_verdict = {v: [r.layer or "(root)" for r in scored if r.verdicts.get(fmt) == v]
                  for v in ("ok", "risky", "keep higher")}
    label = f"{fmt} weights"
    if not scored:
        figures = [Figure(label, "not scored", UNSCORED.get(
            section.status, f"no layer could be scored ({section.status}): see the "
                            "quantization notes"), Tone.WARN)]
    else:
        parts = [f"{v}: {_names(by_verdict[v])}" for v in ("keep higher", "risky")
                 if by_verdict[v]]
        kept = sorted({code for r in scored for code in _kept_by(r, fmt)})
        if kept:
            parts.append(f"kept at 8 bits by the structural rule{'s' * (len(kept) > 1)} "
                         f"{', '.join(kept)} whatever their score")
        if len(scored) < len(section.layers):
            parts.append(f"{len(section.layers) - len(scored)} unscored")
        ok = len(by_verdict["ok"])
        figures = [Figure(label, f"{ok} of {len(scored)} layers ok",
                          " · ".join([*parts, f"by {_ranked_by(section)}"]),
                          Tone.GOOD if ok == len(scored) else Tone.WARN)]
    plan = section.plan
    if plan is not None:
        what, value = _predicted(plan, section.score_metric or "sqnr")
        detail = (f"{binary_bytes(plan.weight_bytes)} of weights (from "
                  f"{binary_bytes(plan.original_bytes)}) · {_plan_layers(plan)} · {what} "
                  f"{value}")
        if plan.budget_bytes is not None:
            detail += (f" · {'fits' if plan.fits else 'does not fit'} the budget of "
                       f"{binary_bytes(plan.budget_bytes)}")
        tone = Tone.STRONG if plan.fits is None else Tone.GOOD if plan.fits else Tone.BAD
        figures.append(Figure(f"quantization plan ({plan.name})",
                              f"{plan.compression_ratio:.2f}× smaller", detail, tone))
    return tuple(figures)


def layer_table(section: Quant, top: int, full: bool = False) -> Table:
    """Layers most sensitive first: the verdicts, the score that ranks them and the plan's
    format; `full` adds every score behind them (weight statistics, data-free and measured
    scores beside the ranking one, activation outliers, risk codes)."""
    fmt = section.score_format
    calibrated = section.calibration is not None
    metric = section.calibration.metric if section.calibration is not None else "sqnr"
    ranked = sorted(section.layers, key=lambda r: _rank_key(r, fmt))
    shown = [f for f in section.formats if f == fmt or f.startswith("int4")]
    verdict_formats = [f for f in section.formats if f.startswith(VERDICT_FORMATS)] or shown
    columns: list[tuple[Column, Callable[[QuantLayer], str | Cell]]] = [
        (Column("layer"), lambda r: r.layer or "(root)"),
        (Column("params", right=True), lambda r: si(r.params)),
        *((Column(f"{_short(f)}?"), functools.partial(_verdict, fmt=f))
          for f in verdict_formats)]
    if full:
        columns += [(Column("max/std", right=True), lambda r: _stat(r.stats, "max_over_std")),
                    (Column("kurt.", right=True), lambda r: _stat(r.stats, "kurtosis")),
                    *((Column(f"w {f}", right=True),
                       functools.partial(lambda r, f: _db(r.weight_sqnr_db.get(f)), f=f))
                      for f in shown)]
    if full or not calibrated:
        columns.append((Column("data-free", right=True), lambda r: _scored(
            r, r.data_free_sqnr_db.get(fmt))))
    if calibrated and (full or metric == "sqnr"):
        columns.append((Column("output", right=True),
                        lambda r: _db((r.output_sqnr_db or {}).get(fmt))))
    if calibrated and metric == "agreement":
        columns.append((Column("top-1 kept", right=True), lambda r: _percent(
            (r.top1_agreement or {}).get(fmt))))
    elif calibrated and metric == "kl":
        columns.append((Column("kl", right=True),
                        lambda r: _db((r.calibrated_score_db or {}).get(fmt))))
    if full and calibrated:
        columns.append((Column("act. outliers", right=True),
                        lambda r: str((r.activation or {}).get("outlier_channels", ""))))
    if full:
        columns.append((Column("risks"), lambda r: ", ".join(r.risks)))
    if section.plan is not None:
        columns.append((Column("plan"), lambda r: r.precision or ""))
    rows = [[cell(row) for _, cell in columns] for row in ranked[:top]]
    status = section.status.replace("_", " ")
    caption = (f"{len(ranked)} layers ({status}); dB higher is safer; FORMAT? is the "
               f"verdict: ok, risky, or keep higher (QNT00n: a structural rule keeps "
               f"the layer at 8 bits); — not scored")
    if calibrated and metric == "agreement":
        caption += "; top-1 kept: rows whose top-1 class survives the format"
    return Table.of(f"quantization sensitivity · most sensitive first (by "
                    f"{_ranked_by(section)} at {fmt}, dB)",
                    [column for column, _ in columns], rows, caption=caption)


def _scored(row: QuantLayer, value: float | None) -> str | Cell:
    return _db(value) if row.status == "scored" else Cell("—", Tone.MUTED)


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"


def _notes(section: Quant) -> list[str]:
    """What each score stands on and what the scoring noticed, one note per line."""
    notes = [f"data-free: {section.data_free_evidence}"] if section.data_free_evidence else []
    if section.calibrated_evidence:
        notes.append(f"calibrated: {section.calibrated_evidence}")
    return notes + list(section.notes)


def _plan_layers(plan: QuantPlan) -> str:
    """``4 × fp8_e4m3, 6 × int4_g128``: how many layers the plan puts at each format."""
    counts: dict[str, int] = {}
    for fmt in plan.precision.values():
        counts[fmt] = counts.get(fmt, 0) + 1
    return ", ".join(f"{n} × {f}" for f, n in sorted(counts.items()))


METRIC_COLUMNS = {"kl": "kl", "agreement": "top-1 kept"}


def _predicted(plan: QuantPlan, metric: str) -> tuple[str, str]:
    """(what, value) of the plan's predicted damage, in the unit of the score that sized it:
    its figure is −10·log10 of the summed damage (None: no damage at all)."""
    predicted = plan.predicted_output_sqnr_db
    damage = None if predicted is None else 10 ** (-predicted / 10)
    if metric == "kl":
        kl = "0" if damage is None else f"{damage:.2g}"
        return "predicted KL", f"{kl} nats per row ({plan.basis})"
    if metric == "agreement":
        flips = "none" if damage is None else f"{damage:.2%}"
        return "predicted top-1 flips", f"{flips} of rows ({plan.basis})"
    return "predicted output SQNR", (f"exact, no error ({plan.basis})" if predicted is None
                                     else f"{_db(predicted)} dB ({plan.basis})")


def plan_table(plan: QuantPlan, metric: str = "sqnr") -> Table:
    rows: list[tuple[str, str | Cell]] = [
        ("layers", _plan_layers(plan)),
        ("weight memory", f"{binary_bytes(plan.weight_bytes)} (from "
                          f"{binary_bytes(plan.original_bytes)}, scales included)"),
        ("compression", f"{plan.compression_ratio:.2f}×")]
    if plan.budget_bytes is not None:
        verdict = Cell("fits", Tone.GOOD) if plan.fits else Cell("does not fit", Tone.BAD)
        rows.append((f"budget {binary_bytes(plan.budget_bytes)}", verdict))
    rows.append(_predicted(plan, metric))
    return Table.of(f"quantization plan · {plan.name} · activations {plan.activations}",
                    (Column("", strong=True), Column("", right=True)), rows, show_header=False)


def risk_table(risks: Sequence[QuantRisk]) -> Table:
    rows = []
    for risk in risks:
        layers = risk.layers
        shown = ", ".join(layers[:3]) + (f" … (+{len(layers) - 3})" if len(layers) > 3 else "")
        rows.append((risk.code, shown, risk.message, risk.fix))
    return Table.of("quantization risks (structure)",
                    tuple(Column(n) for n in ("code", "layers", "why", "fix")), rows)
