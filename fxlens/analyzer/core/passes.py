"""The pass protocol: each analysis after costing is a pass that adds typed sections.

A pass says what it provides (section types), what it needs (section types an earlier pass
provides) and whether the options ask for it; `run_passes` runs the wanted ones in the given
order and adds what each returns to the report. Nothing is skipped silently: a wanted pass
whose needs no earlier pass provided is an `AnalysisError` naming both, and a pass that cannot
run raises rather than returning nothing. A pass returns exactly the section types it
declares, which the pipeline checks.

Passes share the capture through their context (one graph per shape, captured on first use),
so two passes that read the forward graph never trace the model twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

from fxlens.analyzer.core.errors import FxlensError
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.section import Section

C = TypeVar("C", contravariant=True)


class AnalysisError(FxlensError):
    """An analysis that was asked for cannot run."""


class Pass(Protocol, Generic[C]):
    """One analysis: `run` returns one section per type in `provides`, in that order."""

    name: str
    provides: tuple[type[Section], ...]
    needs: tuple[type[Section], ...]

    def wanted(self, options: Any) -> bool: ...
    def run(self, context: C, report: Report) -> Sequence[Section]: ...


def run_passes(passes: Sequence[Pass[C]], context: C, options: Any, report: Report) -> Report:
    """`report` with the sections of every pass the options ask for, in order."""
    for analysis in passes:
        if not analysis.wanted(options):
            continue
        missing = [kind.key for kind in analysis.needs if kind.key not in report.sections]
        if missing:
            raise AnalysisError(f"{analysis.name} needs the {', '.join(missing)} section(s), "
                                "which no earlier pass provided")
        sections = tuple(analysis.run(context, report))
        kinds = tuple(type(s) for s in sections)
        if kinds != analysis.provides:
            raise AnalysisError(f"{analysis.name} returned {[k.__name__ for k in kinds]}, "
                                f"declared {[k.__name__ for k in analysis.provides]}")
        report = report.with_(*sections)
    return report
