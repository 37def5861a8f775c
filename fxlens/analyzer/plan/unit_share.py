"""What one GPU holds and runs of one unit (a block, or what runs before or after the
blocks) or of one module part under a layout: its state split over tp and ep·etp, its
activations over tp (and sp), its forward and backward seconds over tp·cp with its expert
GEMMs sized per GPU, and what a selective recompute of it costs and frees.

Each answer is remembered on the unit per the degrees it reads (`Unit.answers`): a search
over thousands of layouts asks the same few questions of every unit again and again.
"""

from __future__ import annotations

import math

from fxlens.analyzer.memory.training_state import STATE_FIELDS, StateBytes
from fxlens.analyzer.plan.recompute import recomputed_parts
from fxlens.analyzer.plan.serial import steps_s
from fxlens.analyzer.plan.strategy import Strategy
from fxlens.analyzer.plan.structure import Unit
from fxlens.analyzer.plan.types import remembered
from fxlens.analyzer.plan.workload import ModulePart


def degrees(s: Strategy) -> tuple[int, bool, int, int, int]:
    """The degrees of a layout that what one GPU runs and holds of a unit depends on: the key
    every answer remembered on a unit or the model is filed under, beside its question."""
    return s.tp, s.sp, s.cp, s.ep, s.expert_tp


def is_block(unit: Unit | ModulePart) -> bool:
    return unit.name not in ("pre", "post")


def phase_s(s: Strategy, u: Unit | ModulePart, phase: str) -> float:
    """One micro-batch of the unit's `phase` ("forward" or "backward") on one GPU
    (remembered on the unit per the degrees it reads)."""
    gated = s.routing == "blocks"
    return remembered(u.answers, (phase, gated, *degrees(s)), lambda: _phase_s(s, u, phase))


def _phase_s(s: Strategy, u: Unit | ModulePart, phase: str) -> float:
    """`phase_s`; a benchmark's fake gate (``routing=blocks``) runs no router."""
    split, whole = ((u.forward_split_s, u.forward_whole_s) if phase == "forward"
                    else (u.backward_split_s, u.backward_whole_s))
    if s.routing == "blocks" and isinstance(u, Unit):
        whole -= u.router_s[0 if phase == "forward" else 1]
    whole /= s.tp if s.sp and is_block(u) else 1
    return (split / s.tp + whole) / s.cp + experts_s(s, u, phase) + steps_s(u.serials, phase,
                                                                          s.tp, s.cp)


def experts_s(s: Strategy, u: Unit | ModulePart, phase: str) -> float:
    """The unit's expert GEMMs on one GPU: 1/(t·cp) of the routed rows' work, the weights of
    1/(ep·etp) of the experts, token rows (t·cp ranks' worth gathered by etp, half of each
    GEMM's token operands split by it); its other expert-weight-sized ops on 1/(ep·etp)."""
    etp, ranks = s.expert_tp, s.tp * s.cp
    held = 1 / (s.ep * etp)
    other = u.expert_work.forward_s if phase == "forward" else u.expert_work.backward_s
    return other * held + sum(g.on_rank(1 / ranks, held, (etp + 1) / (2 * ranks))
                              for g in u.expert_gemms if g.phase == phase)


def recomputed_s(s: Strategy, u: Unit) -> float:
    """One micro-batch's forward seconds on one GPU of the parts of block `u` that ``ckpt=``
    patterns recompute (remembered on the unit)."""
    return remembered(u.answers, ("recomputed s", s.recompute, *degrees(s)), lambda: sum(
        phase_s(s, part, "forward") for part in recomputed_parts(u, s.recompute)))


def recomputed_bytes(s: Strategy, u: Unit) -> float:
    """One micro-batch's saved bytes on one GPU (before cp) of the parts of block `u` that
    ``ckpt=`` patterns recompute (remembered on the unit)."""
    seq_div = s.tp if s.sp else 1
    return remembered(u.answers, ("recomputed bytes", s.recompute, s.tp, seq_div), lambda: sum(
        saved_on_gpu(part, s.tp, seq_div) for part in recomputed_parts(u, s.recompute)))


def saved_on_gpu(unit: Unit | ModulePart, t: int, seq_div: int) -> float:
    """One micro-batch's saved activations of `unit` on one GPU before cp: the split part
    over t, the rest over t only with sequence parallel (`seq_div`)."""
    return unit.saved_split_bytes / t + unit.saved_whole_bytes / seq_div


def unit_states(unit: Unit, t: int, experts_on_gpu: int) -> tuple[StateBytes, StateBytes]:
    """One unit's dense and expert state on one GPU before ZeRO (remembered on the unit)."""
    return remembered(unit.answers, ("states", t, experts_on_gpu), lambda: (
        scaled(unit.states_split, **every_field(t)).plus(unit.states_whole),
        scaled(unit.states_expert, **every_field(experts_on_gpu))))


def unit_state(unit: Unit, t: int, experts_on_gpu: int) -> StateBytes:
    """One unit's state on one GPU before ZeRO: split over t, experts over ep·etp."""
    dense, expert = unit_states(unit, t, experts_on_gpu)
    return dense.plus(expert)


def scaled(state: StateBytes, **divisors: float) -> StateBytes:
    return StateBytes(**{name: math.ceil(getattr(state, name) / divisors.get(name, 1))
                         for name in STATE_FIELDS})


def every_field(divisor: float) -> dict[str, float]:
    return dict.fromkeys(STATE_FIELDS, divisor)
