"""The public API as functions: `load`, `capture`, `analyze`, and `analyze_target` for all three.

    from fxlens.api import analyze_target
    report = analyze_target("examples/tiny_gpt.py")
    print(report.totals.flops)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fxlens.analyzer.capture import METHODS, capture
from fxlens.analyzer.engine import analyze
from fxlens.analyzer.load import load
from fxlens.analyzer.report import Report
from fxlens.rules import load_rules

__all__ = ["analyze", "analyze_target", "capture", "load", "load_rules"]


def analyze_target(
    target: str,
    entry: str | None = None,
    overrides: Mapping[str, str] | None = None,
    sizes: Mapping[str, int | None] | None = None,
    methods: tuple[str, ...] = METHODS,
    strict: bool = False,
    on_step: Callable[[str], None] = lambda _: None,
) -> Report:
    """Load `target`, capture it and cost every op."""
    on_step(f"loading {target}")
    loaded = load(target, entry, overrides, sizes)
    registry = load_rules()
    graph = capture(loaded.module, loaded.inputs, registry, methods, on_step)
    on_step("costing ops")
    return analyze(graph, registry, loaded.name, loaded.source, strict)
