"""A recurrence's serial steps as a layout re-sizes them (`fxlens.analyzer.core.costs.Recurrence`).

The roofline prices a chunked scan's state kernel (gated DeltaNet's ``fwd_h``, `fxlens.rules.gdn`)
as its work plus its dependent steps, once per wave of programs over the SMs
(`fxlens.analyzer.time.roofline.serial_seconds`). A layout divides a unit's work by t·cp, but not
those steps: tensor parallelism divides the programs (the heads), which shortens the steps only
where there was more than one wave of them — Qwen3-Next at one 4,096-token sequence runs 128
programs, one wave on 132 SMs, at t = 1 and t = 2 alike; context parallelism gives each rank
1/cp of the chunks to walk. So the planner keeps the steps apart from a unit's split and
replicated seconds (`fxlens.analyzer.plan.structure.read_facts`) and sizes them per layout
(`SerialSteps.on_rank`); a backward node's programs divide where its module's forward mostly
does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from fxlens.analyzer.core.costs import Recurrence, waves
from fxlens.analyzer.core.graph import Graph


@dataclass(frozen=True)
class SerialSteps:
    """One node's serial steps: `wave_s` the seconds of one wave of its programs (its steps ×
    the device's step), `split` whether tensor parallelism divides its programs."""

    phase: str              # "forward" or "backward"
    wave_s: float
    programs: int
    multiprocessors: int    # the device's; 0: unknown (one wave)
    split: bool

    def on_rank(self, tp: int, cp: int) -> float:
        """Seconds on one GPU of a layout with degrees `tp` and `cp`."""
        programs = math.ceil(self.programs / tp) if self.split else self.programs
        return self.wave_s * waves(programs, self.multiprocessors) / cp


def serial_steps(graph: Graph, nodes: Iterable[int], steps_s: Mapping[int, float],
                 recurrences: Mapping[int, Recurrence], multiprocessors: int,
                 is_split: Callable[[int], bool]) -> tuple[SerialSteps, ...]:
    """The serial steps of `nodes` that have some (`steps_s`: their seconds as captured)."""
    found = []
    for node_id in nodes:
        seconds, recurrence = steps_s.get(node_id, 0.0), recurrences.get(node_id)
        if seconds <= 0 or recurrence is None:
            continue
        wave_s = seconds / waves(recurrence.programs, multiprocessors)
        found.append(SerialSteps(graph.nodes[node_id].phase, wave_s, recurrence.programs,
                                 multiprocessors, is_split(node_id)))
    return tuple(found)


def steps_s(steps: Iterable[SerialSteps], phase: str, tp: int, cp: int) -> float:
    """Seconds on one GPU of the `phase` steps among `steps`."""
    return sum(s.on_rank(tp, cp) for s in steps if s.phase == phase)
