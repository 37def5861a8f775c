"""The ``--checkpoint auto`` pass: which tensors of the repeated blocks to save and which to
recompute under a memory budget (`fxlens.analyzer.checkpoint`), and the training fit it gives.

Joins the engine and the rules as the pipeline does: what an op costs to recompute is its
roofline time on ``--device`` (`fxlens.analyzer.time.roofline.node_times`, as the roofline
section times it), else its FLOPs; op families and the attention kernels a policy must name
come from `fxlens.rules.checkpoint`. The budget: ``--checkpoint-budget``, else ``--device-mem``,
else the device's memory (`fxlens.checks.checkpoint_budget`). The training section's fit is
re-stated for the checkpointed step (its peak, its largest batch by the same linear estimate),
so every surface speaks of the step the user would run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fxlens import checks
from fxlens.analyzer.checkpoint.choose import Request, selective_checkpointing
from fxlens.analyzer.core.aten import resolve_op
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.section import Section
from fxlens.analyzer.core.sections import SelectiveCheckpointing, Training
from fxlens.analyzer.memory.training_state import LinearActivation, fits, largest_batch
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
        section = selective_checkpointing(ctx.step, report, ctx.registry, training,
                                          _request(ctx, report, training, budget, budget_from))
        return section, _with_fit(training, section, throughput_basis(ctx.step.graph).samples)


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


def _with_fit(training: Training, section: SelectiveCheckpointing, samples: int
              ) -> Training:
    """The training section with its fit for the checkpointed step; the largest batch by the
    training section's linear estimate, under the same policy."""
    fit = training.fit
    if fit is None:
        return training
    peak = training.peak_breakdown
    verdict = fits(section.peak_after_bytes, fit.device_bytes)
    activations = max(section.fwd_bwd_peak_bytes - peak.gradients_at_peak_bytes, 0)
    per_sample = LinearActivation.proportional(samples, activations)
    room = peak.persistent_bytes + peak.optimizer_phase_bytes <= fit.device_bytes
    batch = largest_batch(peak.persistent_bytes + peak.gradients_at_peak_bytes, per_sample,
                          fit.device_bytes) if room else 0
    return dataclasses.replace(training, fit=dataclasses.replace(
        fit, fits=verdict.fits, headroom_bytes=verdict.headroom_bytes,
        utilisation=verdict.utilisation, needed_bytes=section.peak_after_bytes,
        with_checkpointing=section.checkpointed, largest_batch=batch,
        fixes=() if verdict.fits else fit.fixes))
