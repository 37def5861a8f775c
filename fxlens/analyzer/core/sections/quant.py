"""Quantization sensitivity, calibration, the plan and the task's metrics (``quant``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fxlens.analyzer.core.codec import optional
from fxlens.analyzer.core.section import Section, section


@dataclass(frozen=True)
class QuantCalibration:
    batches: int
    source: str
    activations: bool
    metric: str
    logit_leaves: int
    # issue 35 (`quant.combine`): the calibration examples the bootstrap resampled; which
    # score ranks ("calibrated", "data-free", "leans on calibrated", "leans on data-free")
    # and the median weight on the calibrated one at the score format; the median ± (95 %) of
    # the calibrated scores there and the data-free score's own ± around the measurements
    # (None: too few pairs to size it); the expected Spearman ρ of the calibrated order
    # against an unlimited calibration's, the share of resamples keeping its worst layer,
    # and the examples for ρ ≥ 0.95 (None with a stability: more than 128× as many)
    examples: int | None = optional()
    ranking: str | None = optional()
    calibrated_weight: float | None = optional()
    calibrated_error_db: float | None = optional()
    prior_spread_db: float | None = optional()
    rank_stability: float | None = optional()
    worst_kept: float | None = optional()
    examples_for_stable: int | None = optional()


@dataclass(frozen=True)
class QuantLayer:
    """One quantizable layer; dB figures are higher-is-safer, None for an exact format."""

    layer: str
    type: str
    params: int
    status: str
    reason: str | None
    stats: Mapping[str, Any]
    weight_sqnr_db: Mapping[str, float | None]
    data_free_sqnr_db: Mapping[str, float | None]
    risks: tuple[str, ...]
    risk_details: Mapping[str, str]
    output_sqnr_db: Mapping[str, float | None] | None = optional()
    # nats per logit row, its top 1 % of rows capped (`quant.calibrated.tail_capped_mean`)
    output_kl: Mapping[str, float] | None = optional()
    top1_agreement: Mapping[str, float] | None = optional()
    calibrated_score_db: Mapping[str, float | None] | None = optional()
    activation: Mapping[str, Any] | None = optional()
    precision: str | None = optional()
    # per format: "ok", "risky", "keep higher" or "unscored" (see `quant.section.verdicts`)
    verdicts: Mapping[str, str] = field(default_factory=dict)
    # issue 16: ½·Σ F_ii·Δw_i² per format on the calibration data (`quant.fisher`), and on
    # synthetic inputs (data-free); per format "measured" or "fisher" behind the calibrated
    # score; the batch norm folded into the weight before scoring
    fisher_damage: Mapping[str, float] | None = optional()
    data_free_fisher: Mapping[str, float] | None = optional()
    calibrated_evidence: Mapping[str, str] | None = optional()
    folded_into: str | None = optional()
    # the structural rules (risk codes) that keep this layer at 8 bits or more, whatever its
    # score: its "keep higher" under 8 bits is theirs (`quant.section.verdicts`)
    kept_by: tuple[str, ...] = ()
    # issue 35 (`quant.combine`): ± (95 %) of the calibrated score over the calibration
    # examples; the combined score that ranks, gives the verdicts and sizes the plan, its ±
    # and the weight it gives the calibrated score; per format the rank, 1 = most sensitive
    # (layers whose intervals overlap share it: tied)
    calibrated_error_db: Mapping[str, float | None] | None = optional()
    combined_score_db: Mapping[str, float | None] | None = optional()
    combined_error_db: Mapping[str, float | None] | None = optional()
    calibrated_weight: Mapping[str, float] | None = optional()
    rank: Mapping[str, int] | None = optional()


@dataclass(frozen=True)
class QuantRisk:
    code: str
    layers: tuple[str, ...]
    message: str
    fix: str


@dataclass(frozen=True)
class QuantPlan:
    name: str
    activations: str
    weight_bytes: int
    original_bytes: int
    compression_ratio: float
    budget_bytes: int | None
    fits: bool | None
    predicted_output_sqnr_db: float | None
    basis: str
    precision: Mapping[str, str]


@dataclass(frozen=True)
class TaskRun:
    """The model file's ``evaluate(model)`` on the model with `weights` quantized: a format on
    every layer, or a plan ("plan w4a16"); `keeps`: every metric within the tolerance."""

    weights: str
    layers: str                     # "every layer" or "the plan's formats"
    activations: str | None         # "int8", "fp8"; None: left unquantized
    values: Mapping[str, float]
    keeps: bool


def metric_lost(before: float, after: float | None, lower_is_better: bool,
                tolerance: float) -> bool:
    """Whether a metric of ``evaluate()`` moved from `before` to `after` (None: not returned)
    by more than `tolerance` of |before| in its worse direction: the one rule that decides
    a `TaskRun`'s `keeps` and names what it lost."""
    if after is None:
        return True
    worse = after - before if lower_is_better else before - after
    return worse > tolerance * abs(before)


@dataclass(frozen=True)
class QuantTask:
    """Quantization in the task's terms (`fxlens.analyzer.quant.task`): the metrics
    ``evaluate(model)`` returns, on the model as it is and quantized."""

    original: Mapping[str, float]
    lower_is_better: tuple[str, ...]     # metric names read as lower-is-better (loss, ppl)
    tolerance: float                     # relative: 0.01 keeps within 1 % of the original
    runs: tuple[TaskRun, ...]


@section("quant")
@dataclass(frozen=True)
class Quant(Section):
    """Per-layer quantization sensitivity (see `fxlens.analyzer.quant.section`)."""

    status: str
    notes: tuple[str, ...]
    formats: tuple[str, ...]
    score_format: str
    calibration: QuantCalibration | None
    layers: tuple[QuantLayer, ...]
    risks: tuple[QuantRisk, ...]
    plan: QuantPlan | None
    # what the data-free and calibrated scores stand on, in words; the unit of the scores
    # that rank, give verdicts and size the plan: "sqnr" (output SQNR) or "kl" (−10·log10 KL)
    data_free_evidence: str | None = optional()
    calibrated_evidence: str | None = optional()
    score_metric: str | None = optional()
    task: QuantTask | None = optional()     # the model file's evaluate(), where it has one
