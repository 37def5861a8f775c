"""The ``--checkpoint auto`` pass: which tensors of the repeated blocks to save and which to
recompute under a memory budget (`fxlens.analyzer.checkpoint`), and the training fit it gives.

Joins the engine and the rules as the pipeline does: what an op costs to recompute is its
roofline time on ``--device`` (`fxlens.analyzer.time.roofline.node_times`, as the roofline
section times it), else its FLOPs; op families and the attention kernels a policy must name
come from `fxlens.rules.checkpoint`. The budget: ``--checkpoint-budget``, else ``--device-mem``,
else the device's memory (`fxlens.checks.checkpoint_budget`). The training section's fit is
re-stated for the checkpointed step (its peak, its largest batch by the same linear estimate),
so every surface speaks of the step the user would run (`fxlens.analyzer.checkpoint.fit`).

`selective_planner` hands the same solver to the fix finder (`fxlens.analyzer.fixes.training`),
which offers ``--checkpoint auto`` where it makes the step fit; the costly part of the problem
(`checkpoint_problem`) is built once per run, on the context, for both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fxlens import checks
from fxlens.analyzer.checkpoint.choose import (
    CheckpointError,
    Problem,
    Request,
    checkpoint_problem,
    selective_checkpointing,
)
from fxlens.analyzer.checkpoint.fit import with_fit
from fxlens.analyzer.checkpoint.modules import ModuleProblem, module_checkpointing, module_problem
from fxlens.analyzer.core.aten import resolve_op
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.section import Section
from fxlens.analyzer.core.sections import SelectiveCheckpointing, Training
from fxlens.analyzer.fixes.training import SelectivePlanner
from fxlens.analyzer.time.roofline import node_times, optimizer_time, throughput_basis
from fxlens.rules.checkpoint import FAMILY_ORDER, op_family, runtime_ops

if TYPE_CHECKING:
    from fxlens.pipeline import Context


class CheckpointPass:
    name = "selective checkpointing"
    provides: tuple[type[Section], ...] = (SelectiveCheckpointing, Training)
    needs: tuple[type[Section], ...] = (Training,)

    def wanted(self, options: Any) -> bool:
        return bool(options.train and options.checkpoint_auto)

    def run(self, ctx: Context, report: Report) -> Sequence[Section]:
        assert ctx.step is not None, "the pipeline captures the step before the passes"
        ctx.on_step("choosing what to save and what to recompute under the budget")
        training = report.get(Training)
        assert training is not None
        budget_from, budget = checks.checkpoint_budget(ctx.options)
        request = _request(ctx, report, training, budget, budget_from)
        section = _section(ctx, report, training, request, shared_problem(ctx, report, request))
        return section, with_fit(training, section, throughput_basis(ctx.step.graph).samples)


def _section(ctx: Context, report: Report, training: Training, request: Request,
             problem: Problem | ModuleProblem, curve: bool = True) -> SelectiveCheckpointing:
    """The section for `request`'s budget, by op or by module as the problem was built
    (without the memory–time curve when not `curve`: by op, the curve's solves are skipped)."""
    assert ctx.step is not None
    if isinstance(problem, ModuleProblem):
        return module_checkpointing(ctx.step, report, ctx.registry, training, request, problem)
    return selective_checkpointing(ctx.step, report, ctx.registry, training, request, problem,
                                   curve)


def shared_problem(ctx: Context, report: Report, request: Request
                   ) -> Problem | ModuleProblem:
    """The step's checkpointing problem at the run's granularity (by op, unless
    ``--checkpoint auto --checkpoint-granularity module``), built on first use and kept on the
    context (the fix finder and the pass ask for it on the same step, with the same costs)."""
    assert ctx.step is not None
    options = ctx.options
    build = (module_problem if options.checkpoint_auto
             and options.checkpoint_granularity == "module" else checkpoint_problem)
    if ctx.checkpoint_problem is None:
        try:
            ctx.checkpoint_problem = build(ctx.step, report, ctx.registry, request)
        except CheckpointError as error:
            ctx.checkpoint_problem = error
    if isinstance(ctx.checkpoint_problem, CheckpointError):
        raise ctx.checkpoint_problem
    assert isinstance(ctx.checkpoint_problem, (Problem, ModuleProblem))
    return ctx.checkpoint_problem


def selective_planner(ctx: Context, report: Report, training: Training, device_name: str
                      ) -> SelectivePlanner | None:
    """The selective checkpointer for the fix finder: the section this pass would give for a
    training state and a budget; None where the model has no blocks it can checkpoint, or the
    run checkpoints every block (``--checkpoint``)."""
    options = ctx.options
    if options.checkpoint or training.fit is None:
        return None
    own = checks.checkpoint_budget(options) if options.checkpoint_auto else None
    budget_from, budget = own or (f"{device_name}'s memory", training.fit.device_bytes)
    request = _request(ctx, report, training, budget, budget_from)
    try:
        problem = shared_problem(ctx, report, request)
    except CheckpointError:
        return None

    def plan(changed: Training, budget_bytes: int) -> SelectiveCheckpointing:
        at = dataclasses.replace(request, budget_bytes=budget_bytes)
        return _section(ctx, report, changed, at, problem, curve=False)

    return SelectivePlanner(plan, own[1] if own else None,
                            f"--checkpoint-budget {device_name}" if device_name else "")


def _request(ctx: Context, report: Report, training: Training, budget: int,
             budget_from: str) -> Request:
    spec = ctx.device_spec()
    graph = ctx.analysed()
    if spec is not None:
        cost = {t.id: t.time_s for t in node_times(report, graph, spec, ctx.options.tf32)}
        step_cost = sum(cost.values()) + optimizer_time(training, graph, spec)
        unit, basis = "s", f"roofline time on {spec.name}"
    else:
        cost = {n.id: float(n.flops) for n in report.nodes}
        step_cost = float(training.step_flops)
        unit, basis = "FLOP", "FLOPs (no --device to time them on)"
    return Request(budget_bytes=budget, budget_from=budget_from, cost=cost, cost_unit=unit,
                   cost_basis=basis, step_cost=step_cost, family=op_family,
                   families=FAMILY_ORDER, runtime_ops=runtime_ops, savable=_savable)


def _savable(target: str) -> bool:
    """A policy can name it: a real torch op (not one the capture stands in for)."""
    try:
        resolve_op(target)
    except (AttributeError, ValueError, RuntimeError):
        return False
    return True
