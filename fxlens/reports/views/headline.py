"""The headline: one number per concept, labelled by what it counts, for the first screen of
every surface (the HTML page's cards, the Markdown comment's table)."""

from __future__ import annotations

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Findings, KVCache, Memory, Roofline, Training
from fxlens.reports.units import binary_bytes, seconds, si
from fxlens.reports.view import Figure, Tone


def headline(report: Report) -> tuple[Figure, ...]:
    model, totals, coverage = report.model, report.totals, report.coverage
    training = report.get(Training)
    missing = sum(coverage.unsupported.values()) + len(coverage.failed)
    figures = [
        Figure("parameters", si(model.params), binary_bytes(model.param_bytes)),
        (Figure("step FLOPs", si(totals.flops, "FLOP"),
                f"forward {si(training.forward_flops)} · backward "
                f"{si(training.backward_flops)} · {si(totals.macs, 'MAC')}")
         if training is not None else
         Figure("forward FLOPs", si(totals.flops, "FLOP"), si(totals.macs, "MAC"))),
        Figure("bytes moved", binary_bytes(totals.bytes_read + totals.bytes_written),
               f"read {binary_bytes(totals.bytes_read)} · written "
               f"{binary_bytes(totals.bytes_written)}"),
        Figure("coverage", f"{coverage.ratio:.1%}",
               f"{coverage.costed} costed · {coverage.free} free · {missing} missing",
               Tone.BAD if missing else Tone.PLAIN),
    ]
    memory = report.get(Memory)
    if memory is not None and training is None:
        figures.append(Figure("activation peak", binary_bytes(memory.peak_activation_bytes),
                              f"at node {memory.peak_node} in {memory.peak_module or '(root)'}"))
    if training is not None:
        figures.append(Figure("training step peak", binary_bytes(training.step_peak_bytes),
                              f"{training.precision} · {training.optimizer}"))
        if training.fit is not None:
            fit = training.fit
            figures.append(Figure(f"fits {fit.device}", "yes" if fit.fits else "no",
                                  f"headroom {binary_bytes(fit.headroom_bytes)}",
                                  Tone.GOOD if fit.fits else Tone.BAD))
    cache = report.get(KVCache)
    if cache is not None:
        figures.append(Figure("KV cache", binary_bytes(cache.total_bytes),
                              f"batch {cache.batch} · context {cache.context}"))
    roofline = report.get(Roofline)
    if roofline is not None:
        what = "step" if roofline.totals.step_time_s is not None else "forward"
        figures.append(Figure(f"estimated {what} time", seconds(roofline.totals.total_s),
                              roofline.device.name))
    found = report.get(Findings)
    if found is not None and found.items:
        saved = sum(f.saved_bytes for f in found.items)
        figures.append(Figure("fusion findings", str(len(found.items)),
                              f"{binary_bytes(saved)} saveable"))
    return tuple(figures)
