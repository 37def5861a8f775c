"""The view of ``--prune`` (`Prune`): the plan's answer (target, parameters and FLOPs before and
after, how far an unmet target got, its damage measured on the calibration batches), the
coupled groups with what one unit of each saves (alike groups of repeated blocks in one row;
whole residual blocks are groups of kind "block", alike blocks in one row too), which score
ranks (data-free, or the calibrated damage of removing each unit alone), why the other
parameter axes stay, and the dims the plan moves off a multiple the kernels like, saying which
of them the device model prices (the 16-byte row only: `ALIGNMENT_NOTE`). Where measured:
each unit's training-step FLOPs and saved activations, KV cache per token and forward time on
the device (negative where the cut alone misaligns a GEMM, with the aligned step's time
beside), and the plan's before/after of each, the cut it took (exact or kernel-aligned) and the
one it did not. A model with no prunable group gets one line saying why."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import (
    Prune,
    PruneCalibration,
    PruneCut,
    PruneGroup,
    PrunePlan,
)
from fxlens.reports.units import binary_bytes, percent, seconds, si
from fxlens.reports.view import Cell, Column, Detail, Figure, Table, Tone, View, columns

SHOWN_REASONS = 6
SHOWN_ALIGNMENT = 8
ALIGNMENT_NOTE = ("the device model prices one boundary, measured: a 16- or 8-bit GEMM whose "
                  "rows are not a multiple of 16 bytes (8 bf16 entries) runs on cuBLAS's "
                  "fallback kernels, 0.1 of the peak on Hopper (gemm-misaligned, rules/"
                  "hardware.py); the 64 and 128 multiples of tensor-core tiles are listed "
                  "but not priced, as no measurement backs a penalty for them")


def prune_view(report: Report, detail: Detail) -> View | None:
    section = report.get(Prune)
    if section is None:
        return None
    blocks: list[Table] = []
    if not section.groups:
        blocks.append(_nothing(section))
    if section.plan is not None:
        blocks.append(_plan(section.plan, section.saved_to, section.calibration,
                            section.groups))
    if section.groups:
        blocks.append(_groups(section.groups, section.plan is not None, section.calibration))
    if section.groups and section.blocked:
        blocks.append(_blocked(section))
    if section.plan is not None and section.plan.alignment:
        blocks.append(_alignment(section.plan, detail.full))
    if section.notes:
        blocks.append(Table.of("notes", (Column(""),), [(n,) for n in section.notes],
                               show_header=False))
    return View("prune", "Structured pruning", tuple(blocks))


def prune_verdict(section: Prune) -> Figure | None:
    """The first screen's answer: what the plan removes and what it costs, or why nothing
    can be pruned."""
    plan = section.plan
    if not section.groups:
        return Figure("structured pruning", "no prunable group", _nothing(section).rows[0][0]
                      .plain.removeprefix("no prunable group: "), Tone.WARN)
    if plan is None:
        return Figure("structured pruning", f"{len(section.groups)} groups",
                      "coupled channels, heads, neurons and whole blocks: --prune-target 30% "
                      "plans removing the least important units", Tone.STRONG)
    damage = (f"; damage {_damage(plan.damage, section.calibration)}"
              if plan.damage is not None and section.calibration is not None else "")
    detail = (f"parameters {_change(plan.params_before, plan.params_after)}, forward FLOPs "
              f"{_change(plan.flops_before, plan.flops_after, 'FLOP')}; {plan.units_removed} "
              f"units removed" + _whole_blocks(section.groups) + damage
              + (f"; {_unaligned(plan)}" if plan.alignment else ""))
    before = plan.params_before if plan.basis == "params" else plan.flops_before
    after = plan.params_after if plan.basis == "params" else plan.flops_after
    got = 1 - after / before if before else 0.0
    value = f"−{got:.1%} {plan.basis}" + ("" if plan.met else " (target not met)")
    if plan.forward_s_before is not None and plan.forward_s_after is not None:
        detail = (f"forward {_time_change(plan.forward_s_before, plan.forward_s_after)} on "
                  f"{plan.device}" + (f" ({plan.cut} cut)" if plan.cut != "exact" else "")
                  + "; " + detail)
        value += f", {_saved_time(plan.forward_s_before, plan.forward_s_after)} time"
    return Figure(f"pruning plan ({plan.target})", value, detail,
                  Tone.GOOD if plan.met else Tone.BAD)


def _whole_blocks(groups: Sequence[PruneGroup]) -> str:
    gone = [g.name for g in groups if g.kind == "block" and g.removed]
    if not gone:
        return ""
    return f" ({len(gone)} whole blocks: {', '.join(gone[:3])}{' …' if len(gone) > 3 else ''})"


def _unaligned(plan: PrunePlan) -> str:
    """Which dims the plan leaves unaligned, the priced ones named first."""
    penalised = [a for a in plan.alignment if a.penalised]
    if not penalised:
        return f"{len(plan.alignment)} dims off a multiple of 64/128 (not priced)"
    named = ", ".join(f"{a.param}[{a.dim}] {a.before}→{a.after}" for a in penalised[:2])
    more = f" and {len(penalised) - 2} more" if len(penalised) > 2 else ""
    return f"{len(penalised)} dims off 16-byte rows: {named}{more}"


def _alignment_note(plan: PrunePlan) -> str:
    priced = sum(a.penalised for a in plan.alignment)
    noted = len(plan.alignment) - priced
    return ((f"{priced} leave the 16-byte rows (8 entries in 16-bit) the fast GEMM kernels "
             "need: priced as gemm-misaligned with --device" if priced else "")
            + ("; " if priced and noted else "")
            + (f"{noted} leave a multiple of 64/128 only: noted, not priced (unmeasured)"
               if noted else "") + "; see below")


def _nothing(section: Prune) -> Table:
    reasons = ", ".join(f"{why} ({n})" for why, n in list(section.blocked.items())[:3])
    line = f"no prunable group: {reasons or 'the model has no parameter axis to prune'}"
    return Table.of("structured pruning", (Column(""),), [(line,)], show_header=False)


def _plan(plan: PrunePlan, saved_to: str | None, calibration: PruneCalibration | None,
          groups: Sequence[PruneGroup] = ()) -> Table:
    basis_before = plan.params_before if plan.basis == "params" else plan.flops_before
    basis_after = plan.params_after if plan.basis == "params" else plan.flops_after
    got = 1 - basis_after / basis_before if basis_before else 0.0
    verdict = (Cell(f"met: −{got:.1%} {plan.basis}", Tone.GOOD) if plan.met else
               Cell(f"not met: −{got:.1%} {plan.basis} with every removable unit gone", Tone.BAD))
    rows: list[tuple[str | Cell, ...]] = [
        ("target", plan.target, verdict),
        (Cell("parameters", Tone.STRONG), _change(plan.params_before, plan.params_after), ""),
        (Cell("forward FLOPs", Tone.STRONG), _change(plan.flops_before, plan.flops_after, "FLOP"),
         "exact: the pruned graph re-costed by the same rules"),
        ("units removed", str(plan.units_removed), plan.ranking),
    ]
    gone = [g.name for g in groups if g.kind == "block" and g.removed]
    if gone:
        rows.append(("whole blocks removed", str(len(gone)), ", ".join(gone) + ": each "
                     "replaced by an identity, the stream passes through"))
    rows += _plan_savings(plan)
    if plan.damage is not None and calibration is not None:
        rows.append(("predicted damage", _damage(plan.damage, calibration),
                     f"the plan's removal measured on the {calibration.batches} "
                     f"{calibration.source} batches, before any fine-tuning"))
    else:
        rows.append(("predicted damage", "not measured",
                     "define calibration() in the model file: each unit's removal and the "
                     "plan's are then measured on its batches"))
    if plan.alignment:
        penalised = [a for a in plan.alignment if a.penalised]
        rows.append(("kernel alignment", Cell(_unaligned(plan), Tone.WARN if penalised else
                                              Tone.PLAIN), _alignment_note(plan)))
    if saved_to:
        rows.append(("pruned module", saved_to, "torch.load(path, weights_only=False)"))
    return Table.of("pruning plan", (Column("", strong=True), Column("", right=True),
                                     Column("")), rows, show_header=False)


def _plan_savings(plan: PrunePlan) -> list[tuple[str | Cell, ...]]:
    """Training step, KV cache, device time and the cut not taken, where measured."""
    rows: list[tuple[str | Cell, ...]] = []
    if plan.train_flops_before is not None and plan.train_flops_after is not None:
        rows.append(("training-step FLOPs", _change(plan.train_flops_before,
                                                    plan.train_flops_after, "FLOP"),
                     "forward + backward, the pruned step recorded and re-costed"))
    if plan.saved_bytes_before is not None and plan.saved_bytes_after is not None:
        rows.append(("saved activations", _bytes_change(plan.saved_bytes_before,
                                                        plan.saved_bytes_after),
                     "what autograd keeps for the backward, one step"))
    if plan.kv_bytes_per_token_before and plan.kv_bytes_per_token_after is not None:
        rows.append(("KV cache per token", _bytes_change(plan.kv_bytes_per_token_before,
                                                         plan.kv_bytes_per_token_after),
                     "K and V of every causal attention layer, one sequence"))
    if plan.forward_s_before is not None and plan.forward_s_after is not None:
        rows.append((Cell(f"forward on {plan.device}", Tone.STRONG),
                     _time_change(plan.forward_s_before, plan.forward_s_after),
                     "roofline of the pruned graph" + (
                         f"; {plan.misaligned_after} GEMMs on misaligned kernels"
                         if plan.misaligned_after else "")))
    if plan.train_s_before is not None and plan.train_s_after is not None:
        rows.append((f"training step on {plan.device}",
                     _time_change(plan.train_s_before, plan.train_s_after),
                     "forward + backward, optimizer step left out"))
    if plan.alternative is not None:
        rows.append(_alternative(plan, plan.alternative))
    return rows


def _alternative(plan: PrunePlan, cut: PruneCut) -> tuple[str | Cell, ...]:
    time = (f", forward {seconds(cut.forward_s_after)}"
            if cut.forward_s_after is not None else "")
    misaligned = f", {cut.misaligned} GEMMs misaligned" if cut.misaligned else ""
    share = percent(plan.params_before - cut.params_after, plan.params_before)
    what = (f"{cut.units_removed} units, params −{share}" + time + misaligned
            + ("" if cut.met else ", target not met"))
    if plan.cut != "exact":
        why = (f"taken: the {plan.cut} cut keeps the 16-byte rows the fast GEMM kernels "
               f"need; the exact cut would be {what}")
        return ("kernel-aligned cut", Cell(plan.cut, Tone.GOOD), why)
    why = ("each group's kept width a multiple of 8 (16-bit) entries" + (
        "; --device rates whether it is faster" if cut.forward_s_after is None else
        "; not faster on this device, so not taken"))
    return (f"offered: {cut.how} cut", what, why)


def _time_change(before: float, after: float) -> str:
    return f"{seconds(before)} → {seconds(after)} ({_saved_time(before, after)})"


def _saved_time(before: float, after: float) -> str:
    if after > before:
        return f"+{percent(after - before, before)} slower"
    return f"−{percent(before - after, before)}"


def _bytes_change(before: int, after: int) -> str:
    return (f"{binary_bytes(before)} → {binary_bytes(after)} "
            f"(−{percent(before - after, before)})")


def _damage(value: float, calibration: PruneCalibration | None) -> str:
    """A damage in its metric's words: KL in nats, or the error power with its SQNR."""
    if calibration is not None and calibration.metric == "kl":
        return f"KL {value:.3g} nats"
    sqnr = f" (SQNR {-10 * math.log10(value):.1f} dB)" if value > 0 else ""
    return f"output error power {value:.3g}{sqnr}"


def _change(before: int, after: int, unit: str = "") -> str:
    return f"{si(before, unit)} → {si(after, unit)} (−{percent(before - after, before)})"


def _groups(groups: Sequence[PruneGroup], planned: bool,
            calibration: PruneCalibration | None) -> Table:
    rows = []
    training = any(g.train_flops_per_unit is not None for g in groups)
    kv = any(g.kv_bytes_per_token_per_unit for g in groups)
    timed = any(g.time_s_per_unit is not None for g in groups)
    for name, alike in _alike(groups):
        g = alike[0]
        row: list[str | Cell] = [name, g.unit, str(g.units), f"{si(g.params_per_unit)} · "
               f"{si(g.flops_per_unit, 'FLOP')}"]
        if training:
            row.append(f"{si(g.train_flops_per_unit or 0, 'FLOP')} · "
                       f"{binary_bytes(g.saved_bytes_per_unit or 0)}")
        if kv:
            row.append(binary_bytes(g.kv_bytes_per_token_per_unit or 0))
        if timed:
            row.append(_unit_time(g))
        if calibration is not None:
            row.append(", ".join(f"{x.importance_min:.2g}" for x in alike))
        if planned:
            row.append(", ".join(str(x.removed) for x in alike))
        rows.append(tuple(row))
    extra = ((["training step"] if training else []) + (["KV/token"] if kv else [])
             + (["forward time"] if timed else [])
             + (["least damage"] if calibration is not None else [])
             + (["removed"] if planned else []))
    blocks = any(g.kind == "block" for g in groups)
    caption = ("one unit saves: params · forward FLOPs" + (
        "; a block's unit is the whole block (the model computes x instead of block(x)); "
        "--prune-target 30% blocks plans whole blocks only" if blocks else "") + (
        "; training step: its FLOPs (forward + backward) · saved activations" if training
        else "; --train adds the training step's FLOPs and saved activations") + (
        "; KV/token: K and V cache bytes per token" if kv else "") + (
        "; forward time on the device by the roofline, per unit and per aligned step (a "
        "negative time: the cut leaves the fast GEMM kernels' 16-byte rows)" if timed else "")
        + "; exact, that group alone; " + _ranking(calibration))
    return Table.of("coupled groups", columns(("group", "unit"), ["units", "one unit saves"]
                                              + extra),
                    rows, caption=caption)


def _unit_time(group: PruneGroup) -> str | Cell:
    """Time one unit saves, and an aligned step's where the unit alone misaligns."""
    one = group.time_s_per_unit or 0.0
    text = _signed_s(one)
    if group.aligned_units > 1 and group.time_s_per_aligned is not None:
        text += f"; {group.aligned_units} units: {_signed_s(group.time_s_per_aligned)}"
    return Cell(text, Tone.WARN) if one < 0 else text


def _signed_s(value: float) -> str:
    return f"−{seconds(-value)}" if value < 0 else seconds(value)


def _ranking(calibration: PruneCalibration | None) -> str:
    if calibration is None:
        return ("units ranked by data-free importance (L2 of the members' weights, |γ| where a "
                "batch norm scales them); calibration() in the model file ranks by measured "
                "damage instead")
    measured = ("every unit" if calibration.units_measured == calibration.units_total else
                f"{calibration.units_measured} of {calibration.units_total} units (the rest "
                "interpolated along their group's data-free order)")
    return (f"units ranked by calibrated damage: {measured} removed alone and the "
            f"{calibration.batches} {calibration.source} batches forwarded "
            f"({calibration.metric_unit})")


def _alike(groups: Sequence[PruneGroup]) -> list[tuple[str, list[PruneGroup]]]:
    """Groups of alike repeated blocks together, named once with the blocks' range."""
    merged: dict[tuple[object, ...], list[PruneGroup]] = {}
    for g in groups:
        local = g.name[len(g.block):] if g.block else g.name
        key = (bool(g.block), local if g.block else g.id, g.kind, g.unit, g.units,
               g.params_per_unit, g.flops_per_unit, g.train_flops_per_unit,
               g.kv_bytes_per_token_per_unit)
        merged.setdefault(key, []).append(g)
    out = []
    for alike in merged.values():
        first, last = alike[0], alike[-1]
        name = first.name
        if len(alike) > 1:
            prefix, _, start = first.block.rpartition(".")
            end = last.block.rpartition(".")[2]
            name = f"{prefix}.{start}–{end}{first.name[len(first.block):]}"
        out.append((name, alike))
    return out


def _blocked(section: Prune) -> Table:
    rows = [(why, str(n)) for why, n in list(section.blocked.items())[:SHOWN_REASONS]]
    return Table.of("kept: parameter axes that cannot be pruned", columns(("why",),
                                                                         ("axes",)), rows)


def _alignment(plan: PrunePlan, full: bool) -> Table:
    shown = plan.alignment if full else plan.alignment[:SHOWN_ALIGNMENT]
    rows = [(a.param, str(a.dim), f"{a.before} → {a.after}", str(a.multiple),
             Cell("yes: 16-byte rows", Tone.WARN) if a.penalised else "no") for a in shown]
    more = len(plan.alignment) - len(shown)
    return Table.of("dims moved off a kernel-friendly multiple", columns(
        ("parameter",), ("dim", "size", "was a multiple of", "priced")), rows,
        caption=(f"{more} more with --full; " if more else "") + ALIGNMENT_NOTE)
