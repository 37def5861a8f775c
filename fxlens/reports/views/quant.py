"""View of the quantization section: layers most sensitive first, the plan, the risks.

dB figures are higher-is-safer; a layer ranks by its combined score when calibration ran (the
calibrated and data-free scores weighed by their uncertainties, `analyzer.quant.combine`),
else by its data-free score — the same score that gives the verdicts and sizes the plan. The
ranking column shows that score with its 95 % interval (``±``), and ``=`` before a rank marks
a layer tied with the one ranked first of its group (their intervals overlap). The notes say
what each score stands on (`Quant.data_free_evidence`, `calibrated_evidence`), which score
ranks and why, and the calibration's health (rows used, expected rank stability, rows for a
stable order). Reports written before issue 16 have no evidence nor a `score_metric` (their
scores are SQNR); before issue 35, no combined score: they rank by the calibrated one.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import (
    Quant,
    QuantCalibration,
    QuantLayer,
    QuantPlan,
    QuantRisk,
    QuantTask,
    TaskRun,
)
from fxlens.reports.units import binary_bytes, si
from fxlens.reports.view import Block, Cell, Column, Detail, Figure, Table, Tone, View
from fxlens.reports.views.quant_task import keeps_words, metric_change, task_run, task_table


def quant_view(report: Report, detail: Detail) -> View | None:
    top = detail.top
    section = report.get(Quant)
    if section is None:
        return None
    blocks: list[Block] = [layer_table(section, top, detail.full)]
    if section.task is not None:
        blocks.insert(0, task_table(section.task))
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


def _rank_key(row: QuantLayer, fmt: str) -> tuple[float, str]:
    for scores in (row.combined_score_db, row.calibrated_score_db, row.output_sqnr_db,
                   row.data_free_sqnr_db):
        if scores is not None and fmt in scores:
            value = scores[fmt]
            return (math.inf if value is None else float(value)), row.layer
    return math.inf, row.layer


def _metric_words(section: Quant) -> str:
    if section.calibration is None:
        return "KL" if section.score_metric == "kl" else "SQNR"
    metric = section.calibration.metric
    return ("KL of the softmax" if metric == "kl" else "top-1 flips" if metric == "agreement"
            else "output SQNR")


def _combined(section: Quant) -> bool:
    return any(r.combined_score_db is not None for r in section.layers)


def _ranked_by(section: Quant) -> str:
    """The score that ranks the layers and gives the verdicts, in words."""
    if section.calibration is None:
        return f"data-free {_metric_words(section)}"
    if not _combined(section) or section.calibration.prior_spread_db is None:
        return f"calibrated {_metric_words(section)}"
    return f"combined {_metric_words(section)}"


def _why(calibration: QuantCalibration, weight: bool = True) -> str:
    """Which score ranks and why: ``calibrated 16 rows ±5.0 dB vs data-free ±2.5 dB → leans
    on data-free`` (with `weight`, the median weight on the calibrated score after it)."""
    rows = (f"{calibration.examples} rows" if calibration.examples is not None
            else f"{calibration.batches} batches")
    if calibration.calibrated_error_db is None:
        return f"calibrated on {rows}, too few to size its uncertainty → calibrated alone"
    own = f"calibrated {rows} ±{calibration.calibrated_error_db:.1f} dB"
    if calibration.prior_spread_db is None:
        return (f"{own}; too few layers with both scores to size the data-free score's "
                "spread → calibrated alone")
    ranking = calibration.ranking or "calibrated"
    verdict = {"calibrated": "the calibrated score ranks",
               "data-free": "the data-free score ranks"}.get(ranking, ranking)
    return (f"{own} vs data-free ±{calibration.prior_spread_db:.1f} dB → {verdict}"
            + (f" (weight {calibration.calibrated_weight:.2f} on calibrated)"
               if weight and calibration.calibrated_weight is not None else ""))


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
        by = f"by {_ranked_by(section)}"
        if section.calibration is not None and _combined(section):
            by += f": {_why(section.calibration, weight=False)}"
        figures = [Figure(label, f"{ok} of {len(scored)} layers ok", " · ".join([*parts, by]),
                          Tone.GOOD if ok == len(scored) else Tone.WARN)]
    run = task_run(section.task, fmt) if section.task is not None else None
    if section.task is not None and run is not None:
        figures = [_in_task_terms(section.task, run, label, figures[0])]
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
        run = (task_run(section.task, f"plan {plan.name}") if section.task is not None
               else None)
        if section.task is not None and run is not None:
            detail += f" · {metric_change(section.task, run)}: {keeps_words(section.task, run)}"
            tone = tone if run.keeps else Tone.BAD
        figures.append(Figure(f"quantization plan ({plan.name})",
                              f"{plan.compression_ratio:.2f}× smaller", detail, tone))
    return tuple(figures)


def _in_task_terms(task: QuantTask, run: TaskRun, label: str, scores: Figure) -> Figure:
    """The format's verdict by the task's own metric, the per-layer scores after it (they
    say which layers to keep higher if the task's verdict is no)."""
    return Figure(f"{label} on every layer", metric_change(task, run),
                  f"{keeps_words(task, run)} · per-layer scores: {scores.value} "
                  f"({scores.detail})", Tone.GOOD if run.keeps else Tone.BAD)


def layer_table(section: Quant, top: int, full: bool = False) -> Table:
    """Layers most sensitive first: the verdicts, the score that ranks them (with its ± and
    ties when calibration ran) and the plan's format; `full` adds every score behind them
    (weight statistics, data-free and measured scores beside the ranking one, the weight on
    the calibrated score, activation outliers, risk codes)."""
    fmt = section.score_format
    calibrated = section.calibration is not None
    combined = _combined(section)
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
    columns += _score_columns(fmt, metric, calibrated, combined, full, _tied_above(ranked, fmt))
    if full and calibrated:
        columns.append((Column("act. outliers", right=True),
                        lambda r: str((r.activation or {}).get("outlier_channels", ""))))
    if full:
        columns.append((Column("risks"), lambda r: ", ".join(r.risks)))
    if section.plan is not None:
        columns.append((Column("plan", no_wrap=True), lambda r: r.precision or ""))
    rows = [[cell(row) for _, cell in columns] for row in ranked[:top]]
    status = section.status.replace("_", " ")
    caption = (f"{len(ranked)} layers ({status}); dB higher is safer; FORMAT? is the "
               f"verdict: ok, risky, or keep higher (QNT00n: a structural rule keeps "
               f"the layer at 8 bits); — not scored")
    if combined:
        caption += ("; score: the combined score ± its 95 % interval; =: tied with the "
                    "layer above (its interval overlaps that of its group's first layer)")
    if calibrated and metric == "agreement":
        caption += "; top-1 kept: rows whose top-1 class survives the format"
    return Table.of(f"quantization sensitivity · most sensitive first (by "
                    f"{_ranked_by(section)} at {fmt}, dB)",
                    [column for column, _ in columns], rows, caption=caption)


def _score_columns(fmt: str, metric: str, calibrated: bool, combined: bool, full: bool,
                   tied: Mapping[str, bool]
                   ) -> list[tuple[Column, Callable[[QuantLayer], str | Cell]]]:
    """The scores at `fmt`: the one that ranks on the first screen, all of them with `full`."""
    out: list[tuple[Column, Callable[[QuantLayer], str | Cell]]] = []
    if full or not calibrated:
        out.append((Column("data-free", right=True), lambda r: _scored(
            r, r.data_free_sqnr_db.get(fmt))))
    if calibrated and (full or (metric == "sqnr" and not combined)):
        out.append((Column("output", right=True),
                    lambda r: _db((r.output_sqnr_db or {}).get(fmt))))
    if calibrated and metric == "agreement":
        out.append((Column("top-1 kept", right=True), lambda r: _percent(
            (r.top1_agreement or {}).get(fmt))))
    if calibrated and combined and full:
        out += [(Column("calibrated", right=True), lambda r: _plus_minus(
                    r.calibrated_score_db, r.calibrated_error_db, fmt)),
                (Column("weight", right=True), lambda r: _weight(r, fmt))]
    elif calibrated and metric == "kl" and not combined:
        out.append((Column("kl", right=True),
                    lambda r: _db((r.calibrated_score_db or {}).get(fmt))))
    if combined:
        out.append((Column("score", right=True, no_wrap=not full), lambda r: _plus_minus(
            r.combined_score_db, r.combined_error_db, fmt) + (" =" if tied[r.layer] else "")))
    return out


def _tied_above(ranked: Sequence[QuantLayer], fmt: str) -> dict[str, bool]:
    """Per layer, whether it shares its rank (`QuantLayer.rank`) with the layer above."""
    out, above = {}, None
    for row in ranked:
        rank = (row.rank or {}).get(fmt)
        out[row.layer] = rank is not None and rank == above
        above = rank
    return out


def _plus_minus(scores: Mapping[str, float | None] | None,
                errors: Mapping[str, float | None] | None, fmt: str) -> str:
    if scores is None or fmt not in scores:
        return ""
    value = scores[fmt]
    if value is None:
        return "exact"
    error = (errors or {}).get(fmt)
    return f"{value:.1f}" + (f"±{error:.1f}" if error is not None else "")


def _weight(row: QuantLayer, fmt: str) -> str:
    value = (row.calibrated_weight or {}).get(fmt)
    return "" if value is None else f"{value:.2f}"


def _scored(row: QuantLayer, value: float | None) -> str | Cell:
    return _db(value) if row.status == "scored" else Cell("—", Tone.MUTED)


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"


def _notes(section: Quant) -> list[str]:
    """What each score stands on and what the scoring noticed, one note per line."""
    notes = [f"data-free: {section.data_free_evidence}"] if section.data_free_evidence else []
    if section.calibrated_evidence:
        notes.append(f"calibrated: {section.calibrated_evidence}")
    calibration = section.calibration
    if calibration is not None and _combined(section):
        notes.append(f"ranking: {_ranked_by(section)} — {_why(calibration)}; ± is the 95 % "
                     "interval over the calibration rows, relative to the other layers")
        notes.append(health_line(calibration))
    return notes + list(section.notes)


def health_line(calibration: QuantCalibration) -> str:
    """How many rows calibrated, whether more would reorder the layers, how many it takes."""
    rows = calibration.examples
    batches = f"{calibration.batches} batch{'es' * (calibration.batches != 1)}"
    head = (f"calibration health: {rows} rows in {batches}"
            if rows is not None else f"calibration health: {batches}")
    stability = calibration.rank_stability
    if stability is None:
        return head + "; too few rows or layers to tell how stable the order is"
    head += (f"; expected rank stability ρ {stability:.2f} against an unlimited calibration"
             + (f", the worst layer first in {calibration.worst_kept:.0%} of resamples"
                if calibration.worst_kept is not None else ""))
    # ρ ≥ 0.95 is `analyzer.quant.combine.STABLE_RHO`; None: not within 128× the rows
    needed = calibration.examples_for_stable
    if needed is not None and rows is not None and needed <= rows:
        return head + " — more rows would hardly change the order"
    if needed is None:
        return (head + " — more rows would reorder layers; not even 128× as many reach "
                "ρ 0.95 (layers this close stay tied)")
    return head + f" — more rows would reorder layers: about {needed} rows for ρ ≥ 0.95"


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
