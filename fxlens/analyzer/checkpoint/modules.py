"""Selective checkpointing by module (``--checkpoint-granularity module``): which child modules
of the repeated blocks to wrap in ``torch.utils.checkpoint`` under a memory budget.

A decision per child module (a block's outermost submodules that ran a forward: ``self_attn``,
``mlp``, the norms), the same child of every alike block decided together: wrapped, its
forward is recomputed in the backward and only its inputs are kept (the checkpoint frame);
not wrapped, autograd keeps what its ops save. The blocks themselves are not checkpointed.
Each wrapped child is a checkpoint region exactly as a block is under the op policy
(`fxlens.analyzer.checkpoint.blocks`: recompute start, early stop, frame), with nothing
cached, so the step under any choice is `fxlens.analyzer.checkpoint.model.step_profile` of
the wrapped regions: simulated, not estimated.

Why not the knapsack of `fxlens.analyzer.checkpoint.solve`: wrapping is not separable. A
child's output is the next child's input; wrapping the next one holds it to that child's
frame, not wrapping the first holds it to the first's backward, and its life is the longer of
the two, not their sum. The decisions are few (a block has a handful of children), so every
subset is simulated (at most 2^`MAX_VARIABLES`, and `MAX_SIMULATED_NODES` nodes in all: 2^4
subsets of Llama-3-8B's 8k-node step) and the best that fits is exact; alike blocks of several
groups (T5's first block, which carries the position bias) that would make more are decided
per child name across groups (the same children wrapped in every block); more still is
refused, naming the op granularity.

NB: a child that saves nothing for the backward (a dropout in eval, a pure reshape) cannot be
checkpointed and is not offered; ops of a block outside every child (residual adds) are never
recomputed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fxlens.analyzer.capture.training import TrainingGraph
from fxlens.analyzer.checkpoint.blocks import BlockForward, block_forwards, children
from fxlens.analyzer.checkpoint.choose import CURVE_POINTS, CheckpointError, Request
from fxlens.analyzer.checkpoint.code import module_code
from fxlens.analyzer.checkpoint.model import step_profile
from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import (
    BlockPolicy,
    BudgetPoint,
    SelectiveCheckpointing,
    Training,
)
from fxlens.analyzer.memory.liveness import Storages, plan_storages

MAX_VARIABLES = 8                 # 2^8 subsets simulated at most …
MAX_SIMULATED_NODES = 3_000_000   # … and at most this many nodes simulated in all


@dataclass(frozen=True)
class Wrap:
    """One decision: the child `name` (relative to its block) wrapped in each of `blocks`."""

    name: str
    blocks: tuple[str, ...]
    regions: tuple[BlockForward, ...]     # that child, in each block
    cost: float                           # the recompute it adds, all blocks together
    flops: int
    kept_bytes: int                       # what autograd saves in it, per block, unwrapped


@dataclass(frozen=True)
class Subset:
    wrapped: tuple[int, ...]              # indices into `ModuleProblem.wraps`
    recompute: float
    fwd_bwd_peak_bytes: int               # simulated


@dataclass(frozen=True)
class ModuleProblem:
    """Every decision and every subset of them simulated (built once, any budget)."""

    groups: tuple[tuple[str, ...], ...]   # alike blocks
    wraps: tuple[Wrap, ...]
    subsets: tuple[Subset, ...]
    plain_fwd_bwd: int
    by_name: bool                         # decided per child name across groups

    @property
    def least(self) -> Subset:
        return min(self.subsets, key=lambda s: (s.fwd_bwd_peak_bytes, s.recompute))


def module_problem(step: TrainingGraph, report: Report, registry: CostRegistry,
                   request: Request) -> ModuleProblem:
    """The blocks' children, the decisions over them, and every subset's simulated peak."""
    free = {n.id for n in report.nodes if n.status == "free"}
    storages = plan_storages(step.graph, registry)
    blocks = [b for b in block_forwards(step, storages, free.__contains__, request.cost)
              if b.checkpointable]
    groups: dict[tuple[object, ...], list[str]] = defaultdict(list)
    for block in blocks:
        groups[block.signature].append(block.path)
    inner = {b.path: children(step.graph.module_types, b.path) for b in blocks}
    regions = {r.path: r for r in block_forwards(
        step, storages, free.__contains__, request.cost,
        [c for paths in inner.values() for c in paths]) if r.checkpointable}
    flops = {n.id: n.flops for n in report.nodes}
    per_group = [_wrap(name, group, regions, request.cost, flops, storages, step)
                 for group in groups.values() for name in _names(group[0], inner, regions)]
    most = min(MAX_VARIABLES, (MAX_SIMULATED_NODES // max(len(step.graph.nodes), 1))
               .bit_length() - 1)
    by_name = len(per_group) > most
    wraps = _merged(per_group) if by_name else per_group
    if not wraps:
        raise CheckpointError("--checkpoint-granularity module: no child module of the "
                              "repeated blocks keeps anything for the backward to recompute")
    if len(wraps) > most:
        raise CheckpointError(f"--checkpoint-granularity module: {len(wraps)} child modules "
                              f"per block, more than the {most} whose every subset can be "
                              f"simulated on this graph; use the op granularity")
    subsets = tuple(_simulate(step, wraps, mask, registry) for mask in range(1 << len(wraps)))
    return ModuleProblem(tuple(tuple(g) for g in groups.values()), tuple(wraps), subsets,
                         subsets[0].fwd_bwd_peak_bytes, by_name)


def _names(block: str, inner: Mapping[str, list[str]], regions: Mapping[str, BlockForward]
           ) -> list[str]:
    return [path[len(block) + 1:] for path in inner[block] if path in regions]


def _wrap(name: str, group: Sequence[str], regions: Mapping[str, BlockForward],
          cost: Mapping[int, float], flops: Mapping[int, int], st: Storages,
          step: TrainingGraph) -> Wrap:
    found = tuple(regions[f"{b}.{name}"] for b in group if f"{b}.{name}" in regions)
    run = [n for r in found for n in r.forward[:r.recomputed]]
    return Wrap(name, tuple(r.path[:-len(name) - 1] for r in found), found,
                sum(cost.get(n, 0.0) for n in run), sum(flops.get(n, 0) for n in run),
                _saved_bytes(found[0], st, step))


def _merged(wraps: Sequence[Wrap]) -> list[Wrap]:
    """One decision per child name, every group's together."""
    by_name: dict[str, list[Wrap]] = defaultdict(list)
    for wrap in wraps:
        by_name[wrap.name].append(wrap)
    return [Wrap(name, tuple(b for w in alike for b in w.blocks),
                 tuple(r for w in alike for r in w.regions), sum(w.cost for w in alike),
                 sum(w.flops for w in alike), alike[0].kept_bytes)
            for name, alike in by_name.items()]


def _saved_bytes(region: BlockForward, st: Storages, step: TrainingGraph) -> int:
    """Bytes autograd saves inside `region` (each storage once): what wrapping it drops."""
    ids = set(region.forward)
    sids = {st.of_ref[ref] for ref in step.saved
            if ref.node in ids and ref in st.of_ref and st.producer[st.of_ref[ref]] in ids}
    return sum(st.size[sid] for sid in sids)


def _simulate(step: TrainingGraph, wraps: Sequence[Wrap], mask: int,
              registry: CostRegistry) -> Subset:
    chosen = tuple(j for j in range(len(wraps)) if mask >> j & 1)
    regions = [r for j in chosen for r in wraps[j].regions]
    profile = step_profile(step, regions, {} if regions else None, registry)
    return Subset(chosen, sum(wraps[j].cost for j in chosen), profile.peak_activation_bytes)


# --- budget → choice, the section ---------------------------------------------------------------


def module_checkpointing(step: TrainingGraph, report: Report, registry: CostRegistry,
                         training: Training, request: Request,
                         problem: ModuleProblem | None = None) -> SelectiveCheckpointing:
    """The children to wrap for `request`'s budget on `training`'s step, and the curve."""
    problem = problem or module_problem(step, report, registry, request)
    parts = training.peak_breakdown

    def step_peak(fwd_bwd: int) -> int:
        return parts.persistent_bytes + max(fwd_bwd, parts.optimizer_phase_bytes)

    least = step_peak(problem.least.fwd_bwd_peak_bytes)
    before = step_peak(problem.plain_fwd_bwd)

    def pick(budget: int) -> Subset | None:
        """Least recompute (then least peak) that fits; None: the step fits as it is."""
        target = max(budget, least)
        if before <= target:
            return None
        return min((s for s in problem.subsets if step_peak(s.fwd_bwd_peak_bytes) <= target),
                   key=lambda s: (s.recompute, s.fwd_bwd_peak_bytes))

    chosen = pick(request.budget_bytes)
    fwd_bwd = chosen.fwd_bwd_peak_bytes if chosen is not None else problem.plain_fwd_bwd
    after = step_peak(fwd_bwd)
    policies = _policies(problem, chosen) if chosen is not None else ()
    recompute = chosen.recompute if chosen is not None else 0.0
    budgets = [least + (before - least) * k // (CURVE_POINTS - 1) for k in range(CURVE_POINTS)]
    states = training.states
    return SelectiveCheckpointing(
        budget_bytes=request.budget_bytes, budget_from=request.budget_from,
        cost_unit=request.cost_unit, cost_basis=request.cost_basis,
        peak_before_bytes=before, peak_after_bytes=after, least_peak_bytes=least,
        first_step_peak_bytes=parts.persistent_bytes - states.optimizer_bytes + max(
            fwd_bwd, parts.optimizer_phase_bytes + states.optimizer_bytes),
        fwd_bwd_peak_bytes=fwd_bwd, fits=after <= request.budget_bytes,
        checkpointed=chosen is not None, recompute=recompute,
        recompute_flops=sum(problem.wraps[j].flops for j in chosen.wrapped) if chosen else 0,
        recompute_share=_share(recompute, request), policies=policies,
        curve=tuple(_point(problem, budget, pick(budget), step_peak, request)
                    for budget in budgets),
        solver=_solver(problem, chosen, before, request.budget_bytes),
        exact=True, gap=0.0, code=module_code(policies) if policies else "",
        granularity="module")


def _share(recompute: float, request: Request) -> float:
    return recompute / request.step_cost if request.step_cost else 0.0


def _solver(problem: ModuleProblem, chosen: Subset | None, before: int, budget: int) -> str:
    if chosen is None:
        return ("none needed: the step fits as it is" if before <= budget else
                "none: checkpointing lowers nothing, the optimizer step sets the peak")
    shared = ", the same children in every group" if problem.by_name else ""
    return (f"exact: every one of the {len(problem.subsets)} subsets of "
            f"{len(problem.wraps)} child modules simulated{shared}")


def _point(problem: ModuleProblem, budget: int, chosen: Subset | None,
           step_peak: Callable[[int], int], request: Request) -> BudgetPoint:
    fwd_bwd = chosen.fwd_bwd_peak_bytes if chosen is not None else problem.plain_fwd_bwd
    peak = step_peak(fwd_bwd)
    recompute = chosen.recompute if chosen is not None else 0.0
    kept = len(problem.wraps) - (len(chosen.wrapped) if chosen is not None else 0)
    return BudgetPoint(budget_bytes=budget, peak_bytes=peak, recompute=recompute,
                       recompute_share=_share(recompute, request), saved_ops=kept,
                       fits=peak <= budget, exact=True)


def _policies(problem: ModuleProblem, chosen: Subset) -> tuple[BlockPolicy, ...]:
    """Per group of alike blocks: the children wrapped (recomputed) and kept."""
    wrapped = set(chosen.wrapped)
    out = []
    for group in problem.groups:
        mine = [(j, w) for j, w in enumerate(problem.wraps) if group[0] in w.blocks]
        if not mine:
            continue
        recomputed = [w for j, w in mine if j in wrapped]
        kept = [w for j, w in mine if j not in wrapped]
        out.append(BlockPolicy(
            blocks=group, saved=(), summary=_summary(kept, recomputed), ops=len(mine),
            saved_ops=len(kept), saved_bytes=sum(w.kept_bytes for w in kept),
            recompute=sum(w.cost / len(w.blocks) for w in recomputed),   # per block
            modules=tuple(w.name for w in recomputed)))
    return tuple(out)


def _summary(kept: Sequence[Wrap], recomputed: Sequence[Wrap]) -> str:
    """``self_attn and mlp recomputed; input_layernorm kept``."""
    def names(wraps: Sequence[Wrap]) -> str:
        words = [w.name for w in wraps]
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]

    if not recomputed:
        return f"{names(kept)} kept: nothing recomputed"
    if not kept:
        return f"every child recomputed ({names(recomputed)})"
    return f"{names(recomputed)} recomputed; {names(kept)} kept"

