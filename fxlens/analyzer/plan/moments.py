"""The one-GPU step's live set at its moments, split the way a layout shares it out.

`PeakBreakdown.moments` tells saved activations, working tensors and weight gradients apart
at the step's peak and where its working tensors peak. A layout holds each at its own share
(`fxlens.analyzer.plan.stage_memory`), and one kind of working tensor follows the experts, not
the tokens: a MoE's weight gradient as its grouped GEMM's backward writes it, before it
reaches the parameter's gradient (``aten._grouped_mm`` returns every expert's at once: 15 GB
for one DeepSeek-V3 layer in bf16), and its casts and copies. A GPU holding 1/(ep·etp) of
the experts holds that share of them. `step_moments` counts, at each moment, the working
storages shaped like an expert weight apart from the rest.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from fxlens.analyzer.capture.training import TrainingGraph
from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.sections import LiveSplit
from fxlens.analyzer.memory.liveness import Category, Lifetimes, plan_storages


@dataclass(frozen=True)
class StepMoment:
    """One moment of the one-GPU step: saved activations, working tensors (those shaped like
    an expert weight apart, every expert's) and weight gradients, in bytes."""

    saved_bytes: int
    working_bytes: int
    gradient_bytes: int
    expert_working_bytes: int = 0


def step_moments(step: TrainingGraph, registry: CostRegistry, moments: Sequence[LiveSplit],
                 expert_shapes: Collection[tuple[int, ...]]) -> tuple[StepMoment, ...]:
    """`moments` with their working tensors shaped like an expert weight counted apart (the
    storages as the training step's liveness planned them: eager lifetimes)."""
    if not expert_shapes:
        return tuple(StepMoment(m.saved_bytes, m.working_bytes, m.gradient_bytes)
                     for m in moments)
    graph = step.graph
    st = plan_storages(graph, registry, Lifetimes.EAGER)
    saved = {st.of_ref[ref] for ref in step.saved if ref in st.of_ref}
    expert = [i for i, (_, spec) in enumerate(st.origin)
              if st.category[i] is Category.ACTIVATION and i not in saved
              and tuple(spec.shape) in expert_shapes]
    position = {node.id: p for p, node in enumerate(graph.nodes)}
    out = []
    for m in moments:
        at = position.get(m.node, -1)
        shaped = sum(st.size[i] for i in expert if st.producer[i] <= at <= st.last[i])
        out.append(StepMoment(m.saved_bytes, m.working_bytes - shaped, m.gradient_bytes,
                              shaped))
    return tuple(out)
