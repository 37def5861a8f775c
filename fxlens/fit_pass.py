"""The inference fit pass: does the forward (+ KV cache) fit the roofline device, and what
change makes it fit (`fxlens.analyzer.fixes.inference`). A training step has its own fit,
in the training section."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.section import Section
from fxlens.analyzer.core.sections import InferenceFit, Memory, Roofline
from fxlens.analyzer.fixes.inference import inference_fit

if TYPE_CHECKING:
    from fxlens.pipeline import Context


class InferenceFitPass:
    name = "inference-fit"
    provides: tuple[type[Section], ...] = (InferenceFit,)
    needs: tuple[type[Section], ...] = (Memory, Roofline)

    def wanted(self, options: Any) -> bool:
        return not options.train and options.device is not None

    def run(self, ctx: Context, report: Report) -> Sequence[Section]:
        fit = inference_fit(report)
        assert fit is not None, "the memory and roofline passes ran before"
        return (fit,)
