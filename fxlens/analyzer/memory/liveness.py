"""`liveness(graph, registry) -> MemoryProfile`: what is alive at each node of a captured graph.

What it models: a *graph executor* running the captured graph as one stream of ops and freeing
each storage right after its last use — what ``torch.compile``, an exported program or a
static-memory planner can achieve, a lower bound for eager PyTorch. Even with
`Lifetimes.EAGER` (below), which adds the references an eager run provably keeps, Python
holds more than the graph shows (names alive until ``forward`` returns, temporaries of ops that
decompose when run eagerly, MoE routing buffers). Measured against real CPU runs
(`fxlens.analyzer.memory.measure.measure_memory`) on the `transformers` models of
``tests/models/hf_zoo.py`` (Llama, GPT-2, BERT, Mixtral, Qwen3-MoE, Phi-3, T5, Whisper, ViT):
`Lifetimes.GRAPH` is 11–55 % below the eager peak, `Lifetimes.EAGER` 0–41 % below, the
fake-tensor simulation within 1 %. So for "how much memory does ``model(x)`` take", lead with
the simulated eager peak (``memory.eager.peak_bytes``, `fxlens.analyzer.memory.measure.
simulate_eager_memory`: the forward on fake tensors, every Python reference included); this
profile explains *what* is alive at its peak (tensors, modules, categories), which the
simulation does not.

Two iterative passes over the node order, linear in nodes + references (`plan_storages` maps
every tensor to a storage and finds its last use; the sweep adds and frees bytes):

- Each op output either opens a fresh *storage* or aliases an input's. A storage lives from
  the node that allocates it to the last node that reads it or any of its aliases (a view, an
  in-place or ``out=`` result); `graph.outputs` and every tensor in `graph.roles` (gradients,
  optimizer state of a training step) live to the end. An output nobody reads lives only
  through its own node.
- Aliasing comes from the op schema: return ``i`` shares storage with the argument(s) in its
  alias set (``Tensor(a)``, ``Tensor(a!)``; a ``Tensor(a)[]`` return, whose element sets
  Python cannot see, with the annotated argument). Chains of aliases resolve to one storage.
  Where the annotation is only sometimes true, or missing, the registry's alias check for the
  op decides per call (`CostRegistry.alias_check`, filled by the rules: ``reshape`` is a view
  only when the strides allow it, ``to``/``contiguous`` only when a no-op, eval ``dropout``
  returns its input). The check lives in the registry because which ops need it is op
  knowledge, which belongs to `fxlens.rules`; this module only asks.
- Lifetimes: `Lifetimes.GRAPH` frees at the last use, as a graph executor can;
  `Lifetimes.EAGER` (the default: what ``model(x)`` holds) extends them by the references
  Python provably keeps, call arguments and named values (`fxlens.analyzer.memory.eager`), for
  forward-phase readers only.
- A fresh storage takes its output's storage extent (strides included) in bytes.
- At node ``i`` its outputs are allocated while its inputs are still live; storages whose last
  use is ``i`` are freed after it. ``timeline[i]`` is the live activation (+ gradient
  + optimizer state) bytes right after node ``i``'s allocation, before its frees: where peaks
  happen. Parameters, buffers and graph inputs are reported apart, never in the timeline.

Categories: PARAM/BUFFER/INPUT nodes are params/buffers/inputs; storages of call nodes are
activations, unless `graph.roles` names one "gradient" or "optimizer_state". A role on an
input node's tensor (state that existed before the step) is counted in its role from the
start of the timeline.

NB: the graph is a single stream of ops: allocator caching, fragmentation, kernel workspaces
and the short-lived extra outputs of ops that decompose when run eagerly (e.g. the
mean/rstd of ``layer_norm``, the logsumexp of CPU flash attention) are not modelled, nor
are names an eager ``forward`` keeps until it returns (see `fxlens.analyzer.memory.eager`);
`fxlens.analyzer.memory.measure` compares with real runs.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from fxlens.analyzer.core.aten import resolve_op
from fxlens.analyzer.core.costs import CostRegistry, OpCall
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef, TensorSpec
from fxlens.analyzer.core.sections import EagerPeak, LiveSplit, LiveTensor, Memory
from fxlens.analyzer.memory.eager import EagerScopes

log = logging.getLogger(__name__)


class Lifetimes(str, Enum):
    GRAPH = "graph"   # freed right after the last reader
    EAGER = "eager"   # plus what an eager Python run keeps (fxlens.analyzer.memory.eager)


class Category(str, Enum):
    PARAM = "param"
    BUFFER = "buffer"
    INPUT = "input"
    ACTIVATION = "activation"
    GRADIENT = "gradient"
    OPTIMIZER_STATE = "optimizer_state"


RESIDENT = {NodeKind.PARAM: Category.PARAM, NodeKind.BUFFER: Category.BUFFER,
            NodeKind.INPUT: Category.INPUT}
ROLES = {"gradient": Category.GRADIENT, "optimizer_state": Category.OPTIMIZER_STATE}
COUNTED = frozenset({Category.ACTIVATION, Category.GRADIENT, Category.OPTIMIZER_STATE})


@dataclass(frozen=True)
class MemoryProfile:
    """Liveness of one graph. Bytes are ints; `timeline` has one entry per call node."""

    lifetimes: str
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    peak_activation_bytes: int           # max of `timeline`: activations + gradients + states
    peak_node: int | None                # node id where the peak happens (None: no call nodes)
    peak_module: str
    timeline: tuple[int, ...]
    live_at_peak: tuple[LiveTensor, ...]                 # largest first
    peak_by_category: Mapping[str, int] = field(default_factory=dict)     # each on its own
    at_peak_by_category: Mapping[str, int] = field(default_factory=dict)  # the peak's make-up
    peak_by_phase: Mapping[str, int] = field(default_factory=dict)
    moments: tuple[LiveSplit, ...] = ()  # live by why (`saved` apart) at the peak and where
                                         # the working activations peak
    allocated_by_module: Mapping[str, int] = field(default_factory=dict)  # own nodes only
    live_at_peak_by_module: Mapping[str, int] = field(default_factory=dict)

    def to_section(self, max_live: int | None = 50, eager: EagerPeak | None = None) -> Memory:
        """The report's ``memory`` section; `max_live` caps the listed live tensors."""
        live = self.live_at_peak if max_live is None else self.live_at_peak[:max_live]
        return Memory(
            lifetimes=self.lifetimes, param_bytes=self.param_bytes,
            buffer_bytes=self.buffer_bytes, input_bytes=self.input_bytes,
            peak_activation_bytes=self.peak_activation_bytes,
            peak_node=self.peak_node, peak_module=self.peak_module,
            timeline=self.timeline, live_at_peak=live,
            live_at_peak_count=len(self.live_at_peak),
            peak_by_category=dict(self.peak_by_category),
            at_peak_by_category=dict(self.at_peak_by_category),
            peak_by_phase=dict(self.peak_by_phase),
            allocated_by_module=dict(self.allocated_by_module),
            live_at_peak_by_module=dict(self.live_at_peak_by_module),
            eager=eager,
        )


# --- aliasing ---------------------------------------------------------------------------------

@functools.cache
def schema_aliases(target: str) -> tuple[tuple[str, ...], ...] | None:
    """Per schema return, the argument names it may share storage with; None: not an op.

    A single list return (``Tensor(a)[]``) applies to every output of the node.
    """
    try:
        schema = resolve_op(target)._schema
    except (AttributeError, ValueError, RuntimeError):
        return None
    annotated = [(a.name, set(a.alias_info.before_set)) for a in schema.arguments
                 if a.alias_info is not None and a.alias_info.before_set]
    result: list[tuple[str, ...]] = []
    for ret in schema.returns:
        info = ret.alias_info
        if info is None:
            result.append(())
        elif info.before_set:
            result.append(tuple(name for name, sets in annotated if sets & info.before_set))
        else:  # a list container: its elements' alias sets are not exposed to Python
            result.append(tuple(name for name, _ in annotated))
    return tuple(result)


def _ref_of(value: Any, index: int) -> TensorRef | None:
    if isinstance(value, TensorRef):
        return value
    if isinstance(value, (list, tuple)):
        refs = [v for v in value if isinstance(v, TensorRef)]
        if refs:
            return refs[index] if index < len(refs) else refs[0]
    return None


def aliased_inputs(node: Node, graph: Graph, registry: CostRegistry) -> list[TensorRef | None]:
    """For each output of a call node, the input whose storage it shares (None: fresh)."""
    returns = schema_aliases(node.target) or ()
    per_output = [returns[0] if len(returns) == 1 else returns[i] if i < len(returns) else ()
                  for i in range(len(node.outputs))]
    check = registry.alias_check(node.target)
    if check is not None:
        verdict = _run_check(check, node, graph)
        if verdict is False:
            return [None] * len(node.outputs)
        if verdict is True:
            first = next((k for k, v in node.args.items() if isinstance(v, TensorRef)), "")
            per_output = [names or (first,) for names in per_output]
    return [next((r for r in (_ref_of(node.args.get(n), i) for n in names) if r), None)
            for i, names in enumerate(per_output)]


def _run_check(check: Any, node: Node, graph: Graph) -> bool | None:
    try:
        return bool(check(OpCall(node, graph)))
    except Exception as error:  # a failing check falls back to the schema, never kills the pass
        log.warning("alias check failed on %s (node %d): %s", node.target, node.id, error)
        return None


# --- the sweep --------------------------------------------------------------------------------

@dataclass
class Storages:
    """Every storage of a graph by integer id, in parallel lists; `of_ref` maps each tensor to
    its storage. Built by `plan_storages`; read-only for everyone else."""

    size: list[int] = field(default_factory=list)
    category: list[Category] = field(default_factory=list)
    producer: list[int] = field(default_factory=list)   # position; -1: live from the start
    last: list[int] = field(default_factory=list)       # position of the last use
    origin: list[tuple[Node, TensorSpec]] = field(default_factory=list)
    of_ref: dict[TensorRef, int] = field(default_factory=dict)

    def open(self, node: Node, position: int, spec: TensorSpec, category: Category) -> int:
        self.size.append(spec.allocation_bytes)
        self.category.append(category)
        self.producer.append(position)
        self.last.append(position)
        self.origin.append((node, spec))
        return len(self.size) - 1


def plan_storages(
    graph: Graph, registry: CostRegistry, lifetimes: Lifetimes = Lifetimes.GRAPH
) -> Storages:
    """Storage of every tensor, its category and its last use (the first pass)."""
    st = Storages()
    eager = EagerScopes(graph) if lifetimes is Lifetimes.EAGER else None
    positions = {node.id: position for position, node in enumerate(graph.nodes)}
    resident: dict[tuple[str, int], int] = {}   # a parameter's or buffer's storage, first name
    for position, node in enumerate(graph.nodes):
        if node.kind is not NodeKind.CALL:
            name = graph.tied.get(str(node.target), str(node.target))
            for i, spec in enumerate(node.outputs):
                if spec is None:
                    continue
                sid = resident.get((name, i))
                if sid is None:
                    sid = st.open(node, position, spec, RESIDENT[node.kind])
                    if node.kind is not NodeKind.INPUT:
                        resident[(name, i)] = sid
                st.of_ref[TensorRef(node.id, i)] = sid
            continue
        held = eager if node.phase == "forward" else None
        for ref in node.input_refs():
            sid = st.of_ref.get(ref)
            if sid is not None:
                until = held.hold_until(position, positions[ref.node]) if held else position
                st.last[sid] = max(st.last[sid], until)
        sources = aliased_inputs(node, graph, registry)
        for i, spec in enumerate(node.outputs):
            if spec is None:
                continue
            source = sources[i]
            sid = st.of_ref.get(source) if source is not None else None
            if sid is None:
                sid = st.open(node, position, spec, Category.ACTIVATION)
            st.of_ref[TensorRef(node.id, i)] = sid
    _keep_to_end(graph, st)
    return st


def _keep_to_end(graph: Graph, st: Storages) -> None:
    end = len(graph.nodes)
    for ref in graph.outputs:
        if ref in st.of_ref:
            st.last[st.of_ref[ref]] = end
    for ref, role in graph.roles.items():
        sid = st.of_ref.get(ref)
        if sid is None:
            continue
        st.last[sid] = end
        if role in ROLES and st.category[sid] in (Category.ACTIVATION, Category.INPUT):
            if st.category[sid] is Category.INPUT:
                st.producer[sid] = -1
            st.category[sid] = ROLES[role]


@dataclass
class _Sweep:
    timeline: list[int] = field(default_factory=list)
    peak: int = 0
    peak_position: int = -1
    peak_by_category: Counter[str] = field(default_factory=Counter)
    peak_by_phase: dict[str, int] = field(default_factory=dict)
    moments: list[LiveSplit] = field(default_factory=list)   # at the peak, the working peak


def _sweep(graph: Graph, st: Storages, saved: frozenset[int] = frozenset()) -> _Sweep:
    n = len(graph.nodes)
    allocs: list[list[int]] = [[] for _ in range(n)]
    frees: list[list[int]] = [[] for _ in range(n + 1)]
    live, by_category = 0, Counter[str]()
    for sid, category in enumerate(st.category):
        if category not in COUNTED:
            continue
        if st.producer[sid] < 0:
            live += st.size[sid]
            by_category[category.value] += st.size[sid]
        else:
            allocs[st.producer[sid]].append(sid)
        frees[st.last[sid]].append(sid)
    out = _Sweep(peak_by_category=Counter(by_category))
    held = 0        # the live storages of `saved`
    at_peak = working_peak = LiveSplit(0, 0, 0)

    def kept(sid: int) -> int:
        return st.size[sid] if sid in saved else 0

    for position, node in enumerate(graph.nodes):
        if node.kind is NodeKind.CALL:
            for sid in allocs[position]:
                live += st.size[sid]
                held += kept(sid)
                key = st.category[sid].value
                by_category[key] += st.size[sid]
                out.peak_by_category[key] = max(out.peak_by_category[key], by_category[key])
            out.timeline.append(live)
            now = LiveSplit(held, by_category[Category.ACTIVATION.value] - held,
                            by_category[Category.GRADIENT.value], node.id)
            working_peak = max(working_peak, now, key=lambda m: m.working_bytes)
            if live > out.peak or out.peak_position < 0:
                out.peak, out.peak_position, at_peak = live, position, now
            out.peak_by_phase[node.phase] = max(out.peak_by_phase.get(node.phase, 0), live)
        for sid in frees[position]:
            live -= st.size[sid]
            held -= kept(sid)
            by_category[st.category[sid].value] -= st.size[sid]
    out.moments = [at_peak, working_peak]
    return out


def timeline(graph: Graph, st: Storages) -> tuple[int, ...]:
    """Live bytes right after each call node's allocations (`MemoryProfile.timeline`), for
    storages `plan_storages` planned on `graph`."""
    return tuple(_sweep(graph, st).timeline)


def _live_at(st: Storages, position: int) -> tuple[LiveTensor, ...]:
    live = []
    for sid, category in enumerate(st.category):
        if category in COUNTED and st.producer[sid] <= position <= st.last[sid]:
            node, spec = st.origin[sid]
            live.append(LiveTensor(node.id, node.module, node.target, st.size[sid], spec.shape,
                                   spec.dtype, category.value))
    return tuple(sorted(live, key=lambda t: (-t.bytes, t.node)))


def _resident_bytes(st: Storages, category: Category) -> int:
    return sum(s for s, c in zip(st.size, st.category, strict=True) if c is category)


def _allocated_by_module(st: Storages) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for sid, category in enumerate(st.category):
        if category in COUNTED and st.producer[sid] >= 0:
            totals[st.origin[sid][0].module] += st.size[sid]
    return dict(sorted(totals.items()))


def liveness(
    graph: Graph, registry: CostRegistry, lifetimes: Lifetimes = Lifetimes.EAGER,
    extend: Callable[[Graph, Storages], None] | None = None,
    saved: Iterable[TensorRef] = (),
) -> MemoryProfile:
    """Liveness of `graph`'s storages; `registry` supplies the rules' alias checks; `extend`,
    if given, lengthens lifetimes (``Storages.last``) the graph cannot show before the sweep
    (`fxlens.analyzer.checkpoint.model.unpack_holds`); `saved`: the tensors a training step
    keeps for its backward, which `MemoryProfile.moments` tells apart from the working
    activations beside them (the forward's temporaries, the backward's activation gradients)."""
    st = plan_storages(graph, registry, lifetimes)
    if extend is not None:
        extend(graph, st)
    held = frozenset(sid for sid in (st.of_ref.get(ref) for ref in saved)
                     if sid is not None and st.category[sid] is Category.ACTIVATION)
    sweep = _sweep(graph, st, held)
    peak_node = graph.nodes[sweep.peak_position] if sweep.peak_position >= 0 else None
    live = _live_at(st, sweep.peak_position) if peak_node is not None else ()
    at_peak: Counter[str] = Counter()
    by_module: Counter[str] = Counter()
    for tensor in live:
        at_peak[tensor.category] += tensor.bytes
        by_module[tensor.module] += tensor.bytes
    return MemoryProfile(
        lifetimes=lifetimes.value,
        param_bytes=_resident_bytes(st, Category.PARAM),
        buffer_bytes=_resident_bytes(st, Category.BUFFER),
        input_bytes=_resident_bytes(st, Category.INPUT),
        peak_activation_bytes=sweep.peak,
        peak_node=peak_node.id if peak_node is not None else None,
        peak_module=peak_node.module if peak_node is not None else "",
        timeline=tuple(sweep.timeline),
        live_at_peak=live,
        peak_by_category=dict(sorted(sweep.peak_by_category.items())),
        at_peak_by_category=dict(sorted(at_peak.items())),
        peak_by_phase=dict(sorted(sweep.peak_by_phase.items())),
        moments=tuple(sweep.moments),
        allocated_by_module=_allocated_by_module(st),
        live_at_peak_by_module=dict(sorted(by_module.items())),
    )
