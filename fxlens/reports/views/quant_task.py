"""Quantization in the task's terms (`Quant.task`, the model file's ``evaluate(model)``): the
verdict a user acts on ("int4 keeps accuracy 0.973 → 0.968") and the table of every run.

A metric's change is relative to its original value, signed so that a worse value reads as a
loss whatever its direction (accuracy falls, perplexity rises); "keeps the task" means every
metric stayed within the tolerance (1 % by default: MLPerf's 99 % accuracy target).
"""

from __future__ import annotations

from fxlens.analyzer.core.sections import QuantTask, TaskRun, metric_lost
from fxlens.reports.view import Cell, Column, Table, Tone


def task_run(task: QuantTask, weights: str) -> TaskRun | None:
    """The run of `weights` (a format name, or "plan NAME")."""
    return next((run for run in task.runs if run.weights == weights), None)


def keeps_words(task: QuantTask, run: TaskRun) -> str:
    """"keeps the task (every metric within 1 %)" or what it changes beyond the tolerance."""
    within = f"{task.tolerance * 100:.3g} %"
    if run.keeps:
        return f"keeps the task: every metric of evaluate() within {within}"
    lost = [name for name, before in task.original.items()
            if metric_lost(before, run.values.get(name), name in task.lower_is_better,
                           task.tolerance)]
    return f"changes the task: {', '.join(lost)} worse by more than {within}"


def metric_change(task: QuantTask, run: TaskRun, name: str | None = None) -> str:
    """``accuracy 0.9733 → 0.9683 (−0.51 %)`` for `name` (default: the first metric)."""
    name = name or next(iter(task.original))
    before, after = task.original[name], run.values.get(name)
    if after is None:
        return f"{name} {_figure(before)} → not returned"
    return f"{name} {_figure(before)} → {_figure(after)} ({_change(before, after)})"


def task_table(task: QuantTask) -> Table:
    """Every run: the weights' formats, the activations, each metric and the verdict."""
    names = list(task.original)
    activations = any(run.activations is not None for run in task.runs)
    columns = (Column("weights", strong=True, no_wrap=True),
               *((Column("activations"),) if activations else ()),
               *(Column(_label(task, n), right=True) for n in names), Column("task"))
    rows: list[list[str | Cell]] = [["unquantized", *([AS_THEY_ARE] if activations else []),
                                     *(_figure(task.original[n]) for n in names), ""]]
    for run in task.runs:
        verdict = Cell("kept", Tone.GOOD) if run.keeps else Cell("changed", Tone.BAD)
        rows.append([run.weights, *([run.activations or AS_THEY_ARE] if activations else []),
                     *(_cell(task, run, n) for n in names), verdict])
    return Table.of("quantization in the task's terms (evaluate())", columns, rows,
                    caption=f"the model file's evaluate(model) with each format on every "
                            f"layer, and the plan at its formats; ↑ higher is better, ↓ lower; "
                            f"task kept: every metric within {task.tolerance * 100:.3g} % of its "
                            f"value (--quant-tolerance)")


AS_THEY_ARE = "as they are"


def _label(task: QuantTask, name: str) -> str:
    return f"{name} {'↓' if name in task.lower_is_better else '↑'}"


def _cell(task: QuantTask, run: TaskRun, name: str) -> str:
    before, after = task.original[name], run.values.get(name)
    if after is None:
        return "—"
    return _figure(after) if after == before else f"{_figure(after)} ({_change(before, after)})"


def _change(before: float, after: float) -> str:
    if before == 0:
        return f"{after - before:+.3g}".replace("-", "−")
    return f"{(after - before) / abs(before):+.2%}".replace("-", "−")


def _figure(value: float) -> str:
    """Four significant digits, trailing zeros kept (1.000, 0.9961, 12.35)."""
    return f"{value:#.4g}".rstrip(".")

