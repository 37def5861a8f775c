"""The view of ``--checkpoint auto`` (`SelectiveCheckpointing`): the answer (peak before and
after, the recompute it costs), the policy per group of alike blocks in words and op by op (or
the child modules wrapped), the memory–time curve over budgets (a table, and in HTML a chart
with this run's budget marked), and the policy as code to paste."""

from __future__ import annotations

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import SelectiveCheckpointing
from fxlens.reports.units import binary_bytes, seconds, short_op, si
from fxlens.reports.view import (
    Cell,
    Chart,
    Code,
    Column,
    Detail,
    Mark,
    Series,
    Table,
    Tone,
    View,
    columns,
)


def cost_text(value: float, unit: str) -> str:
    """Recompute in the section's unit: roofline seconds, else FLOPs."""
    return seconds(value) if unit == "s" else si(value, "FLOP")


def checkpoint_view(report: Report, detail: Detail) -> View | None:
    sac = report.get(SelectiveCheckpointing)
    if sac is None:
        return None
    by_module = sac.granularity == "module"
    blocks: list[Table | Code | Chart] = [answer(sac)]
    if sac.policies:
        blocks.append(policies(sac))
    if any(p.saved for p in sac.policies):
        blocks.append(saved_ops(sac))
    if sac.least_peak_bytes < sac.peak_before_bytes:
        blocks += [curve(sac), curve_chart(sac)]
    if sac.code:
        blocks.append(Code("the policy as code: torch.utils.checkpoint around the recomputed "
                           "child modules" if by_module else
                           "the policy as code: torch.utils.checkpoint, selective", sac.code))
    return View("checkpoint", "Selective checkpointing", tuple(blocks))


def answer(sac: SelectiveCheckpointing) -> Table:
    over = sac.peak_after_bytes - sac.budget_bytes
    verdict = (Cell("fits", Tone.GOOD) if sac.fits else
               Cell(f"{binary_bytes(over)} over", Tone.BAD))
    if not sac.checkpointed:
        after_text = ("the step fits the budget without checkpointing" if sac.fits else
                      "checkpointing lowers nothing: the optimizer step (gradients and its "
                      "temporaries) sets the peak")
    elif sac.fits:
        spare = binary_bytes(sac.budget_bytes - sac.peak_after_bytes)
        after_text = f"the policy below; {spare} to spare"
    else:
        after_text = "no policy fits: the policy below reaches the least peak"
    rows: list[tuple[str | Cell, ...]] = [
        ("budget", binary_bytes(sac.budget_bytes), sac.budget_from),
        ("step peak without", binary_bytes(sac.peak_before_bytes), "no checkpointing"),
        (Cell("step peak with", Tone.STRONG), Cell(binary_bytes(sac.peak_after_bytes),
                                                   Tone.STRONG), after_text),
        ("", verdict, f"first step (optimizer state made in it): "
                      f"{binary_bytes(sac.first_step_peak_bytes)}"),
        ("least possible", binary_bytes(sac.least_peak_bytes),
         "every child module of every block recomputed" if sac.granularity == "module" else
         "every op of every block recomputed (--checkpoint)"),
        (Cell("recompute added", Tone.STRONG), Cell(cost_text(sac.recompute, sac.cost_unit),
                                                    Tone.STRONG),
         f"{sac.recompute_share:.1%} of the step ({sac.cost_basis}); "
         f"{si(sac.recompute_flops, 'FLOP')}"),
        ("solver", "exact" if sac.exact else f"+{sac.gap:.1%} at most",
         sac.solver if sac.exact else f"{sac.solver}; recompute within {sac.gap:.1%} of "
                                      f"the bound"),
    ]
    return Table.of("selective checkpointing under a budget",
                    (Column("", strong=True), Column("", right=True), Column("")), rows,
                    caption="peaks of the steady step, simulated with the policy; the "
                            "forward's outputs held through the backward, as a training "
                            "loop's `out` is", show_header=False)


def policies(sac: SelectiveCheckpointing) -> Table:
    rows = [(_blocks(p.blocks), p.summary, f"{p.saved_ops} of {p.ops}",
             binary_bytes(p.saved_bytes), cost_text(p.recompute, sac.cost_unit))
            for p in sac.policies]
    if sac.granularity == "module":
        return Table.of("the policy per block: child modules wrapped in checkpoint", columns(
            ("blocks", "recomputed / kept"), ("modules kept", "saved per block",
                                              "recompute per block")), rows,
            caption="modules: a block's outermost children that keep tensors for the "
                    "backward; a kept one's saved tensors stay, a recomputed one keeps its "
                    "inputs")
    return Table.of("the policy per block", columns(
        ("blocks", "saved / recomputed"), ("ops saved", "kept per block",
                                           "recompute per block")), rows,
        caption="ops: those a block's recompute runs that a policy may save (views alias "
                "their input, nothing to keep)")


def saved_ops(sac: SelectiveCheckpointing) -> Table:
    rows = [(_blocks(p.blocks), short_op(op.target),
             "every call" if op.every else ", ".join(map(str, op.calls)),
             binary_bytes(op.bytes))
            for p in sac.policies for op in p.saved]
    return Table.of("ops saved (MUST_SAVE), by overload",
                    columns(("blocks", "op", "calls (0-based, per block)"), ("kept",)), rows)


def curve(sac: SelectiveCheckpointing) -> Table:
    rows = [(binary_bytes(p.budget_bytes), binary_bytes(p.peak_bytes),
             cost_text(p.recompute, sac.cost_unit), f"{p.recompute_share:.1%}",
             str(p.saved_ops),
             Cell("yes", Tone.GOOD) if p.fits else Cell("no", Tone.BAD))
            for p in sac.curve]
    return Table.of("memory–time curve: the policy chosen for each budget",
                    columns((), ("budget", "step peak", "recompute", "of the step",
                                 "modules kept" if sac.granularity == "module" else
                                 "ops saved", "fits")), rows,
                    caption=f"from every {'child module' if sac.granularity == 'module' else 'op'}"
                            " recomputed to no checkpointing; a tighter budget never gets a "
                            "higher peak")


def curve_chart(sac: SelectiveCheckpointing) -> Chart:
    """The curve drawn: recompute against the budget, this run's budget marked where it falls
    in the curve's span (a budget past it is marked at its end: no more to spare there)."""
    points = tuple((float(p.budget_bytes), p.recompute) for p in sac.curve)
    at = min(max(sac.budget_bytes, sac.curve[0].budget_bytes), sac.curve[-1].budget_bytes)
    label = (f"this run: {binary_bytes(sac.budget_bytes)} → "
             f"{cost_text(sac.recompute, sac.cost_unit)}")
    return Chart("memory–time curve", "budget", "recompute per step", "B", sac.cost_unit,
                 (Series("the policy chosen for each budget", points),),
                 (Mark(label, float(at), sac.recompute),),
                 caption="each point: the least recompute whose step peak fits the budget; "
                         "the ring: the policy of this run")


def _blocks(blocks: tuple[str, ...]) -> str:
    return blocks[0] if len(blocks) == 1 else f"{blocks[0]} … ×{len(blocks)}"
