"""What a parallel layout needs to know about one model, read once from its training step.

The step is cut into units: ``pre`` (everything the forward runs before the first repeated
block: embeddings), each repeated block (`repeated_blocks`: the decoder layers), and ``post``
(the final norm, head and loss). Per unit: the persistent state of its parameters, the
activations its forward saves for the backward, what enters it, its roofline time forward and
backward, and what tensor parallelism would move.

Tensor parallelism is found from the graph's structure (`fxlens.analyzer.plan.tensor_split`:
Megatron's row/column pairs, the LM head and embeddings vocab-parallel, the rest replicated).

Backward ops are attributed to the module whose forward they differentiate; a module's share of
split work in the backward is taken to be its share in the forward. Expert parameters of a MoE
are those under a module path segment named like ``experts`` or read by a grouped GEMM (NB: a
naming convention every MoE in `transformers` follows; routing itself is not modelled, so the
routed token bytes are those the captured step moved).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from fxlens.analyzer.capture.training import TrainingGraph
from fxlens.analyzer.core.costs import CostRegistry, Recurrence
from fxlens.analyzer.core.graph import Graph, NodeKind, TensorRef, block_of, repeated_blocks
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import LiveSplit
from fxlens.analyzer.memory.training_state import StateBytes
from fxlens.analyzer.plan.compression import Matrix, gradient_matrices
from fxlens.analyzer.plan.moe_model import (
    expert_count,
    expert_weight_nodes,
    expert_weight_shapes,
    gemm_rows,
    router_modules,
)
from fxlens.analyzer.plan.moments import StepMoment, step_moments
from fxlens.analyzer.plan.op_policy import op_policy_part
from fxlens.analyzer.plan.routing import ExpertRouting
from fxlens.analyzer.plan.serial import SerialSteps, serial_steps
from fxlens.analyzer.plan.tensor_split import (
    entering,
    graph_param_shape,
    handed_on,
    split_unit,
    weight_gemms,
    weight_param,
)
from fxlens.analyzer.plan.types import ParallelKnowledge
from fxlens.analyzer.plan.workload import (
    ExpertGemm,
    ExpertWork,
    FusedOps,
    ModulePart,
    Timed,
    UnitAttention,
    expert_activation_parts,
    expert_gemms,
    expert_work,
    module_parts,
    module_split_share,
    phase_counts,
    router_s,
    saved_by_module,
    unit_attention,
    unit_times,
)

EXPERT_SEGMENT = re.compile(r"(^|\.)experts?(\.|$)")


@dataclass(frozen=True)
class Unit:
    """One unit of the step (``pre``, a repeated block, ``post``) as a layout sees it."""

    name: str
    states_split: StateBytes = StateBytes()    # parameters split over tp
    states_whole: StateBytes = StateBytes()    # replicated parameters
    states_expert: StateBytes = StateBytes()   # expert parameters (split over tp and ep)
    saved_split_bytes: int = 0                 # saved for the backward, on 1/t of features
    saved_whole_bytes: int = 0                 # saved, replicated unless sequence parallel
    input_bytes: int = 0                       # activations entering the unit's forward
    forward_split_s: float = 0.0
    forward_whole_s: float = 0.0
    backward_split_s: float = 0.0
    backward_whole_s: float = 0.0
    flops: int = 0                             # forward + backward
    tp_reduce_bytes: int = 0                   # forward all-reduce payloads under tp, summed
    tp_reduces: int = 0                        # how many (row GEMMs and embeddings)
    etp_reduce_bytes: int = 0                  # the same of the routed experts' rows, reduced
    etp_reduces: int = 0                       # over etp only where experts are split by it
    routed_bytes: int = 0                      # token bytes sent to experts (one way)
    routed_rows: int = 0                       # token rows sent to experts (top-k per token)
    router_rows: int = 0                       # token rows its routers score (one per token)
    column_widths: tuple[int, ...] = ()        # output features of column-parallel GEMMs
    row_gemms: int = 0
    attention: UnitAttention = UnitAttention()
    expert_gemms: tuple[ExpertGemm, ...] = ()  # not in the split or replicated seconds
    serials: tuple[SerialSteps, ...] = ()      # recurrences' steps, likewise
    expert_work: ExpertWork = ExpertWork()     # other expert-weight-sized ops, likewise
    router_s: tuple[float, float] = (0.0, 0.0)  # the routers' forward and backward (in whole)
    parts: tuple[ModulePart, ...] = ()         # per module of a block: selective recompute
    op_policy: ModulePart = ModulePart("")     # a block under ``ckpt=ops``: what it keeps
                                               # (saved bytes) and recomputes (seconds)
    matrices: tuple[Matrix, ...] = ()          # trainable ≥ 2-D parameters, for PowerSGD
    launches: tuple[int, int] = (0, 0)         # kernels the host launches, forward, backward

    @property
    def saved_bytes(self) -> int:
        return self.saved_split_bytes + self.saved_whole_bytes

    @cached_property
    def states(self) -> StateBytes:
        return self.states_split.plus(self.states_whole).plus(self.states_expert)

    @cached_property
    def answers(self) -> dict[Hashable, Any]:
        """What the planner derives from this unit alone, by question (the layout's degrees
        it reads, a set of ``ckpt=`` patterns): `fxlens.analyzer.plan.types.remembered`."""
        return {}

    @cached_property
    def shape(self) -> Unit:
        """The unit unnamed, its module parts named by their path inside it: equal for two
        blocks that every layout treats alike."""
        parts = sorted((replace(p, name=self._inside(p.name)) for p in self.parts), key=repr)
        return replace(self, name="", parts=tuple(parts))

    def _inside(self, path: str) -> str:
        """`path` relative to the unit: "" for the unit itself, "\\0" for a module outside it
        (the block before, whose output this one saves: no pattern recomputes it here)."""
        if path == self.name:
            return ""
        prefix = self.name + "."
        return path[len(prefix):] if path.startswith(prefix) else "\0"


@dataclass(frozen=True)
class ModelFacts:
    """Everything `estimate` reads: units in execution order and whole-step figures."""

    units: tuple[Unit, ...]
    blocks: int                        # repeated blocks (the units a pipeline splits)
    experts: int                       # experts per MoE layer (0: no MoE)
    moments: tuple[StepMoment, ...]    # the one-GPU step's live set at its peak and where its
                                       # working tensors peak (`step_moments`)
    optimizer_temporaries_bytes: int
    optimizer_s: float                 # one optimizer step on one GPU
    samples: int                       # per micro-batch (the captured batch)
    tokens: int                        # per micro-batch, 0 when not a token model
    dtype_key: str                     # the peak MFU is measured against
    peak_flops: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    grad_element_bytes: float = 2.0    # bytes per gradient element (the precision's)
    routing_groups: tuple[int, int] = (1, 1)   # group-limited routing: groups, per token

    @property
    def routing(self) -> ExpertRouting:
        return ExpertRouting(self.experts, *self.routing_groups)

    @cached_property
    def answers(self) -> dict[Hashable, Any]:
        """What the planner derives from this model alone, by question (the layout's degrees
        it reads, a set of ``ckpt=`` patterns): `fxlens.analyzer.plan.types.remembered`."""
        return {}

    def twin(self, unit: Unit) -> Unit:
        """The first unit of `unit`'s shape (`Unit.shape`): a model's identical blocks answer
        a question once, through it."""
        return self._twins[unit.name]

    @cached_property
    def _twins(self) -> dict[str, Unit]:
        first: dict[Unit, Unit] = {}
        return {u.name: first.setdefault(u.shape, u) for u in self.units}

    @cached_property
    def states(self) -> StateBytes:
        total = StateBytes()
        for unit in self.units:
            total = total.plus(unit.states)
        return total

    @property
    def flops(self) -> int:
        return sum(u.flops for u in self.units)


def unit_of_nodes(graph: Graph, blocks: Sequence[str]) -> dict[int, str]:
    """Unit name per CALL node: its block, else ``pre``/``post`` by where its module first
    runs in the forward (the root's own ops by position; its backward ops are ``post``)."""
    first_block = next((n.id for n in graph.calls() if n.phase == "forward"
                        and block_of(n.module, blocks)), None)
    first_seen: dict[str, int] = {}
    for node in graph.calls():
        if node.phase == "forward":
            first_seen.setdefault(node.module, node.id)
    units: dict[int, str] = {}
    for node in graph.calls():
        block = block_of(node.module, blocks)
        if block:
            units[node.id] = block
            continue
        anchor = node.id if node.phase == "forward" or not node.module else first_seen.get(
            node.module, node.id)
        if node.phase == "backward" and not node.module:
            anchor = 1 << 62
        units[node.id] = "pre" if first_block is not None and anchor < first_block else "post"
    return units


def _input_bytes(graph: Graph, scope: set[int], handed: frozenset[tuple[int, ...]]) -> int:
    """Bytes of what enters the unit's forward and it hands on in kind (its residual stream,
    what a pipeline stage receives and a checkpointed block keeps); everything entering when
    nothing does (a mask or a rotary table made once for every block is not the unit's)."""
    refs = entering(graph, scope)
    own = [spec for spec in refs.values() if tuple(spec.shape) in handed]
    return sum(spec.nbytes for spec in own or refs.values())


def read_facts(step: TrainingGraph, report: Report, registry: CostRegistry,
               state_of: Mapping[str, StateBytes], node_times: Mapping[int, Timed],
               knowledge: ParallelKnowledge, whole_step: WholeStep,
               fusion: FusedOps | None = None,
               routing_groups: tuple[int, int] = (1, 1),
               fp8_scaling: Mapping[int, float] | None = None,
               launched: frozenset[int] = frozenset(),
               recurrences: Mapping[int, Recurrence] | None = None,
               multiprocessors: int = 0) -> ModelFacts:
    """The `ModelFacts` of one captured training step. `state_of`: persistent state per
    parameter name; `node_times`: roofline times per node id; `fusion`: activations saved as
    fused kernels keep them (None: the saved set as captured); `routing_groups`: the model's
    group-limited routing (`fxlens.analyzer.plan.routing.routing_groups`); `fp8_scaling`:
    seconds of quantizing the grouped GEMMs' token operands (fp8), not in `node_times`
    since a layout re-sizes them with the routed rows; `launched`: the nodes that launch a
    kernel as captured (`fxlens.analyzer.plan.host`); `recurrences`: each node's that walks a
    scan in order, whose serial steps (on a device of `multiprocessors` SMs) are kept apart
    from the seconds a layout divides (`fxlens.analyzer.plan.serial`)."""
    graph = step.graph
    grouped = {n.id for n in graph.calls() if n.packet in knowledge.grouped_gemm_ops}
    expert_params = _expert_params(graph, knowledge)
    expert_shapes = expert_weight_shapes(graph, expert_params)
    expert_sized = expert_weight_nodes(graph, expert_shapes, grouped)
    serial_of = {i: t.serial_s for i, t in node_times.items() if t.serial_s > 0}
    all_times = {i: t.time_s - serial_of.get(i, 0.0) for i, t in node_times.items()}
    times = {i: s for i, s in all_times.items() if i not in grouped | expert_sized}
    blocks = repeated_blocks(graph.module_types)
    unit_names = ["pre", *blocks, "post"]
    of_node = unit_of_nodes(graph, blocks)
    members: dict[str, list[int]] = {name: [] for name in unit_names}
    for node_id, unit in of_node.items():
        members[unit].append(node_id)
    forward = {name: {n for n in members[name] if graph.nodes[n].phase == "forward"}
               for name in unit_names}
    handed = handed_on(graph, forward)
    splits = {name: split_unit(graph, forward[name], terminal_column=name == "post",
                               knowledge=knowledge, handed=handed[name])
              for name in unit_names}
    split_nodes = set().union(*(s.split_nodes for s in splits.values()))
    split_params = set().union(*(s.split_params for s in splits.values()))
    vocab = _vocab_embedding(graph, knowledge)
    if vocab is not None:
        split_params.add(vocab[1])
    units = []
    module_split = module_split_share(graph, split_nodes, times)

    def is_split(node_id: int) -> bool:
        """A forward node tp divides; a backward one in a module mostly divided."""
        node = graph.nodes[node_id]
        if node.phase == "forward":
            return node_id in split_nodes
        return module_split.get(node.module, 0.0) >= 0.5

    def serial_part(nodes: list[int]) -> tuple[SerialSteps, ...]:
        return serial_steps(graph, nodes, serial_of, recurrences or {}, multiprocessors,
                            is_split)
    part_of = expert_activation_parts(graph, {row: nodes for split in splits.values()
                                              for row, nodes in split.expert_activations.items()})
    saved_by = saved_by_module(step, registry, of_node, split_nodes,
                               knowledge.weight_path_ops, fusion, part_of)
    saved: defaultdict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
    saved_in: defaultdict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    for (unit_name, module), (split, whole) in saved_by.items():
        saved[unit_name] = (saved[unit_name][0] + split, saved[unit_name][1] + whole)
        saved_in[unit_name][module] = (split, whole)

    def expert_part(nodes: list[int]) -> tuple[tuple[ExpertGemm, ...], ExpertWork]:
        return (expert_gemms(graph, nodes, knowledge.grouped_gemm_ops, node_times,
                             fp8_scaling),
                expert_work(graph, nodes, expert_sized, all_times))
    routers = router_modules(graph, expert_params, expert_count(graph, expert_params))
    router_params = {p.name for p in graph.params if p.owner in routers}
    params_by_unit = _params_by_unit(graph, of_node, unit_names)
    param_shapes = {p.name: p.spec.shape for p in graph.params if not p.is_buffer}
    flops = {n.id: n.flops for n in report.nodes}
    for name in unit_names:
        states = {"split": StateBytes(), "whole": StateBytes(), "expert": StateBytes()}
        kinds = {}
        for param in params_by_unit.get(name, ()):
            kind = ("expert" if param in expert_params
                    else "split" if param in split_params else "whole")
            states[kind] = states[kind].plus(state_of.get(param, StateBytes()))
            kinds[param] = kind
        timing = unit_times(graph, members[name], split_nodes, module_split, times)
        gemms = splits[name].gemms
        embedded = _lookup_output(graph, forward[name], vocab)
        payloads, experts = splits[name].payloads, splits[name].expert_rows
        expert_reduced = sum(payloads[r] for r in experts)
        routed = gemm_rows(graph, [(gemms[c].weights, gemms[c].activations)
                                   for c in splits[name].columns], expert_params)
        unit_experts = expert_gemms(graph, members[name], knowledge.grouped_gemm_ops,
                                    node_times, fp8_scaling)
        unit_expert_work = expert_work(graph, members[name], expert_sized, all_times)
        policy = (op_policy_part(graph, sorted(forward[name]), split_nodes, times, knowledge,
                                 fusion is not None, unit_experts, unit_expert_work,
                                 serial_part)
                  if name in blocks else ModulePart(""))
        units.append(Unit(
            name=name, states_split=states["split"], states_whole=states["whole"],
            states_expert=states["expert"], saved_split_bytes=saved[name][0],
            saved_whole_bytes=saved[name][1],
            input_bytes=_input_bytes(graph, forward[name], handed[name]),
            forward_split_s=timing[0], forward_whole_s=timing[1], backward_split_s=timing[2],
            backward_whole_s=timing[3],
            flops=sum(flops.get(n, 0) for n in members[name]),
            tp_reduce_bytes=sum(payloads.values()) - expert_reduced + embedded[0],
            tp_reduces=len(payloads) - len(experts) + embedded[1],
            etp_reduce_bytes=expert_reduced, etp_reduces=len(experts),
            routed_bytes=routed[0], routed_rows=routed[1],
            router_rows=gemm_rows(graph, [(g.weights, g.activations) for g in gemms.values()],
                                  router_params)[1],
            column_widths=tuple(sorted({gemms[c].out_features for c in splits[name].columns})),
            row_gemms=len(splits[name].rows),
            attention=unit_attention(graph, members[name], knowledge.attention_ops,
                                     knowledge.weight_path_ops, node_times),
            expert_gemms=unit_experts, expert_work=unit_expert_work,
            serials=serial_part(members[name]),
            router_s=router_s(graph, members[name], routers, times),
            matrices=gradient_matrices((param_shapes.get(p, ()), k) for p, k in kinds.items()),
            parts=module_parts(graph, name, members[name], split_nodes, times,
                               saved_in[name], expert_part, part_of, launched, serial_part)
            if name in blocks else (),
            op_policy=policy,
            launches=phase_counts(graph, members[name], launched),
        ))
    kept = tuple(u for u in units if u.name in blocks or u.flops or u.states.total)
    per_layer = expert_count(graph, expert_params)
    return ModelFacts(units=kept, blocks=len(blocks), experts=per_layer,
                      routing_groups=routing_groups if per_layer else (1, 1),
                      **{**vars(whole_step), "moments": step_moments(
                          step, registry, whole_step.moments, expert_shapes)})


@dataclass(frozen=True)
class WholeStep:
    """Whole-step figures from the single-GPU training analysis."""

    moments: tuple[LiveSplit, ...]
    optimizer_temporaries_bytes: int
    optimizer_s: float
    samples: int
    tokens: int
    dtype_key: str
    peak_flops: float
    notes: tuple[str, ...] = ()
    grad_element_bytes: float = 2.0


def _params_by_unit(graph: Graph, of_node: Mapping[int, str], names: Sequence[str]
                    ) -> dict[str, list[str]]:
    """Each parameter in the unit of its first forward reader (buffers included)."""
    unit_of_param: dict[str, str] = {}
    for node in graph.calls():
        if node.phase != "forward":
            continue
        for ref in node.input_refs():
            source = graph.nodes[ref.node]
            if source.kind in (NodeKind.PARAM, NodeKind.BUFFER):
                unit_of_param.setdefault(source.target, of_node[node.id])
    by_unit: dict[str, list[str]] = {name: [] for name in names}
    for p in graph.params:
        by_unit[unit_of_param.get(p.name, "pre")].append(p.name)
    return by_unit


def _vocab_embedding(graph: Graph, knowledge: ParallelKnowledge) -> tuple[int, str] | None:
    """The token embedding: of the forward's lookups, the one into the table with the most
    rows (position tables stay replicated, as in Megatron-LM)."""
    best: tuple[int, int, str] | None = None
    for node in graph.calls():
        weight = node.args.get("weight")
        if node.phase != "forward" or node.packet not in knowledge.embedding_ops or not (
                isinstance(weight, TensorRef)):
            continue
        name = weight_param(graph, weight, knowledge)
        rows = graph_param_shape(graph, name)[:1] if name else ()
        if name and rows and (best is None or rows[0] > best[0]):
            best = (rows[0], node.id, name)
    return (best[1], best[2]) if best is not None else None


def _lookup_output(graph: Graph, scope: set[int], vocab: tuple[int, str] | None
                   ) -> tuple[int, int]:
    """Bytes and count of the vocab-parallel lookup's output in `scope` (an all-reduce)."""
    if vocab is None or vocab[0] not in scope:
        return 0, 0
    spec = graph.nodes[vocab[0]].outputs[0]
    return (spec.nbytes if spec is not None else 0), 1


def _expert_params(graph: Graph, knowledge: ParallelKnowledge) -> set[str]:
    found = {p.name for p in graph.params
             if not p.is_buffer and EXPERT_SEGMENT.search(p.owner)}
    for gemm in weight_gemms(graph, (n.id for n in graph.calls()
                               if n.packet in knowledge.grouped_gemm_ops), knowledge).values():
        found.update(gemm.weights)
    return found
