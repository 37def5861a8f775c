"""Quantization in the task's terms: the model file's ``evaluate(model)`` on the model as it is,
then with every layer at each weight format, then with the plan's formats.

Per-layer scores say which layers are sensitive; whether the quantized model still does its
job is what the user's own metric says. A CNN whose layers all score "keep higher" at int4 may
keep its accuracy, and a model whose layers all score "ok" may lose it when every error adds
up: so where the model file has an ``evaluate(model) -> {"accuracy": 0.973, ...}``, fxlens
runs it on the model quantized as each verdict proposes and states the verdict in the
metric's terms. A run keeps the task when every metric stays within `tolerance` (relative, of
its original value) in the worse direction (`QuantKnowledge.lower_is_better` says which way
that is; `QuantKnowledge.task_tolerance` the default).

Runs: each weight format on every layer (activations quantized too under ``--activations``,
embeddings' inputs excepted, as calibration does), and the plan (its layers at their formats,
activations as the plan says: int8 for w8a8). The weights are swapped in and restored
(`fxlens.analyzer.quant.apply`); the buffers (BatchNorm running statistics an evaluation in
training mode moves) after every run, the modules' train/eval modes after all: each run starts
from the model as the user gave it, and nothing of it changes, whatever ``evaluate`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from fxlens.analyzer.core.sections import QuantPlan, QuantTask, TaskRun, metric_lost
from fxlens.analyzer.quant.apply import Assignment, quantized
from fxlens.analyzer.quant.types import NumberFormatLike, QuantKnowledge
from fxlens.analyzer.quant.weights import Layer

Evaluate = Callable[[nn.Module], Mapping[str, float]]


def task_effect(module: nn.Module, layers: Sequence[Layer], evaluate: Evaluate,
                knowledge: QuantKnowledge, activations: bool, plan: QuantPlan | None,
                tolerance: float | None = None,
                on_step: Callable[[str], None] = lambda _: None) -> QuantTask:
    """`evaluate` on the model as it is, at every format on every layer, and under `plan`."""
    tolerance = knowledge.task_tolerance if tolerance is None else tolerance
    modes = [(m, m.training) for m in module.modules()]
    try:
        on_step("evaluate(): the model as it is")
        original = _run(module, [], evaluate)
        lower = tuple(sorted(name for name in original if knowledge.lower_is_better(name)))
        runs = []
        for name, fmt in knowledge.formats.items():
            on_step(f"evaluate(): every layer at {name}")
            act = knowledge.activation_format(fmt) if activations else None
            values = _run(module, [_assignment(knowledge, layer, fmt, act) for layer in layers],
                          evaluate)
            runs.append(TaskRun(name, "every layer", _act_name(act), values,
                                keeps(original, values, lower, tolerance)))
        if plan is not None:
            on_step(f"evaluate(): the plan {plan.name}")
            runs.append(_plan_run(module, layers, evaluate, knowledge, plan, original, lower,
                                  tolerance))
    finally:
        for sub, training in modes:
            sub.training = training
    return QuantTask(original=original, lower_is_better=lower, tolerance=tolerance,
                     runs=tuple(runs))


def keeps(original: Mapping[str, float], quantized_values: Mapping[str, float],
          lower_is_better: Sequence[str], tolerance: float) -> bool:
    """Every metric within `tolerance` of its original value, in the worse direction."""
    return not any(metric_lost(before, quantized_values.get(name), name in lower_is_better,
                               tolerance) for name, before in original.items())


def _plan_run(module: nn.Module, layers: Sequence[Layer], evaluate: Evaluate,
              knowledge: QuantKnowledge, plan: QuantPlan, original: Mapping[str, float],
              lower: Sequence[str], tolerance: float) -> TaskRun:
    formats = {**knowledge.formats, **knowledge.extra_formats}
    assignments = []
    for layer in layers:
        fmt = formats.get(plan.precision.get(layer.name, ""))
        if fmt is None:
            continue
        act = (knowledge.activation_format(fmt) if plan.activations == "int8" and fmt.bits <= 8
               else None)
        assignments.append(_assignment(knowledge, layer, fmt, act))
    values = _run(module, assignments, evaluate)
    return TaskRun(f"plan {plan.name}", "the plan's formats",
                   "int8" if plan.activations == "int8" else None, values,
                   keeps(original, values, lower, tolerance))


def _assignment(knowledge: QuantKnowledge, layer: Layer, fmt: NumberFormatLike,
                act: NumberFormatLike | None) -> Assignment:
    embedding = layer.module_type in knowledge.embedding_types
    return Assignment(layer, fmt, None if embedding else act)


def _run(module: nn.Module, assignments: Sequence[Assignment],
         evaluate: Evaluate) -> dict[str, float]:
    buffers = [(b, b.clone()) for b in module.buffers()]
    try:
        with quantized(assignments):
            return dict(evaluate(module))
    finally:
        with torch.no_grad():
            for buffer, original in buffers:
                buffer.copy_(original)


def _act_name(act: NumberFormatLike | None) -> str | None:
    return None if act is None else act.kind if act.kind == "fp8" else f"int{act.bits}"
