"""The public API as functions: `load`, `capture`, `analyze`, and `analyze_target` for all three.

    from fxlens.api import AnalysisOptions, analyze_target
    from fxlens.analyzer.core.sections import Training
    report = analyze_target("examples/tiny_gpt.py", AnalysisOptions(train=True))
    print(report.totals.flops, report.require(Training).step_peak_bytes)

The work itself is `fxlens.pipeline`: one capture per shape, the cost engine, then every
analysis pass the options ask for, for inference and training alike.
"""

from __future__ import annotations

from collections.abc import Callable

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.capture.load import load
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.cost.engine import analyze
from fxlens.pipeline import AnalysisOptions, check_options, run_pipeline
from fxlens.rules import load_rules
from fxlens.rules.hardware import DeviceSpec

__all__ = ["AnalysisOptions", "analyze", "analyze_loaded", "analyze_target", "capture", "load",
           "load_rules"]


def analyze_target(
    target: str,
    options: AnalysisOptions = AnalysisOptions(),
    on_step: Callable[[str], None] = lambda _: None,
    on_costed: Callable[[Report], None] | None = None,
) -> Report:
    """Load `target`, capture it (a training step with `options.train`) and run every
    analysis the options ask for; `on_costed` as in `analyze_loaded`."""
    check_options(options)   # every option before the model's code runs
    on_step(f"loading {target}")
    loaded = load(target, options.entry, options.overrides, options.sizes, options.allow_large)
    return analyze_loaded(loaded, options, on_step, on_costed=on_costed)


def analyze_loaded(
    loaded: LoadedModel,
    options: AnalysisOptions = AnalysisOptions(),
    on_step: Callable[[str], None] = lambda _: None,
    device: DeviceSpec | None = None,
    on_costed: Callable[[Report], None] | None = None,
) -> Report:
    """Capture a loaded model (a training step with `options.train`) and run every analysis
    the options ask for; `device` replaces the one `options.device` names; `on_costed` is
    given the report once its ops are costed, before the other analyses."""
    return run_pipeline(loaded, options, on_step, device, on_costed)
