"""The ``--prune`` pass: coupled groups of the inference forward, what each unit saves, and with
``--prune-target`` a plan and (``--prune-save``) the pruned module written with ``torch.save``
(`fxlens.analyzer.prune.section`). Joins the engine and the rules as the pipeline does: the axis
rules and attribute fixes come from `fxlens.rules.prune`, costs from the run's rule registry.

Where the model file gives ``calibration()``, its batches (the same that ``--quant-calibrate``
reads) rank the units by the measured damage of removing each (`calibration_data`), by the
metric ``--quant-calibrate``'s ``auto`` rule picks from one forward (KL over logit leaves, else
the output error power); without it the data-free scores rank.

The forward is costed here on its own when the run analyses a training step (the plan speaks
of forward FLOPs); otherwise the run's report already holds those costs. With ``--train``
each removal's training step is recorded as the run records its own (same precision cast,
autocast and attention kernels), and the run's step is the baseline; with ``--device`` the
roofline of the same device rates the times (`fxlens.analyzer.prune.savings`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.section import Section
from fxlens.analyzer.core.sections import Prune
from fxlens.analyzer.cost.engine import analyze

if TYPE_CHECKING:
    from fxlens.analyzer.prune.calibrated import CalibrationData
    from fxlens.analyzer.prune.savings import StepCapture
    from fxlens.pipeline import Context


class PrunePass:
    name = "structured pruning"
    provides: tuple[type[Section], ...] = (Prune,)
    needs: tuple[type[Section], ...] = ()

    def wanted(self, options: Any) -> bool:
        return bool(options.prune or options.prune_target or options.prune_save)

    def run(self, ctx: Context, report: Report) -> Sequence[Section]:
        import dataclasses

        from fxlens.analyzer.prune.module import save
        from fxlens.analyzer.prune.plan import parse_target
        from fxlens.analyzer.prune.section import prune
        from fxlens.rules.prune import knowledge

        options = ctx.options
        if options.prune_save and not options.prune_target:
            raise LoadError("--prune-save writes the planned module: add --prune-target, "
                            "e.g. --prune-target 30%")
        target = parse_target(options.prune_target) if options.prune_target else None
        graph = ctx.forward()
        forward = report if ctx.step is None else analyze(graph, ctx.registry)
        calibration = calibration_data(ctx.loaded, ctx.registry)
        result = prune(ctx.loaded.module, ctx.loaded.inputs, graph, forward, knowledge(),
                       ctx.registry, target, ctx.on_step, calibration, _step_capture(ctx),
                       ctx.device_spec(), options.tf32,
                       ctx.step)
        section = result.section
        if options.prune_save and result.module is not None:
            path = Path(options.prune_save)
            ctx.on_step(f"writing the pruned module to {path}")
            path.parent.mkdir(parents=True, exist_ok=True)
            save(result.module, path)
            section = dataclasses.replace(section, saved_to=str(path))
        elif options.prune_save:
            section = dataclasses.replace(section, notes=(
                *section.notes, f"nothing written to {options.prune_save}: no unit can be "
                "removed"))
        return (section,)


def _step_capture(ctx: Context) -> StepCapture | None:
    """With --train, a module's training step recorded as the run records its own."""
    if ctx.step is None:
        return None
    from fxlens.step_recording import record_training_step

    return lambda module: record_training_step(ctx, module)


def calibration_data(loaded: LoadedModel, registry: CostRegistry | None = None
                     ) -> CalibrationData | None:
    """The model file's ``calibration()`` batches with the metric quantization's ``auto``
    rule picks for them; None without ``calibration()`` or on meta weights."""
    from fxlens.analyzer.capture.load import calibration_batches
    from fxlens.analyzer.prune.calibrated import CalibrationData
    from fxlens.analyzer.quant.calibrated import output_model
    from fxlens.analyzer.quant.weights import find_layers
    from fxlens.rules.quant import knowledge as quant_knowledge

    module = loaded.module
    if loaded.calibration is None or any(p.is_meta for p in module.parameters()):
        return None
    batches = calibration_batches(loaded)
    rules = quant_knowledge(registry=registry)
    was_training = module.training
    module.eval()
    try:
        metric, output = output_model(module, find_layers(module, rules), batches[0], rules)
    finally:
        module.train(was_training)
    return CalibrationData(batches, "calibration()", metric, output.leaves)
