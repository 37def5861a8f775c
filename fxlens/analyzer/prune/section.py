"""The ``prune`` section: coupled groups, what one unit of each saves (whole residual blocks
among them), and a plan for a target share of parameters or FLOPs.

Steps: trace the channel spaces through the forward graph (`trace`), read the groups and their
data-free importance (`groups`) and the whole residual blocks (`blocks`: one-unit groups),
probe that one unit of each can really be removed from the module (`module.probe`), with
calibration data measure each unit's damage (`calibrated`: then that ranks), cost one unit's
removal per group exactly (`shrink`), then, with a target, choose the units (`plan`), measure
the plan's damage on the calibration batches, and build the pruned module.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from fxlens.analyzer.capture.training import TrainingGraph
from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.graph import Graph, block_of, repeated_blocks
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import (
    Prune,
    PruneBlock,
    PruneCalibration,
    PruneGroup,
    PrunePlan,
)
from fxlens.analyzer.prune.blocks import BlockSite, block_groups, block_returns, find_blocks
from fxlens.analyzer.prune.calibrated import (
    METRIC_UNITS,
    CalibrationData,
    removal_damage,
    unit_damages,
)
from fxlens.analyzer.prune.cuts import EXACT, Cut, aligned_cuts, group_order, pick
from fxlens.analyzer.prune.cuts import measured as measured_cut
from fxlens.analyzer.prune.groups import Found, describe, find_groups, with_importance
from fxlens.analyzer.prune.module import probe, pruned_module, run
from fxlens.analyzer.prune.plan import (
    Target,
    alignment,
    candidates,
    choose,
    ranked_units,
    value,
)
from fxlens.analyzer.prune.savings import (
    Meter,
    StepCapture,
    StepCosts,
    aligned_step,
    cache_element_bytes,
    kv_bytes_per_token,
)
from fxlens.analyzer.prune.shrink import Shrunk, costed
from fxlens.analyzer.prune.trace import Traced, trace
from fxlens.analyzer.prune.types import PruneKnowledge, Removal
from fxlens.analyzer.time.roofline import Device


@dataclass(frozen=True)
class PruneResult:
    section: Prune
    module: nn.Module | None        # the pruned module, where a plan was asked for
    shrunk: Shrunk | None           # the planned graph and its costs
    groups: tuple[Found, ...] = ()  # the offered groups, each unit's importance


def prune(module: nn.Module, inputs: Any, graph: Graph, report: Report,
          knowledge: PruneKnowledge, registry: CostRegistry, target: Target | None,
          on_step: Callable[[str], None] = lambda _: None,
          calibration: CalibrationData | None = None, step: StepCapture | None = None,
          device: Device | None = None, tf32: bool = False,
          recorded: TrainingGraph | None = None) -> PruneResult:
    """`step` records a training step of a module (`recorded`: the original's, when the
    run has it), `device` rates times (`fxlens.analyzer.prune.savings`)."""
    on_step("finding coupled channels, heads, neurons and whole blocks")
    traced = trace(graph, knowledge)
    found, blocked = find_groups(traced)
    sites = {s.root: s for s in find_blocks(graph, knowledge)}
    found += block_groups(list(sites.values()), graph)
    tensors = {**dict(module.named_parameters(remove_duplicate=False)),
               **dict(module.named_buffers(remove_duplicate=False))}
    found = with_importance(found, tensors, _scale_params(graph, knowledge))
    meta = any(t.is_meta for t in tensors.values())
    if sites and not meta:
        found = _with_returns(module, inputs, found)
    found, notes = _probed(module, inputs, found, blocked, knowledge, meta, on_step)
    if "record" in graph.capture_method:
        notes.append("captured by recording one eager run: a pruned model may take other "
                     "branches than the plan costed")
    measured = None
    if calibration is not None and found and not meta:
        found, measured = _calibrated(module, found, calibration, knowledge, on_step)
    evaluate = _evaluator(traced, knowledge, registry, sites)
    meter = Meter(module, found, knowledge, registry, step, device, tf32)
    if found and step is not None:
        on_step("recording the training step of each group's one-unit removal")
    base = _base(meter, graph, report, recorded)
    groups = _groups(found, graph, report, evaluate, meter, base)
    plan, pruned, shrunk = None, None, None
    if target is not None and found:
        on_step(f"choosing units to remove for {target.text}")
        saving = {g.id: float(g.params_per_unit if target.basis == "params"
                              else g.flops_per_unit) for g in groups}
        plan, shrunk, removal = _plan(found, graph, report, target, evaluate, meter, base,
                                      measured, saving)
        if measured is not None and calibration is not None:
            on_step("measuring the plan's damage on the calibration batches")
            plan = dataclasses.replace(plan, damage=removal_damage(
                module, found, removal, calibration, knowledge))
        pruned = pruned_module(module, found, removal, knowledge)
        groups = tuple(_removed(g, removal) for g in groups)
    section = Prune(groups=groups, blocked=blocked, blocks=_blocks(found, sites, graph, report),
                    importance="data-free" if measured is None else "calibrated",
                    notes=tuple(notes), plan=plan, calibration=measured)
    return PruneResult(section, pruned, shrunk, tuple(found))


def _probed(module: nn.Module, inputs: Any, found: list[Found], blocked: dict[str, int],
            knowledge: PruneKnowledge, meta: bool, on_step: Callable[[str], None]
            ) -> tuple[list[Found], list[str]]:
    """The groups whose one-unit removal runs (the others counted in `blocked`), and notes."""
    if meta:
        return found, ["weights on the meta device: groups not probed, units ranked by "
                       "position"]
    on_step("probing that each group can be pruned")
    failed = probe(module, found, inputs, run(module, inputs), knowledge)
    for why in failed.values():
        blocked[why] = blocked.get(why, 0) + 1
    return [g for g in found if g.root not in failed], []


def _calibrated(module: nn.Module, found: Sequence[Found], data: CalibrationData,
                knowledge: PruneKnowledge, on_step: Callable[[str], None]
                ) -> tuple[list[Found], PruneCalibration]:
    """The groups with their measured damage per unit as importance, and how it was got."""
    damages = unit_damages(module, found, data, knowledge, on_step)
    basis = f"calibrated damage ({METRIC_UNITS[data.metric]})"
    out = [dataclasses.replace(g, importance=damages.per_unit[g.root], basis=basis,
                               comparable=True) for g in found]
    return out, PruneCalibration(data.source, len(data.batches), data.metric,
                                 METRIC_UNITS[data.metric], damages.measured, damages.total)


def _evaluator(traced: Traced, knowledge: PruneKnowledge, registry: CostRegistry,
               sites: Mapping[int, BlockSite]) -> Callable[[Removal], Shrunk]:
    return lambda removal: costed(traced, removal, knowledge, registry, sites)


def _with_returns(module: nn.Module, inputs: Any, found: list[Found]) -> list[Found]:
    """The blocks with how each returns (a tensor, or a tuple led by the stream)."""
    returns = block_returns(module, inputs, [g.block for g in found if g.block])
    return [dataclasses.replace(g, returns=returns.get(g.block, 0)) if g.block else g
            for g in found]


def _scale_params(graph: Graph, knowledge: PruneKnowledge) -> frozenset[str]:
    return frozenset(p.name for p in graph.params if p.name.endswith(".weight")
                     and graph.module_types.get(p.owner, "").rpartition(".")[2]
                     in knowledge.scale_types)


@dataclass(frozen=True)
class _Base:
    """The original model's figures that removals are measured against."""

    forward_s: float | None
    kv_bytes_per_token: int | None
    kv_element_bytes: float
    step: StepCosts | None


def _base(meter: Meter, graph: Graph, report: Report, recorded: TrainingGraph | None
          ) -> _Base:
    element = cache_element_bytes(graph)
    step = meter.step_costs(recorded) if recorded is not None else meter.training({})
    return _Base(meter.forward_s(report, graph), kv_bytes_per_token(graph, element), element,
                 step)


def _groups(found: Sequence[Found], graph: Graph, report: Report,
            evaluate: Callable[[Removal], Shrunk], meter: Meter, base: _Base
            ) -> tuple[PruneGroup, ...]:
    blocks = repeated_blocks(graph.module_types)
    out = []
    for group in found:
        kind, unit, name = describe(group)
        removal = {group.root: frozenset({ranked_or_last(group)})}
        one = evaluate(removal)
        values = group.importance or (1.0,) * group.units
        block = group.block or block_of(name, blocks)
        row = PruneGroup(
            id=group.root, kind=kind, name=name, block=block,
            units=group.units, unit=unit, members=group.members,
            params_per_unit=report.model.params - one.params,
            flops_per_unit=report.totals.flops - one.report.totals.flops,
            importance_basis=group.basis, importance_min=min(values),
            importance_median=statistics.median(values))
        alike = ((name[len(block):], kind, unit, group.units, row.params_per_unit,
                  row.flops_per_unit) if block else None)
        out.append(_saved(row, group, one, meter.training(removal, alike), meter, base,
                          evaluate, graph))
    return tuple(out)


def _saved(row: PruneGroup, group: Found, one: Shrunk, step: StepCosts | None, meter: Meter,
           base: _Base, evaluate: Callable[[Removal], Shrunk], graph: Graph) -> PruneGroup:
    """`row` with what one unit saves beyond params and forward FLOPs, and its aligned step."""
    kv = kv_bytes_per_token(one.graph, base.kv_element_bytes)
    aligned = aligned_step(group, graph, meter.knowledge.aligned_bytes)
    time_aligned = None
    if aligned > 1 and base.forward_s is not None:
        shrunk = evaluate({group.root: frozenset(group_order(group)[:aligned])})
        time_aligned = _less(base.forward_s, meter.forward_s(shrunk.report, shrunk.graph))
    return dataclasses.replace(
        row, train_flops_per_unit=_less(_field(base.step, "flops"), _field(step, "flops")),
        saved_bytes_per_unit=_less(_field(base.step, "saved_bytes"),
                                   _field(step, "saved_bytes")),
        kv_bytes_per_token_per_unit=_less(base.kv_bytes_per_token, kv),
        time_s_per_unit=_less(base.forward_s, meter.forward_s(one.report, one.graph)),
        aligned_units=aligned, time_s_per_aligned=time_aligned)


def _field(step: StepCosts | None, name: str) -> Any:
    return None if step is None else getattr(step, name)


def _less(before: Any, after: Any) -> Any:
    return None if before is None or after is None else before - after


def ranked_or_last(group: Found) -> int:
    units = ranked_units([group])
    return units[0][1] if units else group.units - 1


def _plan(found: Sequence[Found], graph: Graph, report: Report, target: Target,
          evaluate: Callable[[Removal], Shrunk], meter: Meter, base: _Base,
          measured: PruneCalibration | None, saving: Mapping[int, float]
          ) -> tuple[PrunePlan, Shrunk, Removal]:
    before = report.model.params if target.basis == "params" else report.totals.flops
    choice = choose(candidates(found, target), target, before, evaluate, saving)
    goal = before * (1 - target.share)

    def cut(how: str, removal: Removal, shrunk: Shrunk | None = None) -> Cut:
        return measured_cut(how, removal, evaluate,
                            lambda s: choice.met and value(s, target) <= goal,
                            lambda s: meter.forward_s(s.report, s.graph),
                            lambda s: meter.misaligned(s.report), shrunk)

    steps = {g.root: aligned_step(g, graph, meter.knowledge.aligned_bytes) for g in found}
    exact = cut(EXACT, choice.removal, choice.shrunk)
    chosen, other = pick(exact, [cut(how, r) for how, r
                                 in aligned_cuts(found, choice.removal, steps)])
    shrunk = chosen.shrunk
    step = meter.training(chosen.removal)
    kv = kv_bytes_per_token(shrunk.graph, base.kv_element_bytes)
    plan = PrunePlan(
        target=target.text, basis=target.basis, share=target.share, met=chosen.met,
        units_removed=chosen.units, params_before=report.model.params,
        params_after=shrunk.params, flops_before=report.totals.flops,
        flops_after=shrunk.report.totals.flops,
        alignment=alignment(found, chosen.removal, graph, shrunk.graph,
                            meter.knowledge.alignments, meter.knowledge.aligned_bytes),
        ranking=_ranking(found, target, measured), cut=chosen.how,
        train_flops_before=_field(base.step, "flops"), train_flops_after=_field(step, "flops"),
        saved_bytes_before=_field(base.step, "saved_bytes"),
        saved_bytes_after=_field(step, "saved_bytes"),
        kv_bytes_per_token_before=base.kv_bytes_per_token, kv_bytes_per_token_after=kv,
        device=meter.device.name if meter.device is not None else None,
        forward_s_before=base.forward_s, forward_s_after=chosen.forward_s,
        train_s_before=_field(base.step, "time_s"), train_s_after=_field(step, "time_s"),
        misaligned_before=meter.misaligned(report), misaligned_after=chosen.misaligned,
        alternative=other.to_section() if other is not None else None)
    return plan, shrunk, chosen.removal


def _removed(group: PruneGroup, removal: Removal) -> PruneGroup:
    return dataclasses.replace(group, removed=len(removal.get(group.id, ())))


def _ranking(found: Sequence[Found], target: Target, measured: PruneCalibration | None
             ) -> str:
    unscored = measured is None and all(g.basis == "none" for g in found)
    what = ("no real weights to score: each group loses the same share" if unscored else
            ("data-free importance ÷ its group's mean" if measured is None else
             f"calibrated damage of removing the unit alone ({measured.metric_unit}, "
             f"{measured.batches} {measured.source} batches) per "
             + ("parameter" if target.basis == "params" else "FLOP") + " it removes")
            + ", least first")
    blocks = ("" if not any(g.block for g in found) or target.only == "units" else
              "; a whole block is one unit of its run" + (
                  " (whole blocks only)" if target.only == "blocks" else
                  ", exclusive with the groups inside it" + (
                      "" if measured is not None else
                      "; blocks after every finer unit (no data to weigh a block against "
                      "a unit)")))
    return what + "; each group keeps one" + blocks


def _blocks(found: Sequence[Found], sites: Mapping[int, BlockSite], graph: Graph,
            report: Report) -> tuple[PruneBlock, ...]:
    """The offered whole blocks: parameters held and forward FLOPs inside."""
    flops = {m.path: m.flops for m in report.modules}
    numel = {p.name: p.spec.numel for p in graph.params if not p.is_buffer}
    offered = {g.root for g in found if g.block}
    return tuple(PruneBlock(s.path, sum(numel.get(n, 0) for n in s.params),
                            flops.get(s.path, 0)) for s in sites.values() if s.root in offered)
