"""The answer first: one number per concept, labelled by what it counts, and every verdict that
applies with the change that would fix it. The first screen of every surface starts here
(the terminal summary, the HTML cards, the Markdown table)."""

from __future__ import annotations

import math

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import (
    Findings,
    FixOption,
    Fusion,
    InferenceFit,
    KVCache,
    Memory,
    Plan,
    Prune,
    Quant,
    Roofline,
    SelectiveCheckpointing,
    Serve,
    Training,
)
from fxlens.reports.units import binary_bytes, seconds, si
from fxlens.reports.view import Figure, Tone
from fxlens.reports.views.fusion import default_saving, findings_saving
from fxlens.reports.views.plan import plan_verdict
from fxlens.reports.views.prune import prune_verdict
from fxlens.reports.views.quant import quant_verdicts
from fxlens.reports.views.serve import serve_verdict


def inputs_text(report: Report) -> str:
    """``idx 2×16 int64, mask 2×16 bool`` (what the graph was captured on)."""
    return ", ".join(f"{i.name} {'×'.join(map(str, i.shape)) or 'scalar'} {i.dtype}"
                     for i in report.model.inputs)


def activation_peak(memory: Memory) -> tuple[int, str]:
    """The activation peak a user running PyTorch eagerly sees, and what it is: the simulated
    eager peak when there is one, else the graph executor's."""
    if memory.eager is not None and memory.eager.peak_bytes is not None:
        graph = ("the same" if memory.peak_activation_bytes == memory.eager.peak_bytes else
                 f"at {binary_bytes(memory.peak_activation_bytes)}")
        what = f"eager forward (simulated); a graph executor peaks {graph}"
    else:
        what = "graph executor (tensors freed at last use)"
    return memory.activation_peak_bytes, what


def headline(report: Report) -> tuple[Figure, ...]:
    model, totals = report.model, report.totals
    training = report.get(Training)
    figures = [Figure("parameters", si(model.params), binary_bytes(model.param_bytes))]
    if training is not None:
        figures.append(Figure("training step FLOPs", si(training.step_flops, "FLOP"),
                              f"forward {si(training.forward_flops)} · backward "
                              f"{si(training.backward_flops)} · optimizer "
                              f"{si(training.optimizer_flops)}"))
    else:
        figures.append(Figure("forward FLOPs", si(totals.flops, "FLOP"),
                              si(totals.macs, "MAC")))
    figures.append(Figure("bytes moved", binary_bytes(totals.bytes_read + totals.bytes_written),
                          f"read {binary_bytes(totals.bytes_read)} · written "
                          f"{binary_bytes(totals.bytes_written)}"))
    figures += _memory_figures(report)
    roofline = report.get(Roofline)
    if roofline is not None and report.get(Plan) is None:   # a plan gives its own step time
        what = "step" if roofline.totals.step_time_s is not None else "forward"
        figures.append(Figure(f"estimated {what} time", seconds(roofline.totals.total_s),
                              f"{roofline.device.name}, MFU {roofline.mfu:.1%}"))
    found, fusion = report.get(Findings), report.get(Fusion)
    if found is not None and found.items:
        skipped = sum(f.saved_flops for f in found.items)
        figures.append(Figure("fusion findings", str(len(found.items)),
                              f"fixing them saves {binary_bytes(findings_saving(found))} of "
                              f"traffic" + (f" · {si(skipped, 'FLOP')} of work" if skipped
                                            else "")
                              + (f" (a compiler's default fusion: "
                                 f"{binary_bytes(default_saving(fusion))})"
                                 if fusion is not None else "")))
    return tuple(figures) + verdicts(report)


def _memory_figures(report: Report) -> list[Figure]:
    training, memory, cache = report.get(Training), report.get(Memory), report.get(KVCache)
    weights = report.model.param_bytes + report.model.buffer_bytes
    if training is not None and report.get(Plan) is not None:
        return [Figure("unsharded step peak", binary_bytes(training.step_peak_bytes),
                       f"{training.recipe}; per GPU: the plan")]
    sac = report.get(SelectiveCheckpointing)
    if training is not None and sac is not None:
        how = (f"with selective checkpointing, +{sac.recompute_share:.0%} recompute (without: "
               f"{binary_bytes(sac.peak_before_bytes)})" if sac.checkpointed else
               "no checkpointing: the step fits the budget" if sac.fits else
               "checkpointing lowers nothing: the optimizer step sets the peak")
        return [Figure("training step peak", binary_bytes(sac.peak_after_bytes),
                       f"{training.recipe}, {how}")]
    if training is not None:
        checkpointed = training.checkpointed_peak_bytes
        if checkpointed is not None:     # the configuration the verdict is about
            return [Figure("training step peak", binary_bytes(checkpointed),
                           f"{training.recipe}, with checkpointing "
                           f"(without: {binary_bytes(training.step_peak_bytes)})")]
        what, size = training.peak_breakdown.on_top
        return [Figure("training step peak", binary_bytes(training.step_peak_bytes),
                       f"{training.recipe}: persistent "
                       f"{binary_bytes(training.peak_breakdown.persistent_bytes)} + "
                       f"{what} {binary_bytes(size)}")]
    out = []
    if memory is not None:
        peak, what = activation_peak(memory)
        out.append(Figure("activation peak", binary_bytes(peak), what))
        parts = f"weights {binary_bytes(weights)} + activations {binary_bytes(peak)}"
        total = weights + peak
        if cache is not None:
            total += cache.total_bytes
            parts += f" + KV cache {binary_bytes(cache.total_bytes)}"
        out.append(Figure("memory total", binary_bytes(total), parts, Tone.STRONG))
    if cache is not None:
        out.append(Figure("KV cache", binary_bytes(cache.total_bytes),
                          f"batch {cache.batch} · context {cache.context}"))
    return out


def verdicts(report: Report) -> tuple[Figure, ...]:
    """Every verdict that applies: coverage gaps, does it fit, can the weights go to 4 bits,
    with what would change it."""
    out = []
    coverage = report.coverage
    missing = sum(coverage.unsupported.values()) + len(coverage.failed)
    if missing:
        ops = ", ".join([*coverage.unsupported, *coverage.failed])
        out.append(Figure("coverage", f"{missing} ops not costed",
                          f"totals undercount: {ops}", Tone.BAD))
    training = report.get(Training)
    if training is not None and training.fit is not None and report.get(Plan) is None:
        out.append(training_fit(training, report.get(SelectiveCheckpointing)))
        # with a plan, the plan's verdict speaks
    elif training is None and report.get(Serve) is None:   # serving: its capacity speaks
        fit = _inference_fit(report)
        if fit is not None:
            out.append(fit)
    plan = report.get(Plan)
    if plan is not None:
        out.append(plan_verdict(plan))
    quant = report.get(Quant)
    if quant is not None:
        out += quant_verdicts(quant)
    serve = report.get(Serve)
    if serve is not None:
        out.append(serve_verdict(serve))
    prune = report.get(Prune)
    verdict = prune_verdict(prune) if prune is not None else None
    if verdict is not None:
        out.append(verdict)
    return tuple(out)


def training_fit(training: Training, sac: SelectiveCheckpointing | None = None) -> Figure:
    """The step against its device; with ``--checkpoint auto`` the checkpointed step's peak
    (the fit is re-stated for it, `fxlens.ckpt_pass`)."""
    fit = training.fit
    assert fit is not None
    where = f"{fit.device} ({binary_bytes(fit.device_bytes)} usable)"
    checkpointed = ((" with selective checkpointing" if sac is not None else
                     " with checkpointing") if fit.with_checkpointing else "")
    if fit.fits:
        return Figure(f"fits {fit.device}", "yes",
                      f"needs {binary_bytes(fit.needed_bytes)}{checkpointed} of {where}; "
                      f"largest batch {si(fit.largest_batch)}", Tone.GOOD)
    return Figure(f"fits {fit.device}", "no",
                  f"needs {binary_bytes(fit.needed_bytes)}{checkpointed}, "
                  f"{binary_bytes(-fit.headroom_bytes)} over {where}; {_fix(training)}",
                  Tone.BAD)


def _fix(training: Training) -> str:
    """The re-estimated changes that make the step fit (`fxlens.analyzer.fixes`); where no
    change on one device does, what to shard."""
    fit = training.fit
    assert fit is not None
    if fit.fixes:
        return "fits with " + " or ".join(_fix_text(fix) for fix in fit.fixes)
    state = training.state_bytes
    if state >= fit.device_bytes:
        gpus = max(math.ceil(state / (0.9 * fit.device_bytes)), 2)
        return (f"no change on one {fit.device} fits (weights, gradients and optimizer "
                f"state take {binary_bytes(state)}): shard them over ≥ {gpus} GPUs, and "
                f"check it with --plan --gpus {gpus}")
    return ("none of the changes re-estimated (an 8-bit optimizer, pure bf16 and "
            "checkpointing, every block or selective, where they apply; alone or together) "
            "makes it fit: the activations need a smaller batch or sequence"
            + (f" (batch {fit.largest_batch} by a linear estimate)" if fit.largest_batch
               else ""))


def _fix_text(fix: FixOption) -> str:
    """``--precision bf16 (75.39 GiB)``; a layout over GPUs with its peak per GPU."""
    if fix.flags.startswith("--plan"):
        return f"{fix.flags} ({fix.change}: {binary_bytes(fix.needed_bytes)} per GPU)"
    return (f"{fix.flags} ({binary_bytes(fix.needed_bytes)}"
            + (f", +{_share(fix.recompute_overhead)} FLOPs recomputed" if fix.recompute_overhead
               else "")
            + ")")


def _share(share: float) -> str:
    """A recompute share of the step: whole percent, a tenth below 10 %, and a selective
    policy's few saved ops still not "0%"."""
    if share >= 0.1:
        return f"{share:.0%}"
    return f"{share:.1%}" if share >= 0.001 else "<0.1%"


def _inference_fit(report: Report) -> Figure | None:
    """Weights + activation peak (+ KV cache) against the roofline device's memory, and the
    change that makes it fit (`fxlens.analyzer.fixes.inference`)."""
    fit = report.get(InferenceFit)
    if fit is None or not fit.judged:
        return None
    label = f"fits {fit.device}"
    needs = f"needs {binary_bytes(fit.needed_bytes)} of {binary_bytes(fit.device_bytes)} usable"
    if fit.fits:
        return Figure(label, "yes", needs, Tone.GOOD)
    parts = [needs]
    if fit.weights_bytes >= fit.device_bytes:
        parts.append(f"the weights alone take {binary_bytes(fit.weights_bytes)}: no batch "
                     f"fits one {fit.device}; weight-only int4 (check with --quant-plan "
                     f"w4a16), a larger device or the weights sharded over GPUs")
    elif fit.fixes:
        parts.append("fits with " + " or ".join(
            f"{fix.flags} ({binary_bytes(fix.needed_bytes)}: {fix.change})"
            for fix in fit.fixes))
    else:
        parts.append("not even one sample's activations fit beside the weights")
    if fit.decode_bytes is not None and fit.decode_bytes <= fit.device_bytes:
        parts.append(f"decoding all {fit.batch} sequences needs "
                     f"{binary_bytes(fit.decode_bytes)}: it is prefilling the whole batch at "
                     f"once that does not fit")
    return Figure(label, "no", "; ".join(parts), Tone.BAD)
