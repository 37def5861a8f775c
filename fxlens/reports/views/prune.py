"""The view of ``--prune`` (`Prune`): the plan's answer (target, parameters and FLOPs before and
after, how far an unmet target got, its damage measured on the calibration batches), the
coupled groups with what one unit of each saves (alike groups of repeated blocks in one row),
which score ranks (data-free, or the calibrated damage of removing each unit alone), blocks
that could go whole, why the other parameter axes stay, and the dims the plan moves off a
multiple the kernels like. A model with no prunable group gets one line saying why."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import (
    Prune,
    PruneBlock,
    PruneCalibration,
    PruneGroup,
    PrunePlan,
)
from fxlens.reports.units import percent, si
from fxlens.reports.view import Cell, Column, Detail, Figure, Table, Tone, View, columns

SHOWN_REASONS = 6
SHOWN_ALIGNMENT = 8


def prune_view(report: Report, detail: Detail) -> View | None:
    section = report.get(Prune)
    if section is None:
        return None
    blocks: list[Table] = []
    if not section.groups:
        blocks.append(_nothing(section))
    if section.plan is not None:
        blocks.append(_plan(section.plan, section.saved_to, section.calibration))
    if section.groups:
        blocks.append(_groups(section.groups, section.plan is not None, section.calibration))
    if section.blocks:
        blocks.append(_blocks(section.blocks))
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
                      "coupled channels, heads and neurons: --prune-target 30% plans removing "
                      "the least important units", Tone.STRONG)
    damage = (f"; damage {_damage(plan.damage, section.calibration)}"
              if plan.damage is not None and section.calibration is not None else "")
    detail = (f"parameters {_change(plan.params_before, plan.params_after)}, forward FLOPs "
              f"{_change(plan.flops_before, plan.flops_after, 'FLOP')}; {plan.units_removed} "
              f"units removed" + damage + (f"; {len(plan.alignment)} dims off a multiple of "
                                           "8/64/128" if plan.alignment else ""))
    before = plan.params_before if plan.basis == "params" else plan.flops_before
    after = plan.params_after if plan.basis == "params" else plan.flops_after
    got = 1 - after / before if before else 0.0
    value = f"−{got:.1%} {plan.basis}" + ("" if plan.met else " (target not met)")
    return Figure(f"pruning plan ({plan.target})", value, detail,
                  Tone.GOOD if plan.met else Tone.BAD)


def _nothing(section: Prune) -> Table:
    reasons = ", ".join(f"{why} ({n})" for why, n in list(section.blocked.items())[:3])
    line = f"no prunable group: {reasons or 'the model has no parameter axis to prune'}"
    return Table.of("structured pruning", (Column(""),), [(line,)], show_header=False)


def _plan(plan: PrunePlan, saved_to: str | None, calibration: PruneCalibration | None
          ) -> Table:
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
    if plan.damage is not None and calibration is not None:
        rows.append(("predicted damage", _damage(plan.damage, calibration),
                     f"the plan's removal measured on the {calibration.batches} "
                     f"{calibration.source} batches, before any fine-tuning"))
    else:
        rows.append(("predicted damage", "not measured",
                     "define calibration() in the model file: each unit's removal and the "
                     "plan's are then measured on its batches"))
    if plan.alignment:
        rows.append(("kernel alignment", Cell(f"{len(plan.alignment)} dims", Tone.WARN),
                     "move off a multiple of 8/64/128 (slower GEMM tiles): see below"))
    if saved_to:
        rows.append(("pruned module", saved_to, "torch.load(path, weights_only=False)"))
    return Table.of("pruning plan", (Column("", strong=True), Column("", right=True),
                                     Column("")), rows, show_header=False)


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
    for name, alike in _alike(groups):
        g = alike[0]
        row = [name, g.unit, str(g.units), f"{si(g.params_per_unit)} · "
               f"{si(g.flops_per_unit, 'FLOP')}"]
        if calibration is not None:
            row.append(", ".join(f"{x.importance_min:.2g}" for x in alike))
        if planned:
            row.append(", ".join(str(x.removed) for x in alike))
        rows.append(tuple(row))
    extra = (["least damage"] if calibration is not None else []) + (
        ["removed"] if planned else [])
    return Table.of("coupled groups", columns(("group", "unit"), ["units", "one unit saves"]
                                              + extra),
                    rows, caption="one unit saves: params · forward FLOPs, exact, that group "
                                  "alone; " + _ranking(calibration))


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
               g.params_per_unit, g.flops_per_unit)
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


def _blocks(blocks: Sequence[PruneBlock]) -> Table:
    rows = [(b.path, si(b.params), si(b.flops, "FLOP")) for b in blocks]
    return Table.of("repeated blocks removable whole", columns(("block",), ("params",
                                                                              "forward FLOPs")),
                    rows, caption="residual blocks: the stream stays intact without one; "
                                  "which to drop needs calibrated damage (not planned here)")


def _blocked(section: Prune) -> Table:
    rows = [(why, str(n)) for why, n in list(section.blocked.items())[:SHOWN_REASONS]]
    return Table.of("kept: parameter axes that cannot be pruned", columns(("why",),
                                                                         ("axes",)), rows)


def _alignment(plan: PrunePlan, full: bool) -> Table:
    shown = plan.alignment if full else plan.alignment[:SHOWN_ALIGNMENT]
    rows = [(a.param, str(a.dim), f"{a.before} → {a.after}", str(a.multiple)) for a in shown]
    more = len(plan.alignment) - len(shown)
    return Table.of("dims moved off a kernel-friendly multiple", columns(
        ("parameter",), ("dim", "size", "was a multiple of")), rows,
        caption=f"{more} more with --full" if more else
        "round each group's removal to keep the multiple where speed matters")
