"""The section's ranking: the calibrated and data-free scores combined into the one score that
ranks (`fxlens.analyzer.quant.combine`), written onto the section's rows, and the calibration
record that says which score ranks, why, and how healthy the calibration is.

Figures: dB rounded to 3 decimals (None where not finite: an exact format, or an uncertainty
that could not be sized), weights to 4.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace

from fxlens.analyzer.core.sections import QuantCalibration, QuantLayer
from fxlens.analyzer.quant.calibrated import Calibration
from fxlens.analyzer.quant.combine import Combination, Z, combine, describe
from fxlens.analyzer.quant.samples import bootstrap
from fxlens.analyzer.quant.weights import DataFree


def rounded_db(values: Mapping[str, float]) -> dict[str, float | None]:
    """dB figures as the report writes them: 3 decimals, None where not finite."""
    return {k: (round(v, 3) if math.isfinite(v) else None) for k, v in values.items()}


def combined(calibration: Calibration, free: Mapping[str, DataFree], score_format: str
             ) -> Combination:
    """The calibrated and data-free scores in one (`quant.combine`); a layer the data-free
    score could not score (random-looking or meta weights) keeps its calibrated score."""
    scored = {name for name, f in free.items() if f.status == "scored"}
    fisher = calibration.fisher
    spread = bootstrap(calibration.samples) if calibration.samples is not None else None
    return combine(
        calibration.score_db, calibration.evidence,
        {k: {fmt: math.inf if v is None else v for fmt, v in free[k].score_db.items()}
         for k in scored},
        {k: {fmt: fisher.score_db(k, fmt) for fmt in v} for k, v in fisher.damage.items()}
        if fisher is not None else {},
        spread, score_format)


def with_combined(row: QuantLayer, combination: Combination) -> QuantLayer:
    name = row.layer
    if name not in combination.score_db:
        return row
    return replace(
        row, combined_score_db=rounded_db(combination.score_db[name]),
        combined_error_db=rounded_db(combination.error_db.get(name, {})),
        calibrated_error_db=rounded_db(combination.calibrated_error_db.get(name, {})),
        calibrated_weight={k: round(v, 4) for k, v in combination.weight[name].items()},
        rank=dict(combination.rank.get(name, {})) or None)


def calibration_info(calibration: Calibration, combination: Combination | None,
                     rows: Sequence[QuantLayer], fmt: str, source: str, activations: bool
                     ) -> QuantCalibration:
    """The section's calibration record: what ran, which score ranks, and its health."""
    weights = [r.calibrated_weight[fmt] for r in rows
               if r.calibrated_weight and fmt in r.calibrated_weight]
    errors = [e for r in rows if r.calibrated_error_db
              and (e := r.calibrated_error_db.get(fmt)) is not None]
    health = combination.health if combination is not None else None
    spread = combination.prior_spread_db if combination is not None else None
    return QuantCalibration(
        batches=calibration.batches, source=source, activations=activations,
        metric=calibration.metric,
        logit_leaves=calibration.logit_leaves,
        examples=calibration.samples.examples if calibration.samples is not None else None,
        ranking=describe(weights) if weights else "calibrated",
        calibrated_weight=round(statistics.median(weights), 4) if weights else None,
        calibrated_error_db=round(statistics.median(errors), 3) if errors else None,
        prior_spread_db=None if spread is None else round(Z * spread, 3),
        rank_stability=health.rank_stability if health else None,
        worst_kept=health.worst_kept if health else None,
        examples_for_stable=health.examples_for_stable if health else None)
