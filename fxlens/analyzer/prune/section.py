"""The ``prune`` section: coupled groups, what one unit of each saves, repeated blocks that
could go whole, and a plan for a target share of parameters or FLOPs.

Steps: trace the channel spaces through the forward graph (`trace`), read the groups and their
data-free importance (`groups`), probe that one unit of each can really be removed from the
module (`module.probe`), with calibration data measure each unit's damage (`calibrated`: then
that ranks), cost one unit's removal per group exactly (`shrink`), then, with a target, choose
the units (`plan`), measure the plan's damage on the calibration batches, and build the pruned
module.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, repeated_blocks
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import (
    Prune,
    PruneBlock,
    PruneCalibration,
    PruneGroup,
    PrunePlan,
)
from fxlens.analyzer.prune.calibrated import (
    METRIC_UNITS,
    CalibrationData,
    removal_damage,
    unit_damages,
)
from fxlens.analyzer.prune.groups import Found, describe, find_groups, with_importance
from fxlens.analyzer.prune.module import probe, pruned_module, run
from fxlens.analyzer.prune.plan import Target, alignment, choose, ranked_units
from fxlens.analyzer.prune.shrink import Shrunk, costed
from fxlens.analyzer.prune.trace import Traced, trace
from fxlens.analyzer.prune.types import PruneKnowledge, Removal


@dataclass(frozen=True)
class PruneResult:
    section: Prune
    module: nn.Module | None        # the pruned module, where a plan was asked for
    shrunk: Shrunk | None           # the planned graph and its costs
    groups: tuple[Found, ...] = ()  # the offered groups, each unit's importance


def prune(module: nn.Module, inputs: Any, graph: Graph, report: Report,
          knowledge: PruneKnowledge, registry: CostRegistry, target: Target | None,
          on_step: Callable[[str], None] = lambda _: None,
          calibration: CalibrationData | None = None) -> PruneResult:
    on_step("finding coupled channels, heads and neurons")
    traced = trace(graph, knowledge)
    found, blocked = find_groups(traced)
    tensors = {**dict(module.named_parameters(remove_duplicate=False)),
               **dict(module.named_buffers(remove_duplicate=False))}
    found = with_importance(found, tensors, _scale_params(graph, knowledge))
    meta = any(t.is_meta for t in tensors.values())
    found, notes = _probed(module, inputs, found, blocked, knowledge, meta, on_step)
    if "record" in graph.capture_method:
        notes.append("captured by recording one eager run: a pruned model may take other "
                     "branches than the plan costed")
    measured = None
    if calibration is not None and found and not meta:
        found, measured = _calibrated(module, found, calibration, knowledge, on_step)
    evaluate = _evaluator(traced, knowledge, registry)
    groups = _groups(found, graph, report, evaluate)
    plan, pruned, shrunk = None, None, None
    if target is not None and found:
        on_step(f"choosing units to remove for {target.text}")
        plan, shrunk, removal = _plan(found, graph, report, target, evaluate, knowledge,
                                      measured)
        if measured is not None and calibration is not None:
            on_step("measuring the plan's damage on the calibration batches")
            plan = dataclasses.replace(plan, damage=removal_damage(
                module, found, removal, calibration, knowledge))
        pruned = pruned_module(module, found, removal, knowledge)
        groups = tuple(_removed(g, removal) for g in groups)
    section = Prune(groups=groups, blocked=blocked, blocks=_blocks(graph, report, knowledge),
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


def _evaluator(traced: Traced, knowledge: PruneKnowledge, registry: CostRegistry
               ) -> Callable[[Removal], Shrunk]:
    return lambda removal: costed(traced, removal, knowledge, registry)


def _scale_params(graph: Graph, knowledge: PruneKnowledge) -> frozenset[str]:
    return frozenset(p.name for p in graph.params if p.name.endswith(".weight")
                     and graph.module_types.get(p.owner, "").rpartition(".")[2]
                     in knowledge.scale_types)


def _groups(found: Sequence[Found], graph: Graph, report: Report,
            evaluate: Callable[[Removal], Shrunk]) -> tuple[PruneGroup, ...]:
    blocks = repeated_blocks(graph.module_types)
    out = []
    for group in found:
        kind, unit, name = describe(group)
        one = evaluate({group.root: frozenset({ranked_or_last(group)})})
        values = group.importance or (1.0,)
        out.append(PruneGroup(
            id=group.root, kind=kind, name=name,
            block=next((b for b in blocks if name == b or name.startswith(b + ".")), ""),
            units=group.units, unit=unit, members=group.members,
            params_per_unit=report.model.params - one.params,
            flops_per_unit=report.totals.flops - one.report.totals.flops,
            importance_basis=group.basis, importance_min=min(values),
            importance_median=statistics.median(values)))
    return tuple(out)


def ranked_or_last(group: Found) -> int:
    units = ranked_units([group])
    return units[0][1] if units else group.units - 1


def _plan(found: Sequence[Found], graph: Graph, report: Report, target: Target,
          evaluate: Callable[[Removal], Shrunk], knowledge: PruneKnowledge,
          measured: PruneCalibration | None) -> tuple[PrunePlan, Shrunk, Removal]:
    before = report.model.params if target.basis == "params" else report.totals.flops
    choice = choose(found, target, before, evaluate)
    plan = PrunePlan(
        target=target.text, basis=target.basis, share=target.share, met=choice.met,
        units_removed=choice.units, params_before=report.model.params,
        params_after=choice.shrunk.params, flops_before=report.totals.flops,
        flops_after=choice.shrunk.report.totals.flops,
        alignment=alignment(found, choice.removal, graph, choice.shrunk.graph,
                            knowledge.alignments),
        ranking=("data-free importance ÷ its group's mean" if measured is None else
                 f"calibrated damage of removing the unit alone ({measured.metric_unit}, "
                 f"{measured.batches} {measured.source} batches)")
        + ", least first; each group keeps one")
    return plan, choice.shrunk, choice.removal


def _removed(group: PruneGroup, removal: Removal) -> PruneGroup:
    return dataclasses.replace(group, removed=len(removal.get(group.id, ())))


def _blocks(graph: Graph, report: Report, knowledge: PruneKnowledge) -> tuple[PruneBlock, ...]:
    """Repeated blocks with a residual add fed from outside the block."""
    flops = {m.path: m.flops for m in report.modules}
    out = []
    for path in repeated_blocks(graph.module_types):
        inside = [n for n in graph.nodes if n.kind is NodeKind.CALL and _within(n.module, path)]
        if any(_residual(n, graph, path, knowledge) for n in inside):
            params = sum(p.spec.numel for p in graph.params
                         if not p.is_buffer and _within(p.owner, path))
            out.append(PruneBlock(path, params, flops.get(path, 0)))
    return tuple(out)


def _within(module: str, path: str) -> bool:
    return module == path or module.startswith(path + ".")


def _residual(node: Node, graph: Graph, path: str, knowledge: PruneKnowledge) -> bool:
    """An add whose operand comes from outside `path`, through copies of the same shape."""
    if node.packet not in knowledge.residual_ops:
        return False
    for ref in node.input_refs():
        current = graph.nodes[ref.node]
        for _ in range(4):
            if current.kind is not NodeKind.CALL or not _within(current.module, path):
                return current.kind is not NodeKind.PARAM
            refs = list(current.input_refs())
            if len(refs) != 1 or graph.spec(refs[0]) != current.outputs[0]:
                break
            current = graph.nodes[refs[0].node]
    return False

