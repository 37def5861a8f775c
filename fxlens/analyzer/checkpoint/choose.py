"""Budget → policy: `selective_checkpointing(step, report, registry, training, request)`; the
part that does not depend on the training state or the budget (`checkpoint_problem`: blocks,
variables, the separable step, its frontier) is built once and may be shared.

The budget is for the steady step's peak, accounted as the training section does: persistent
state (weights, master copies, optimizer state) + the larger of the forward/backward's live
bytes and the optimizer step's gradients and temporaries. Checkpointing changes only the
forward/backward's, so the blocks' policy must keep it under ``budget − persistent``; the
optimizer step must fit as it is. The forward/backward's live bytes under any policy come from
`fxlens.analyzer.checkpoint.model.Separable` (the simulated step, exactly), the policy from
`fxlens.analyzer.checkpoint.solve` (one knapsack over the groups of alike blocks, solved once
per budget: its variables are shared by every block of a group).

A step that fits the budget as it is gets no checkpointing (saving everything under a
selective policy keeps more than autograd would); a budget below the least peak reachable
gets the cheapest policy reaching it, and the verdict that it does not fit. The curve:
`CURVE_POINTS` budgets evenly from the least peak (every op recomputed, what ``--checkpoint``
does) to the step without checkpointing, each with the policy chosen for it; the one frontier
serves them all, so a tighter budget never gets a higher peak.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from fxlens.analyzer.capture.training import TrainingGraph
from fxlens.analyzer.checkpoint.blocks import BlockForward, Item, block_forwards
from fxlens.analyzer.checkpoint.code import policy_code
from fxlens.analyzer.checkpoint.model import Separable, Variable, separable, step_profile
from fxlens.analyzer.checkpoint.solve import (
    NODE_LIMIT,
    REL_TOL,
    Frontier,
    Solution,
    bits,
    frontier,
    solve,
)
from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.errors import FxlensError
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import (
    BlockPolicy,
    BudgetPoint,
    SavedOp,
    SelectiveCheckpointing,
    Training,
)
from fxlens.analyzer.memory.liveness import plan_storages

CURVE_POINTS = 10
CURVE_NODE_LIMIT = 5_000    # the branch and bound per point of the curve


class CheckpointError(FxlensError):
    """Selective checkpointing was asked for and cannot be planned (no repeated blocks)."""


@dataclass(frozen=True)
class Request:
    budget_bytes: int
    budget_from: str
    cost: Mapping[int, float]          # per node: what recomputing it costs
    cost_unit: str                     # "s" or "FLOP"
    cost_basis: str
    step_cost: float                   # the step's own, in the same unit
    family: Callable[[str], str]       # op → its family, in words (`fxlens.rules.checkpoint`)
    families: Sequence[str]            # the order families are named in
    runtime_ops: Callable[[str], tuple[str, ...]]
    savable: Callable[[str], bool]     # ops a policy can name (real torch ops)


@dataclass(frozen=True)
class Problem:
    """What a budget's policy is chosen from, whatever the precision, optimizer or budget: the
    blocks, their variables, the separable step and its frontier (the costly part, built once
    by `checkpoint_problem` and shared: the pass and the fix finder, `fxlens.analyzer.fixes`)."""

    blocks: list[BlockForward]
    groups: list[list[BlockForward]]
    variables: list[Variable]
    values: list[float]
    problem: Separable
    front: Frontier
    plain_fwd_bwd: int


@dataclass(frozen=True)
class _Plan:
    """A `Problem` on one training step's state: what checkpointing cannot lower."""

    shared: Problem
    persistent: int
    optimizer_phase: int


def selective_checkpointing(step: TrainingGraph, report: Report, registry: CostRegistry,
                            training: Training, request: Request,
                            problem: Problem | None = None, curve: bool = True
                            ) -> SelectiveCheckpointing:
    """The policy for `request`'s budget on `training`'s step, and the curve (left empty
    without `curve`: the fix finder asks for one budget per change it weighs, and the curve's
    ten solves were most of its time on a big step; its one solve then stops at the curve's
    node limit, the policy's peak still simulated exactly, its gap to the bound reported);
    `problem`: the step's (`checkpoint_problem`) where the caller built it already."""
    shared = problem or checkpoint_problem(step, report, registry, request)
    breakdown = training.peak_breakdown
    plan = _Plan(shared, breakdown.persistent_bytes, breakdown.optimizer_phase_bytes)
    least = _step(plan, plan.shared.problem.peak(()))
    before = _step(plan, plan.shared.plain_fwd_bwd)
    budgets = [least + (before - least) * k // (CURVE_POINTS - 1)
               for k in range(CURVE_POINTS)] if curve else []
    own_limit = NODE_LIMIT if curve else CURVE_NODE_LIMIT   # a fix's policy: found, not proved
    solved = {budget: _solve(plan, budget, before, own_limit if budget == request.budget_bytes
                             else CURVE_NODE_LIMIT)
              for budget in dict.fromkeys([request.budget_bytes, *budgets])}
    pool = _pool(plan, solved.values())
    picks = {budget: _pick(plan, pool, budget, own) for budget, own in solved.items()}
    chosen = picks[request.budget_bytes]
    fwd_bwd = chosen.peak if chosen is not None else plan.shared.plain_fwd_bwd
    policies = _policies(plan, chosen, request) if chosen is not None else ()
    recompute, flops = _recompute(plan, chosen, request.cost, report)
    states = training.states
    after = _step(plan, fwd_bwd)
    return SelectiveCheckpointing(
        budget_bytes=request.budget_bytes, budget_from=request.budget_from,
        cost_unit=request.cost_unit, cost_basis=request.cost_basis,
        peak_before_bytes=before, peak_after_bytes=after, least_peak_bytes=least,
        first_step_peak_bytes=plan.persistent - states.optimizer_bytes + max(
            fwd_bwd, plan.optimizer_phase + states.optimizer_bytes),
        fwd_bwd_peak_bytes=fwd_bwd, fits=after <= request.budget_bytes,
        checkpointed=chosen is not None, recompute=recompute, recompute_flops=flops,
        recompute_share=recompute / request.step_cost if request.step_cost else 0.0,
        policies=policies,
        curve=tuple(_point(plan, budget, picks[budget], request, report)
                    for budget in budgets),
        solver=chosen.method if chosen is not None else (
            "none needed: the step fits as it is" if before <= request.budget_bytes else
            "none: checkpointing lowers nothing, the optimizer step sets the peak"),
        exact=chosen.exact if chosen is not None else True,
        gap=_gap(plan, chosen) if chosen is not None else 0.0,
        code=policy_code(policies, request.runtime_ops) if policies else "",
    )


def checkpoint_problem(step: TrainingGraph, report: Report, registry: CostRegistry,
                       request: Request) -> Problem:
    """The step's blocks, variables, separable form and frontier (see `Problem`)."""
    free = {n.id for n in report.nodes if n.status == "free"}
    unsavable = {n.id for n in report.nodes if not request.savable(n.target)}
    storages = plan_storages(step.graph, registry)
    blocks = [b for b in block_forwards(step, storages, lambda i: i in free or i in unsavable,
                                        request.cost) if b.checkpointable]
    if not blocks:
        raise CheckpointError("--checkpoint auto: the model has no repeated blocks whose "
                              "activations checkpointing could drop (it checkpoints runs of "
                              "alike children: layers.0, layers.1, …)")
    by_signature: dict[tuple[object, ...], list[BlockForward]] = defaultdict(list)
    for block in blocks:
        by_signature[block.signature].append(block)
    groups = list(by_signature.values())
    variables: list[Variable] = [[(b, b.items[k]) for b in group]
                                 for group in groups for k in range(len(group[0].items))]
    values = [sum(item.cost for _, item in variable) for variable in variables]
    problem = separable(step, blocks, variables, registry)
    return Problem(blocks, groups, variables, values, problem, frontier(problem, values),
                   step_profile(step, blocks, None, registry).peak_activation_bytes)


def _step(plan: _Plan, fwd_bwd: int) -> int:
    """The steady step's peak with the forward/backward's at `fwd_bwd`."""
    return plan.persistent + max(fwd_bwd, plan.optimizer_phase)


def _solve(plan: _Plan, budget: int, before: int, nodes: int) -> Solution | None:
    """The policy for `budget`; None when the step fits it without checkpointing. A budget
    below the least peak gets the cheapest policy reaching that peak (none, when the
    optimizer step decides the peak: no checkpointing lowers it)."""
    target = max(budget, _step(plan, plan.shared.problem.peak(())))
    if before <= target:
        return None
    shared = plan.shared
    return solve(shared.problem, shared.values, target - plan.persistent, shared.front, nodes)


Candidate = tuple[float, int, tuple[int, ...]]     # value spared, peak, variables saved


def _pool(plan: _Plan, solved: Iterable[Solution | None]) -> list[Candidate]:
    """Every policy found, (value, peak, variables): saving nothing, the frontier's and each
    budget's."""
    pool: list[Candidate] = [(0.0, plan.shared.problem.peak(()), ())]
    pool += [(p.value, peak, bits(p.chosen))
             for p, peak in zip(plan.shared.front.points, plan.shared.front.peaks, strict=True)]
    pool += [(s.value, s.peak, s.chosen) for s in solved if s is not None]
    return pool


def _pick(plan: _Plan, pool: Sequence[Candidate], budget: int,
          own: Solution | None) -> Solution | None:
    """The best policy of the pool for `budget` (most recompute spared, then the least
    peak): one set of candidates for every budget, so a tighter one never peaks higher.
    Exact when its own search proved the optimum (the pick is then as good)."""
    if own is None:
        return None
    cap = max(budget, _step(plan, plan.shared.problem.peak(()))) - plan.persistent
    value, peak, chosen = max((c for c in pool if c[1] <= cap), key=lambda c: (c[0], -c[1]))
    exact = own.exact or value >= own.bound * (1 - REL_TOL)
    method = own.method if own.exact or not exact else "exact: a policy found for another " \
        "budget reaches the bound"
    return Solution(chosen, value, peak, own.fits, exact, own.bound, method)


def _point(plan: _Plan, budget: int, chosen: Solution | None, request: Request,
           report: Report) -> BudgetPoint:
    fwd_bwd = chosen.peak if chosen is not None else plan.shared.plain_fwd_bwd
    recompute, _ = _recompute(plan, chosen, request.cost, report)
    peak = _step(plan, fwd_bwd)
    saved = len(chosen.chosen) if chosen is not None else 0
    return BudgetPoint(budget_bytes=budget, peak_bytes=peak, recompute=recompute,
                       recompute_share=recompute / request.step_cost if request.step_cost
                       else 0.0, saved_ops=saved, fits=peak <= budget,
                       exact=chosen.exact if chosen is not None else True)


def _saved_positions(plan: _Plan, chosen: Solution | None) -> dict[str, set[int]]:
    saved: dict[str, set[int]] = defaultdict(set)
    for j in chosen.chosen if chosen is not None else ():
        for block, item in plan.shared.variables[j]:
            saved[block.path].add(item.index)
    return saved


def _recompute(plan: _Plan, chosen: Solution | None, cost: Mapping[int, float],
               report: Report) -> tuple[float, int]:
    """What the recompute adds per step: its cost and its FLOPs (no recompute: none)."""
    if chosen is None:
        return 0.0, 0
    flops = {n.id: n.flops for n in report.nodes}
    saved = _saved_positions(plan, chosen)
    total, total_flops = 0.0, 0
    for block in plan.shared.blocks:
        for i in range(block.recomputed):
            if i not in saved[block.path]:
                total += cost.get(block.forward[i], 0.0)
                total_flops += flops.get(block.forward[i], 0)
    return total, total_flops


def _policies(plan: _Plan, chosen: Solution, request: Request) -> tuple[BlockPolicy, ...]:
    saved = _saved_positions(plan, chosen)
    out = []
    for group in plan.shared.groups:
        first = group[0]
        kept = [item for item in first.items if item.index in saved[first.path]]
        totals = Counter(item.target for item in first.items)
        by_target: dict[str, list[int]] = defaultdict(list)
        for item in kept:
            by_target[item.target].append(item.call)
        ops = tuple(SavedOp(target, tuple(calls), every=_every_call(first, target, calls),
                            bytes=sum(i.bytes for i in kept if i.target == target))
                    for target, calls in sorted(by_target.items()))
        out.append(BlockPolicy(
            blocks=tuple(b.path for b in group), saved=ops,
            summary=_summary(first.items, kept, request), ops=sum(totals.values()),
            saved_ops=len(kept), saved_bytes=sum(i.bytes for i in kept),
            recompute=sum(i.cost for i in first.items if i not in kept)))
    return tuple(out)


def _every_call(block: BlockForward, target: str, calls: Sequence[int]) -> bool:
    """Whether `calls` are all the calls of `target` in the block's forward, those after the
    recompute's early stop included (caching one of those would keep it to the block's end)."""
    return len(set(calls)) == block.calls.get(target, 0)


def _summary(items: Sequence[Item], kept: Sequence[Item], request: Request) -> str:
    """``matmuls and attention kept; norms and activations recomputed``."""
    every = Counter(request.family(i.target) for i in items)
    saved = Counter(request.family(i.target) for i in kept)
    order = [f for f in request.families if f in every]
    whole = [f for f in order if saved[f] == every[f]]
    part = [f"{saved[f]} of {every[f]} {f}" for f in order if 0 < saved[f] < every[f]]
    none = [f for f in order if not saved[f]]
    kept_text = _and([*whole, *part])
    if not none:
        return f"{kept_text} kept: nothing recomputed"
    if not kept_text:
        return f"everything recomputed ({_and(none)})"
    return f"{kept_text} kept; {_and(none)} recomputed"


def _and(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else (
        ", ".join(words[:-1]) + " and " + words[-1] if words else "")


def _gap(plan: _Plan, chosen: Solution) -> float:
    """The policy's recompute over the least any policy could have (from the bound), − 1."""
    total = sum(plan.shared.values)
    least = total - chosen.bound
    return (total - chosen.value) / least - 1 if least > 0 else 0.0
