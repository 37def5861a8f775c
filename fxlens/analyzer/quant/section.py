"""The report's ``quant`` section: data-free scores, structure, calibration and the plan joined.

The section's shape is `fxlens.analyzer.core.sections.Quant` (rows: `QuantLayer`).

dB figures are higher-is-safer. ``calibrated_score_db`` is the damage measure the calibration
``metric`` names (`fxlens.analyzer.quant.calibrated`): the output SQNR (``sqnr``), or for a
model returning logits ``−10·log10(KL)`` (``kl``, the ``auto`` choice) or the top-1 flip rate in
dB (``agreement``); it is what ranks the layers. ``output_kl`` and ``top1_agreement`` are
present only when the outputs hold logits. The plan keeps using the output SQNR (its
thresholds are SQNR). Non-finite values (an exact format) are written as None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from fxlens.analyzer.core.graph import Graph
from fxlens.analyzer.core.sections import Quant, QuantCalibration, QuantLayer, QuantPlan, QuantRisk
from fxlens.analyzer.quant.calibrated import Calibration, Inputs, calibrate
from fxlens.analyzer.quant.plan import PlanLayer, make_plan
from fxlens.analyzer.quant.types import LayerView, PlanRequest, QuantKnowledge, Risk
from fxlens.analyzer.quant.weights import (
    DataFree,
    Layer,
    data_free,
    find_layers,
    layer_views,
)

# NB: a KL (nats) below this for the worst layer at every format is indistinguishable from
# rounding noise in the logits.
KL_NEAR_ZERO = 1e-6


@dataclass(frozen=True)
class QuantSettings:
    calibration: Iterable[Inputs] | None = None     # None: data-free only
    calibration_source: str = ""
    activations: bool = False
    score_format: str = "int8_per_tensor"           # the format `score_db` columns rank by
    metric: str = "auto"                            # calibrated ranking: auto|sqnr|kl|agreement
    plan: PlanRequest | None = None


def quant_section(module: nn.Module, graph: Graph, knowledge: QuantKnowledge,
                  settings: QuantSettings, on_step: Callable[[str], None] = lambda _: None
                  ) -> Quant:
    layers = find_layers(module, knowledge)
    on_step("quantization: reading the graph around each layer")
    views = layer_views(graph, layers, knowledge)
    calibration = None
    if settings.calibration is not None:
        calibration = calibrate(module, layers, settings.calibration, knowledge,
                                settings.activations, on_step, settings.metric)
        views = {k: replace(v, residual_max_over_std=_out_ratio(calibration, k))
                 for k, v in views.items()}
    risks = {layer.name: knowledge.risks(views[layer.name]) for layer in layers}
    on_step("quantization: scoring weights")
    free = {layer.name: data_free(layer, risks[layer.name], knowledge) for layer in layers}
    plan = None
    if settings.plan is not None:
        plan = _plan(module, layers, free, calibration, knowledge, settings.plan, risks)
    rows = tuple(replace(row, verdicts=verdicts(row, knowledge))
                 for row in (_row(layer, free[layer.name], risks[layer.name], calibration, plan)
                             for layer in layers))
    return Quant(
        status=_status([f.status for f in free.values()]),
        notes=tuple(_notes(free, layers, views) + _unscored(module, layers)
                    + _calibration_health(calibration)),
        formats=tuple(knowledge.formats), score_format=settings.score_format,
        calibration=None if calibration is None else QuantCalibration(
            batches=calibration.batches, source=settings.calibration_source,
            activations=settings.activations, metric=calibration.metric,
            logit_leaves=calibration.logit_leaves),
        layers=rows, risks=_risk_list(risks), plan=plan,
    )


def _out_ratio(calibration: Calibration, name: str) -> float | None:
    stats = calibration.activations.get(name)
    return stats.output_max_over_std if stats else None


def _db(values: Mapping[str, float]) -> dict[str, float | None]:
    return {k: (round(v, 3) if math.isfinite(v) else None) for k, v in values.items()}


def _rounded(values: Mapping[str, float]) -> dict[str, float]:
    return {k: float(f"{v:.4g}") for k, v in values.items()}


def _row(layer: Layer, free: DataFree, risks: Sequence[Risk], calibration: Calibration | None,
         plan: QuantPlan | None) -> QuantLayer:
    row = QuantLayer(
        layer=layer.name, type=layer.module_type, params=layer.weight.numel(),
        status=free.status, reason=free.reason,
        stats={k: (round(v, 4) if isinstance(v, float) else v)
               for k, v in asdict(free.stats).items()} if free.stats else {},
        weight_sqnr_db=_db(free.weight_sqnr_db), data_free_sqnr_db=_db(free.score_db),
        risks=tuple(r.code for r in risks),
        risk_details={r.code: r.detail for r in risks if r.detail},
        precision=plan.precision.get(layer.name) if plan is not None else None,
    )
    if calibration is None:
        return row
    stats = calibration.activations.get(layer.name)
    logits = bool(calibration.logit_leaves)
    return replace(
        row,
        output_sqnr_db=_db(calibration.output_sqnr_db.get(layer.name, {})),
        output_kl=_rounded(calibration.output_kl.get(layer.name, {})) if logits else None,
        top1_agreement=(_rounded(calibration.top1_agreement.get(layer.name, {}))
                        if logits else None),
        calibrated_score_db=_db(calibration.score_db.get(layer.name, {})),
        activation={k: round(v, 4) if isinstance(v, float) else v
                    for k, v in asdict(stats).items()} if stats else {},
    )


def verdicts(row: QuantLayer, knowledge: QuantKnowledge) -> dict[str, str]:
    """Per format, can this layer go there: "ok" at an SQNR of at least ``verdict_db[0]``,
    "risky" down to ``verdict_db[1]``, else "keep higher"; a format under 8 bits is "keep
    higher" for a layer whose structural risks say to keep it at 8 bits. The SQNR is the
    measured output SQNR when calibrated, else the data-free score."""
    ok_db, risky_db = knowledge.verdict_db
    scores = row.output_sqnr_db if row.output_sqnr_db is not None else row.data_free_sqnr_db
    keep = bool(set(row.risks) & knowledge.keep_8_bits)
    out = {}
    for name, fmt in knowledge.formats.items():
        db = scores.get(name, math.nan) if row.status == "scored" else math.nan
        if keep and fmt.bits < 8:
            out[name] = "keep higher"
        elif db is None or db >= ok_db:
            out[name] = "ok"       # None: exact (no error at all)
        elif math.isnan(db):
            out[name] = "unscored"
        else:
            out[name] = "risky" if db >= risky_db else "keep higher"
    return out


def _status(statuses: list[str]) -> str:
    kinds = set(statuses)
    if not kinds or kinds == {"scored"}:
        return "scored"
    if len(kinds) == 1:
        return kinds.pop()
    return "partly_scored"


def _notes(free: Mapping[str, DataFree], layers: Sequence[Layer],
           views: Mapping[str, LayerView]) -> list[str]:
    notes = []
    counts = {s: sum(f.status == s for f in free.values()) for s in ("meta", "random_init")}
    if counts["meta"]:
        notes.append(f"{counts['meta']} layer(s) have no weights (meta device): no data-free "
                     "scores; load real weights to score them")
    if counts["random_init"]:
        notes.append(f"{counts['random_init']} layer(s) look like random initialisation: "
                     "scores would describe the init, not a trained model, so none are given")
    unseen = [layer.name for layer in layers if not (views[layer.name].is_first
              or views[layer.name].is_last or views[layer.name].feeds)]
    if unseen:
        notes.append(f"{len(unseen)} layer(s) not found applied in the graph (no structural "
                     f"risks): {', '.join(unseen[:5])}{' …' if len(unseen) > 5 else ''}")
    return notes


def _unscored(module: nn.Module, layers: Sequence[Layer]) -> list[str]:
    """Weight matrices no layer covers (recurrent weights, custom parameters), never silent:
    named, with their share of the model's weights."""
    covered = {id(layer.weight) for layer in layers}
    matrices = {id(p): (name, p.numel()) for name, p in module.named_parameters()
                if p.dim() >= 2}
    left = [(name, n) for key, (name, n) in matrices.items() if key not in covered]
    if not left:
        return []
    share = sum(n for _, n in left) / max(sum(n for _, n in matrices.values()), 1)
    names = ", ".join(name for name, _ in left[:5]) + (" …" if len(left) > 5 else "")
    return [f"{len(left)} weight matrices ({share:.0%} of matrix weights) are not scored "
            f"(no quantizable layer type holds them): {names}"]


def _calibration_health(calibration: Calibration | None) -> list[str]:
    """A warning when the measured damage is near zero everywhere: calibration data the model
    memorised (or too easy) ranks layers by noise."""
    if calibration is None or not calibration.output_kl:
        return []
    worst = max((kl for per_format in calibration.output_kl.values()
                 for kl in per_format.values()), default=0.0)
    if worst >= KL_NEAR_ZERO:
        return []
    return [f"calibration KL is below {KL_NEAR_ZERO:g} for every layer and format: the "
            "calibration data may be memorised or too easy, so the ranking is unreliable; "
            "calibrate on held-out data"]


def _risk_list(risks: Mapping[str, Sequence[Risk]]) -> tuple[QuantRisk, ...]:
    by_code: dict[str, tuple[Risk, list[str]]] = {}
    for layer, found in risks.items():
        for risk in found:
            by_code.setdefault(risk.code, (risk, []))[1].append(layer)
    return tuple(QuantRisk(code=code, layers=tuple(by_code[code][1]),
                           message=by_code[code][0].message, fix=by_code[code][0].fix)
                 for code in sorted(by_code))


def _plan(module: nn.Module, layers: Sequence[Layer], free: Mapping[str, DataFree],
          calibration: Calibration | None, knowledge: QuantKnowledge, request: PlanRequest,
          risks: Mapping[str, Sequence[Risk]]) -> QuantPlan:
    formats = {**knowledge.formats, **knowledge.extra_formats}
    eight_bit = next((i for i, f in enumerate(request.ladder) if formats[f].bits >= 8), 0)
    entries, bases = [], set()
    for layer in layers:
        shape = tuple(layer.weight.shape)
        sizes = {f: formats[f].storage_bytes(shape, layer.axis) for f in request.ladder}
        if calibration is not None:
            scores, basis = calibration.output_sqnr_db.get(layer.name, {}), "calibrated"
        elif free[layer.name].status == "scored":
            scores, basis = free[layer.name].score_db, "data-free"
        else:
            scores, basis = request.nominal_sqnr_db, "nominal"
        bases.add(basis)
        keep = any(r.code in knowledge.keep_8_bits for r in risks[layer.name])
        entries.append(PlanLayer(layer.name, sizes, {f: scores[f] for f in request.ladder
                                                     if f in scores},
                                 min_rung=eight_bit if keep else 0))
    weights = {id(layer.weight) for layer in layers}
    original = _tensor_bytes(t for t in _state(module))
    other = _tensor_bytes(t for t in _state(module) if id(t) not in weights)
    plan = make_plan(request.name, request.activations, request.ladder, entries, other,
                     original, request.budget_bytes, request.keep_below_db,
                     "+".join(sorted(bases)), request.fill_budget)
    return plan.to_section()


def _state(module: nn.Module) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        seen.setdefault(id(tensor), tensor)
    return list(seen.values())


def _tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
