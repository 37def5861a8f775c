"""The report's ``quant`` section: data-free scores, structure, calibration and the plan joined.

The section's shape is `fxlens.analyzer.core.sections.Quant` (rows: `QuantLayer`).

dB figures are higher-is-safer. ``calibrated_score_db`` is the damage measure the calibration
``metric`` names (`fxlens.analyzer.quant.calibrated`): the output SQNR (``sqnr``), or for a
model returning logits ``−10·log10(KL)`` (``kl``, the ``auto`` choice) or the top-1 flip rate in
dB (``agreement``) — measured for every layer when layers × formats is small
(`fxlens.analyzer.quant.calibrated.MEASURE_ALL_PAIRS`), else for the layers the Fisher puts
on top and the Fisher's prediction for the rest. ``data_free_sqnr_db`` is, where the example
inputs can run, the Fisher on synthetic inputs in the same unit (``Quant.score_metric``), else
the weights-only prior (`fxlens.analyzer.quant.weights`); ``Quant.data_free_evidence`` says
which.

One score per layer and format ranks, gives the verdicts and sizes the plan (`score_of`): when
calibration ran, the calibrated and data-free scores combined by their uncertainties
(`fxlens.analyzer.quant.combine`: the calibrated one's bootstrap over the calibration
examples, the data-free one's spread around it measured on this model), else the data-free
one. Each row then carries the calibrated score's ± (95 %), the combined score, its ± and
the weight it gave the calibrated one, and its rank per format (tied layers share it); the
`QuantCalibration` says which score ranks and the calibration's health (examples, expected
rank stability, examples for a stable order). NB: the verdict thresholds are in dB of that
score's damage, 30 dB = an output error power of 0.1 % or a KL of 10⁻³ nats per row.
``output_kl`` and ``top1_agreement`` are present only when the outputs hold logits.
Non-finite values (an exact format) are written as None.

A data-free Fisher that cannot run (the model raises on synthetic inputs) falls back to the
prior and says why in the notes; it never fails the report.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from fxlens.analyzer.core.graph import Graph
from fxlens.analyzer.core.sections import Quant, QuantLayer, QuantPlan, QuantRisk, QuantTask
from fxlens.analyzer.quant.calibrated import Calibration, Inputs, calibrate
from fxlens.analyzer.quant.fisher import top_share
from fxlens.analyzer.quant.links import Link, input_links
from fxlens.analyzer.quant.plan import PlanLayer, make_plan
from fxlens.analyzer.quant.ranking import (
    calibration_info,
    combined,
    rounded_db,
    with_combined,
)
from fxlens.analyzer.quant.synthetic import SyntheticFisher, synthetic_fisher
from fxlens.analyzer.quant.task import Evaluate, task_effect
from fxlens.analyzer.quant.types import LayerView, PlanRequest, QuantKnowledge, Risk
from fxlens.analyzer.quant.weights import (
    DataFree,
    Layer,
    data_free,
    find_layers,
    fold_batch_norms,
    layer_views,
)

# NB: a KL (nats) below this for the worst layer at every format is indistinguishable from
# rounding noise in the logits.
KL_NEAR_ZERO = 1e-6
# NB: calibration is "dominated by a few samples" when the damage per calibration row has an
# effective sample size (Kish: (Σd)² / Σd²) below this: the ranking then rests on that many
# rows, whatever the number calibrated on. A classifier's KL concentrates on its ambiguous
# rows (digits MLP: 300 held-out rows, 5 % of them carrying 47–93 % of the KL), so more data,
# not other data, is usually the fix.
MIN_EFFECTIVE_ROWS = 10


@dataclass(frozen=True)
class QuantSettings:
    calibration: Iterable[Inputs] | None = None     # None: data-free only
    calibration_source: str = ""
    activations: bool = False
    score_format: str = "int8_per_tensor"           # the format `score_db` columns rank by
    metric: str = "auto"                            # calibrated ranking: auto|sqnr|kl|agreement
    plan: PlanRequest | None = None
    example_inputs: Inputs | None = None            # for the data-free Fisher; None: prior only
    evaluate: Evaluate | None = None                # the task's metrics (`quant.task`)
    task_tolerance: float | None = None             # None: the rules' default


def quant_section(module: nn.Module, graph: Graph, knowledge: QuantKnowledge,
                  settings: QuantSettings, on_step: Callable[[str], None] = lambda _: None
                  ) -> Quant:
    layers = fold_batch_norms(module, graph, find_layers(module, knowledge), knowledge)
    on_step("quantization: reading the graph around each layer")
    views = layer_views(graph, layers, knowledge)
    calibration = None
    if settings.calibration is not None:
        calibration = calibrate(module, layers, settings.calibration, knowledge,
                                settings.activations, on_step, settings.metric,
                                settings.score_format)
        views = {k: replace(v, residual_max_over_std=_out_ratio(calibration, k))
                 for k, v in views.items()}
    risks = {layer.name: knowledge.risks(views[layer.name]) for layer in layers}
    on_step("quantization: scoring weights")
    links = input_links(graph, layers, knowledge)
    free = {layer.name: data_free(layer, risks[layer.name], knowledge, views[layer.name],
                                  links[layer.name].weighting)
            for layer in layers}
    synthetic = None
    if settings.example_inputs is not None and any(f.status == "scored" for f in free.values()):
        synthetic = synthetic_fisher(module, layers, settings.example_inputs, knowledge,
                                     settings.score_format, on_step)
    free = _data_free_scores(free, synthetic)
    metric = (calibration.metric if calibration is not None
              else synthetic.metric if synthetic is not None and synthetic.fisher else "sqnr")
    rows = [_row(layer, free[layer.name], risks[layer.name], calibration, synthetic)
            for layer in layers]
    combination = None
    if calibration is not None:
        combination = combined(calibration, free, settings.score_format)
        rows = [with_combined(row, combination) for row in rows]
    rows = [replace(row, verdicts=verdicts(row, knowledge),
                    kept_by=tuple(sorted(set(row.risks) & knowledge.keep_8_bits)))
            for row in rows]
    plan = None
    if settings.plan is not None:
        plan = _plan(module, layers, rows, knowledge, settings.plan)
        rows = [replace(row, precision=plan.precision.get(row.layer)) for row in rows]
    task, task_notes = _task(module, layers, knowledge, settings, plan, on_step)
    return Quant(
        status=_status([f.status for f in free.values()]),
        notes=tuple(_notes(free, layers, views) + _unscored(module, layers, free, calibration)
                    + _calibration_health(calibration)
                    + ([synthetic.failure] if synthetic and synthetic.failure else [])
                    + task_notes),
        formats=tuple(knowledge.formats), score_format=settings.score_format,
        calibration=None if calibration is None else calibration_info(
            calibration, combination, rows, settings.score_format,
            settings.calibration_source, settings.activations),
        layers=tuple(rows), risks=_risk_list(risks), plan=plan,
        data_free_evidence=_free_evidence(synthetic, links, views),
        calibrated_evidence=_calibrated_evidence(calibration),
        score_metric=metric, task=task,
    )


def _task(module: nn.Module, layers: Sequence[Layer], knowledge: QuantKnowledge,
          settings: QuantSettings, plan: QuantPlan | None, on_step: Callable[[str], None]
          ) -> tuple[QuantTask | None, list[str]]:
    """The task's metrics quantized (`quant.task`), where the model file has ``evaluate``
    and real weights to run it on."""
    if settings.evaluate is None:
        return None, []
    if any(layer.weight.is_meta for layer in layers) or not layers:
        return None, ["evaluate(model) not run: the weights are on the meta device (no values "
                      "to quantize)" if layers else "evaluate(model) not run: no layer to "
                      "quantize"]
    return task_effect(module, layers, settings.evaluate, knowledge, settings.activations,
                       plan, settings.task_tolerance, on_step), []


def _data_free_scores(free: Mapping[str, DataFree], synthetic: SyntheticFisher | None
                      ) -> dict[str, DataFree]:
    """The data-free score: the synthetic-input Fisher where it ran, else the prior."""
    if synthetic is None or synthetic.fisher is None:
        return dict(free)
    fisher = synthetic.fisher
    return {name: replace(f, score_db={fmt: fisher.score_db(name, fmt) for fmt in f.score_db})
            if f.status == "scored" and name in fisher.damage else f
            for name, f in free.items()}


def _free_evidence(synthetic: SyntheticFisher | None, links: Mapping[str, Link],
                   views: Mapping[str, LayerView]) -> str:
    if synthetic is None or synthetic.fisher is None:
        weighed, left = _weighing(links, views)
        return ("weights-only prior: per-channel weight SQNR after BatchNorm folding"
                f"{weighed}, minus structural terms for depth, first/last layers, embeddings "
                f"and risks{left}")
    return (f"diagonal Fisher on {synthetic.fisher.examples} synthetic examples "
            f"{synthetic.source}, labels sampled from the model's own output "
            f"({'KL' if synthetic.fisher.kind == 'kl' else 'output SQNR'}); "
            "BatchNorms folded before quantizing")


def _weighing(links: Mapping[str, Link], views: Mapping[str, LayerView]) -> tuple[str, str]:
    """Which layers' input channels the prior weighed by their feeding layer's scales, and
    which it could not (a link that is not positively homogeneous), in words."""
    weighed = [link for link in links.values() if link.weighting is not None]
    ops = sorted({op for link in weighed for op in link.through})
    text = (f", each input channel's error weighed by that channel's scale from the layer "
            f"feeding it ({len(weighed)} of {len(links)} layers, through "
            f"{', '.join(ops) or 'nothing'})" if weighed else "")
    left = [f"{name} ({link.reason})" for name, link in links.items()
            if link.reason and not (name in views and views[name].is_first)]
    if not left:
        return text, ""
    return text, ("; input channels not weighed where the link is not positively homogeneous "
                  f"(no function-preserving rescaling across it): {'; '.join(left[:5])}"
                  f"{f' and {len(left) - 5} more' if len(left) > 5 else ''}")


def _calibrated_evidence(calibration: Calibration | None) -> str | None:
    if calibration is None:
        return None
    kinds = [v for row in calibration.evidence.values() for v in row.values()]
    count = kinds.count("measured")
    fisher = calibration.fisher
    head = (f"diagonal Fisher on {fisher.examples} calibration examples (one backward each, "
            "labels sampled from the model's own output)" if fisher else "")
    if count == len(kinds):
        return f"{head}; {calibration.metric} measured for every layer and format"
    return (f"{head}; {calibration.metric} measured for {count} of {len(kinds)} layer × "
            "format pairs (the Fisher's worst per format), the Fisher's prediction elsewhere")


def _out_ratio(calibration: Calibration, name: str) -> float | None:
    stats = calibration.activations.get(name)
    return stats.output_max_over_std if stats else None


def _rounded(values: Mapping[str, float]) -> dict[str, float]:
    return {k: float(f"{v:.4g}") for k, v in values.items()}


def _row(layer: Layer, free: DataFree, risks: Sequence[Risk], calibration: Calibration | None,
         synthetic: SyntheticFisher | None) -> QuantLayer:
    fisher = synthetic.fisher if synthetic is not None else None
    row = QuantLayer(
        layer=layer.name, type=layer.module_type, params=layer.weight.numel(),
        status=free.status, reason=free.reason,
        stats={k: (round(v, 4) if isinstance(v, float) else v)
               for k, v in asdict(free.stats).items()} if free.stats else {},
        weight_sqnr_db=rounded_db(free.weight_sqnr_db),
        data_free_sqnr_db=rounded_db(free.score_db),
        risks=tuple(r.code for r in risks),
        risk_details={r.code: r.detail for r in risks if r.detail},
        data_free_fisher=(_rounded(fisher.damage[layer.name]) if fisher is not None
                          and free.status == "scored" and layer.name in fisher.damage
                          else None),
        folded_into=layer.folded_into or None,
    )
    if calibration is None:
        return row
    stats = calibration.activations.get(layer.name)
    logits = bool(calibration.logit_leaves)
    damage = calibration.fisher.damage.get(layer.name) if calibration.fisher else None
    return replace(
        row,
        output_sqnr_db=rounded_db(calibration.output_sqnr_db.get(layer.name, {})),
        output_kl=_rounded(calibration.output_kl.get(layer.name, {})) if logits else None,
        top1_agreement=(_rounded(calibration.top1_agreement.get(layer.name, {}))
                        if logits else None),
        calibrated_score_db=rounded_db(calibration.score_db.get(layer.name, {})),
        activation={k: round(v, 4) if isinstance(v, float) else v
                    for k, v in asdict(stats).items()} if stats else {},
        fisher_damage=_rounded(damage) if damage is not None else None,
        calibrated_evidence=dict(calibration.evidence.get(layer.name, {})) or None,
    )


def score_of(row: QuantLayer) -> Mapping[str, float | None]:
    """The one score that ranks, decides the verdicts and sizes the plan: the combined one
    when calibration ran (`quant.combine`: calibrated and data-free weighed by their
    uncertainties), else the calibrated one (a report without it), else data-free."""
    if row.combined_score_db is not None:
        return row.combined_score_db
    if row.calibrated_score_db is not None:
        return row.calibrated_score_db
    return row.data_free_sqnr_db


def verdicts(row: QuantLayer, knowledge: QuantKnowledge) -> dict[str, str]:
    """Per format, can this layer go there: "ok" at a score (`score_of`) of at least
    ``verdict_db[0]``, "risky" down to ``verdict_db[1]``, else "keep higher"; a format under
    8 bits is "keep higher" for a layer whose structural risks say to keep it at 8 bits."""
    ok_db, risky_db = knowledge.verdict_db
    scores = score_of(row)
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
    unseen = [layer.name for layer in layers if not (views[layer.name].is_first
              or views[layer.name].is_last or views[layer.name].feeds)]
    if unseen:
        notes.append(f"{len(unseen)} layer(s) not found applied in the graph (no structural "
                     f"risks): {', '.join(unseen[:5])}{' …' if len(unseen) > 5 else ''}")
    return notes


def _unscored(module: nn.Module, layers: Sequence[Layer], free: Mapping[str, DataFree],
              calibration: Calibration | None) -> list[str]:
    """Weight matrices without a score, never silent: each kind named with its reason and its
    share of the model's matrix weights."""
    matrices = {id(p): (name, p.numel()) for name, p in module.named_parameters()
                if p.dim() >= 2}
    total = max(sum(n for _, n in matrices.values()), 1)
    covered = {id(layer.weight) for layer in layers}
    groups: dict[str, list[tuple[str, int]]] = {
        "no quantizable layer type holds them": [
            (name, n) for key, (name, n) in matrices.items() if key not in covered]}
    for layer in layers:
        status = free[layer.name].status
        if status != "scored":
            reason = ("weights on the meta device: load real weights to score them"
                      if status == "meta" else "they look like random initialisation: a "
                      "score would describe the init, not a trained model")
            groups.setdefault(reason, []).append((layer.name, layer.weight.numel()))
    silent = calibration.fisher.silent if calibration and calibration.fisher else ()
    groups["no gradient reached them on the calibration data (unused or behind a "
           "non-differentiable op): damage 0 by the Fisher"] = [
        (layer.name, layer.weight.numel()) for layer in layers if layer.name in silent]
    notes = []
    for reason, left in groups.items():
        if not left:
            continue
        share = sum(n for _, n in left) / total
        names = ", ".join(name for name, _ in left[:5]) + (" …" if len(left) > 5 else "")
        notes.append(f"{len(left)} weight matrices ({share:.0%} of matrix weights) are not "
                     f"scored ({reason}): {names}")
    return notes


def _calibration_health(calibration: Calibration | None) -> list[str]:
    """Warnings when the calibration cannot rank: the measured damage near zero everywhere
    (data the model memorised, or too easy), or the Fisher's damage carried by a few
    examples (a ranking of those examples, not of the data)."""
    if calibration is None:
        return []
    notes = []
    worst = max((kl for per_format in calibration.output_kl.values()
                 for kl in per_format.values()), default=None)
    if worst is not None and worst < KL_NEAR_ZERO:
        notes.append(f"calibration KL is below {KL_NEAR_ZERO:g} for every layer and format: "
                     "the calibration data may be memorised or too easy, so the ranking is "
                     "unreliable; calibrate on held-out data")
    rows = calibration.row_damage
    total = sum(rows)
    effective = total**2 / max(sum(d * d for d in rows), 1e-300) if total > 0 else 0.0
    if total > 0 and effective < MIN_EFFECTIVE_ROWS:
        k, share = top_share([d / total for d in rows], 0.05)
        notes.append(f"calibration is dominated by a few samples: the damage rests on about "
                     f"{effective:.0f} of {len(rows)} calibration rows (the top {k} carry "
                     f"{share:.0%}); the ranking follows them — calibrate on more, and more "
                     "varied, held-out data")
    return notes


def _risk_list(risks: Mapping[str, Sequence[Risk]]) -> tuple[QuantRisk, ...]:
    by_code: dict[str, tuple[Risk, list[str]]] = {}
    for layer, found in risks.items():
        for risk in found:
            by_code.setdefault(risk.code, (risk, []))[1].append(layer)
    return tuple(QuantRisk(code=code, layers=tuple(by_code[code][1]),
                           message=by_code[code][0].message, fix=by_code[code][0].fix)
                 for code in sorted(by_code))


def _plan(module: nn.Module, layers: Sequence[Layer], rows: Sequence[QuantLayer],
          knowledge: QuantKnowledge, request: PlanRequest) -> QuantPlan:
    """The plan sized by the same score that ranks and gives the verdicts (`score_of`); its
    predicted output figure is in that score's unit (`Quant.score_metric`)."""
    formats = {**knowledge.formats, **knowledge.extra_formats}
    eight_bit = next((i for i, f in enumerate(request.ladder) if formats[f].bits >= 8), 0)
    entries, bases = [], set()
    for layer, row in zip(layers, rows, strict=True):
        shape = tuple(layer.weight.shape)
        sizes = {f: formats[f].storage_bytes(shape, layer.axis) for f in request.ladder}
        if row.status == "scored":
            scores = {f: (math.inf if v is None else v) for f, v in score_of(row).items()}
            basis = ("combined" if row.combined_score_db is not None else "calibrated"
                     if row.calibrated_score_db is not None else "data-free")
        else:
            scores, basis = dict(request.nominal_sqnr_db), "nominal"
        bases.add(basis)
        keep = bool(set(row.risks) & knowledge.keep_8_bits)
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
