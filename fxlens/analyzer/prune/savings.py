"""What a removal saves beyond parameters and forward FLOPs: training-step FLOPs and saved
activations, KV-cache bytes per token, and roofline time on a device.

- Training step (when the run analyses one, ``--train``): the pruned module's step is recorded
  again (`capture_training`, with the run's own settings) with the removal sliced in place
  (`fxlens.analyzer.prune.module.removed`), costed by the same rules, and its saved-for-
  backward bytes counted as the training section counts them (`saved_activations`). So the
  backward's FLOPs come from its own ops (a pruned GEMM's two gradient GEMMs shrink with it),
  not from a 3× rule. NB: groups of alike repeated blocks (same local path, units and forward
  savings) are recorded once and the figure shared: the blocks are the same computation.
- KV cache per token: the causal attention nodes of the (pruned) forward graph, as the KV
  pass reads a graph (`layers_from_graph`): ``Σ kv_heads · (d_k + d_v) · bytes`` per token
  of context and sequence. None for a model without causal attention (nothing is cached).
- Time: the roofline of the report (`node_times`, `fxlens.analyzer.time.roofline`) over the
  pruned graph, re-costed by the rules, so a GEMM whose width the cut moves off 16 bytes is
  marked ``gemm-misaligned`` and rated at the device's share for it. The training step's time
  is its forward and backward (the optimizer step left out).
- Aligned step: the fewest units of a group whose removal keeps every aligned member dim on
  the 16-byte boundary the matmul rules rate (8 entries in 16-bit, 16 in 8-bit); 1 for
  fp32 members, which the rules never mark.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from torch import nn

from fxlens.analyzer.capture.training import TrainingGraph
from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.graph import Graph, NodeKind, dtype_bytes
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.memory.kv_cache import layers_from_graph
from fxlens.analyzer.memory.training_step import saved_activations
from fxlens.analyzer.prune.groups import Found
from fxlens.analyzer.prune.module import removed
from fxlens.analyzer.prune.types import PruneKnowledge, Removal
from fxlens.analyzer.time.roofline import Device, node_times

StepCapture = Callable[[nn.Module], TrainingGraph]


@dataclass(frozen=True)
class StepCosts:
    """One training step (forward + backward) of a model, original or pruned."""

    flops: int
    saved_bytes: int
    time_s: float | None


@dataclass
class Meter:
    """Costs removals beyond the forward; the training step only with `step`, times only
    with `device`."""

    module: nn.Module
    groups: Sequence[Found]
    knowledge: PruneKnowledge
    registry: CostRegistry
    step: StepCapture | None = None
    device: Device | None = None
    tf32: bool = False
    _steps: dict[Hashable, StepCosts] = field(default_factory=dict)

    def forward_s(self, report: Report, graph: Graph) -> float | None:
        if self.device is None:
            return None
        return sum(t.time_s for t in node_times(report, graph, self.device, self.tf32))

    def misaligned(self, report: Report) -> int:
        """GEMMs the rules rate at the misaligned kernels' share."""
        return sum(1 for n in report.nodes if n.kernel == self.knowledge.misaligned_kernel)

    def training(self, removal: Removal, key: Hashable | None = None) -> StepCosts | None:
        """The step with `removal` sliced in; `key`: alike removals share one recording."""
        if self.step is None:
            return None
        key = key if key is not None else tuple(sorted((r, tuple(sorted(u)))
                                                       for r, u in removal.items()))
        if key not in self._steps:
            with removed(self.module, self.groups, removal, self.knowledge) as pruned:
                recorded = self.step(pruned)
            self._steps[key] = self.step_costs(recorded)
        return self._steps[key]

    def step_costs(self, recorded: TrainingGraph) -> StepCosts:
        report = analyze(recorded.graph, self.registry)
        saved = saved_activations(recorded.graph, recorded.saved, self.registry)
        return StepCosts(report.totals.flops, sum(saved.values()),
                         self.forward_s(report, recorded.graph))


def kv_bytes_per_token(graph: Graph, element_bytes: float) -> int | None:
    """K and V bytes cached per token of context (one sequence); None without causal
    attention."""
    if not any(n.kind is NodeKind.CALL and n.phase == "forward" and n.args.get("is_causal")
               for n in graph.nodes):
        return None
    return int(sum(layer.kv_heads * (layer.k_head_dim + layer.v_head_dim)
                   for layer in layers_from_graph(graph)) * element_bytes)


def cache_element_bytes(graph: Graph) -> float:
    """The first floating parameter's element size, as the KV pass takes it (fp32 if none)."""
    dtypes = [p.spec.dtype for p in graph.params if p.spec.dtype.startswith(("float", "bf"))]
    return float(dtype_bytes(dtypes[0])) if dtypes else 4.0


def aligned_step(group: Found, graph: Graph, aligned_bytes: int) -> int:
    """Units per aligned step (module docstring): members in 8- or 16-bit dtypes whose dim is
    on the boundary now must stay on it."""
    if group.block:
        return 1
    specs = {p.name: p.spec for p in graph.params}
    step = 1
    for m in group.members:
        spec = specs.get(m.param)
        if spec is None or m.param in group.buffers:
            continue
        size = int(dtype_bytes(spec.dtype))
        if size > 2 or not spec.dtype.startswith(("float", "bfloat", "int", "uint")):
            continue
        entries = aligned_bytes // size
        if spec.shape[m.dim] % entries == 0:
            step = math.lcm(step, entries // math.gcd(entries, m.width))
    return step if step < group.units else 1
