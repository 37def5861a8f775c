"""What one unit of the step costs: its seconds and saved bytes on split and replicated
features, and the work context and expert parallelism resize: its attention kernels and expert
GEMMs.

Seconds (`unit_times`) and saved activations (`saved_by_module`) are split between the nodes
tensor parallelism divides and the rest; backward ops are attributed to the module whose
forward they differentiate, a module's split share of the backward taken to be its share in
the forward (`module_split_share`). Per module of a unit (`ModulePart`): its forward
seconds and the activations its ops save, what a selective recompute trades.

Attention (`UnitAttention`): the roofline seconds of a unit's attention kernels forward and
backward, and the bytes of the K and V its forward attention reads, taken before grouped-query
heads are repeated (walking back from the kernel's inputs through views and copies to the
smallest tensor: ring attention passes the un-repeated K/V, as Megatron-core and
torchtitan do).

Expert GEMMs (`ExpertGemm`): every grouped GEMM of a MoE (``aten._grouped_mm``: forward, and the
two of its backward), with its compute seconds and its memory seconds split between the
operands sized like expert weights (3-D, experts first: the weights, and the weight gradient
the backward writes) and those sized like routed tokens (2-D rows). A layout re-sizes each:
compute and token operands follow the rows a GPU receives, weight operands the experts it
holds (`ExpertGemm.on_rank`). Captured on one GPU with every expert and one micro-batch's
tokens, a GEMM of DeepSeek-V3 at 4,096 tokens reads 256 experts' weights for 128 rows each
and is memory-bound; under ep = 64 a GPU holds 4 experts and receives 64 micro-batches' worth
of rows for them, and is compute-bound.
Other ops whose output has the shape of an expert weight
(`fxlens.analyzer.plan.moe_model.expert_weight_nodes`: autocast's casts of the expert weights,
the copies and sums of their gradients) are expert work too: a GPU runs them on the experts it
holds. Left with the replicated work, DeepSeek-V3's weight-gradient
copies alone took 17 ms of each MoE layer's backward at every ep, 64 times a rank's share.
NB: MoE layers written as a loop of per-expert linears are not recognised here; their GEMMs
stay with the unit's split work (sized by the captured micro-batch).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import islice
from typing import Any, Protocol

from fxlens.analyzer.capture.training import TrainingGraph
from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef, ancestors
from fxlens.analyzer.memory.liveness import Category, Storages, plan_storages
from fxlens.analyzer.plan.fp8 import fp8_saved
from fxlens.analyzer.plan.serial import SerialSteps


class Timed(Protocol):
    """What a roofline time of one node carries (`fxlens.analyzer.time.roofline.NodeTime`)."""

    @property
    def time_s(self) -> float: ...
    @property
    def compute_s(self) -> float: ...
    @property
    def memory_s(self) -> float: ...
    @property
    def serial_s(self) -> float: ...


@dataclass(frozen=True)
class ExpertGemm:
    phase: str              # "forward" or "backward"
    compute_s: float        # at the captured shape (every expert, one micro-batch)
    weight_s: float         # memory seconds of the operands sized like expert weights
    token_s: float          # memory seconds of the operands sized like routed tokens
    scaling_s: float = 0.0  # fp8: quantizing its token operands, a pass of its own
                            # (`fxlens.analyzer.plan.fp8.scaling_s`)

    def on_rank(self, work_share: float, weight_share: float, token_share: float) -> float:
        """Seconds on one GPU doing `work_share` of the captured FLOPs, reading
        `weight_share` of the captured expert weights and `token_share` of the token rows,
        those rows quantized first (fp8) in a pass of their own."""
        return (max(self.compute_s * work_share,
                    self.weight_s * weight_share + self.token_s * token_share)
                + self.scaling_s * token_share)


@dataclass(frozen=True)
class ExpertWork:
    """Seconds of a unit's other expert-weight-sized ops (every expert), per phase."""

    forward_s: float = 0.0
    backward_s: float = 0.0


def expert_work(graph: Graph, members: Iterable[int], nodes: Collection[int],
                times: Mapping[int, float]) -> ExpertWork:
    forward = backward = 0.0
    for node_id in members:
        if node_id not in nodes:
            continue
        if graph.nodes[node_id].phase == "forward":
            forward += times.get(node_id, 0.0)
        else:
            backward += times.get(node_id, 0.0)
    return ExpertWork(forward, backward)


@dataclass(frozen=True)
class UnitAttention:
    forward_s: float = 0.0
    backward_s: float = 0.0
    kv_bytes: int = 0       # K and V read by the forward attention, un-repeated
    q_bytes: int = 0        # its queries
    out_bytes: int = 0      # its output


def expert_gemms(graph: Graph, members: Iterable[int], grouped_ops: Collection[str],
                 times: Mapping[int, Timed], scaling: Mapping[int, float] | None = None
                 ) -> tuple[ExpertGemm, ...]:
    """The grouped GEMMs among `members` (`scaling`: fp8 quantization seconds per GEMM)."""
    found = []
    for node_id in members:
        node = graph.nodes[node_id]
        timed = times.get(node_id)
        if node.packet not in grouped_ops or timed is None:
            continue
        specs = [graph.spec(r) for r in node.input_refs()] + list(node.outputs)
        weight = sum(s.nbytes for s in specs if s is not None and len(s.shape) == 3)
        tokens = sum(s.nbytes for s in specs if s is not None and len(s.shape) == 2)
        moved = weight + tokens
        share = weight / moved if moved else 0.0
        found.append(ExpertGemm(node.phase, timed.compute_s, timed.memory_s * share,
                                timed.memory_s * (1 - share), (scaling or {}).get(node_id, 0.0)))
    return tuple(found)


def unit_attention(graph: Graph, members: Iterable[int], attention_ops: Collection[str],
                   view_ops: Collection[str], times: Mapping[int, Timed]) -> UnitAttention:
    forward = backward = 0.0
    kv = q = out = 0
    for node_id in members:
        node = graph.nodes[node_id]
        if node.packet not in attention_ops:
            continue
        seconds = times[node_id].time_s if node_id in times else 0.0
        if node.phase == "forward":
            forward += seconds
            refs = list(node.input_refs())
            kv += sum(_unrepeated_bytes(graph, ref, view_ops) for ref in refs[1:3])
            query = graph.spec(refs[0]) if refs else None
            q += query.nbytes if query is not None else 0
            out += node.outputs[0].nbytes if node.outputs and node.outputs[0] else 0
        else:
            backward += seconds
    return UnitAttention(forward, backward, kv, q, out)


COPY_CHAIN = 8    # views and copies walked back through, at most


def copy_sources(graph: Graph, ref: TensorRef, ops: Collection[str]) -> Iterator[TensorRef]:
    """`ref`, then each tensor it was made from by `ops` alone (views, copies), walking back
    along first inputs at most `COPY_CHAIN` steps."""
    yield ref
    node = graph.nodes[ref.node]
    for _ in range(COPY_CHAIN):
        refs = list(node.input_refs())
        if node.packet not in ops or not refs:
            return
        yield refs[0]
        node = graph.nodes[refs[0].node]


def _unrepeated_bytes(graph: Graph, ref: TensorRef, view_ops: Collection[str]) -> int:
    """The smallest tensor `ref` is made from by views and copies alone."""
    chain = copy_sources(graph, ref, view_ops)
    spec = graph.spec(next(chain))
    smallest = spec.nbytes if spec is not None else 0
    for source in chain:
        spec = graph.spec(source)
        if spec is not None and spec.nbytes:
            smallest = min(smallest, spec.nbytes)
    return smallest


def module_split_share(graph: Graph, split_nodes: set[int], times: Mapping[int, float]
                        ) -> dict[str, float]:
    total: dict[str, float] = {}
    split: dict[str, float] = {}
    for node in graph.calls():
        if node.phase != "forward":
            continue
        total[node.module] = total.get(node.module, 0.0) + times.get(node.id, 0.0)
        if node.id in split_nodes:
            split[node.module] = split.get(node.module, 0.0) + times.get(node.id, 0.0)
    return {m: split.get(m, 0.0) / t for m, t in total.items() if t > 0}


def unit_times(graph: Graph, members: Iterable[int], split_nodes: set[int],
                module_split: Mapping[str, float], times: Mapping[int, float]
                ) -> tuple[float, float, float, float]:
    """Forward split, forward replicated, backward split, backward replicated seconds of one
    unit's nodes (`members`)."""
    fs = fw = bs = bw = 0.0
    for node_id in members:
        node: Node = graph.nodes[node_id]
        seconds = times.get(node_id, 0.0)
        if node.phase == "forward":
            if node_id in split_nodes:
                fs += seconds
            else:
                fw += seconds
        else:
            share = module_split.get(node.module, 0.0)
            bs += seconds * share
            bw += seconds * (1 - share)
    return fs, fw, bs, bw


def phase_counts(graph: Graph, members: Iterable[int], launched: Collection[int]
                 ) -> tuple[int, int]:
    """How many of `members` launch a kernel (`launched`), forward and backward."""
    forward = backward = 0
    for node_id in members:
        if node_id in launched:
            if graph.nodes[node_id].phase == "forward":
                forward += 1
            else:
                backward += 1
    return forward, backward


def saved_by_module(step: TrainingGraph, registry: CostRegistry, of_node: Mapping[int, str],
                    split_nodes: set[int], copy_ops: Collection[str],
                    fusion: FusedOps | None = None, part_of: Mapping[int, str] | None = None
                    ) -> dict[tuple[str, str], tuple[int, int]]:
    """Saved activation bytes per (unit, module of the op that made them): (on split
    features, replicated); each storage once. A tensor made by views and casts alone
    (`copy_ops`: autocast's bf16 copy of a norm's output, made inside the next Linear) belongs
    to the module that made what they copy. `fusion`: saved as fused kernels keep them
    (`fused_saved`); None: the saved set as captured. `part_of`: a part other than its module
    for some nodes (`expert_activation_parts`)."""
    storages = plan_storages(step.graph, registry)
    out: defaultdict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    saved = list(dict.fromkeys(
        sid for sid in (storages.of_ref.get(ref) for ref in step.saved)
        if sid is not None and storages.category[sid] is Category.ACTIVATION))
    size: dict[int, int] = {}
    if fusion is not None:
        saved = fused_saved(step.graph, storages, saved, fusion)
        size = fp8_saved(step.graph, storages, saved, fusion.fp8_gemms)
    for sid in saved:
        node, _ = storages.origin[sid]
        key = (of_node.get(node.id, "pre"), _made_in(step.graph, node, copy_ops, part_of or {}))
        out[key][0 if node.id in split_nodes else 1] += size.get(sid, storages.size[sid])
    return {key: (split, whole) for key, (split, whole) in out.items()}


RECOMPUTE_DEPTH = 12     # cheap ops a recompute walks back through, at most


@dataclass(frozen=True)
class FusedOps:
    """How fused kernels treat the step's ops: `cheap` ones (pointwise, norms, views) are
    fused and recomputed, `gemms` keep their inputs; `fp8_gemms` (fp8 training) keep their
    activation input's fp8 copy (`fxlens.analyzer.plan.fp8.fp8_saved`)."""

    cheap: frozenset[int]
    gemms: frozenset[int]
    fp8_gemms: frozenset[int] = frozenset()


def fused_saved(graph: Graph, storages: Storages, saved: Sequence[int],
                fusion: FusedOps) -> list[int]:
    """The saved storages as fused kernels keep them. A tensor that a `cheap` op (pointwise,
    norm, view: what a fusing compiler fuses) made, and that no other op reads in the
    forward, is recomputed in the backward from its inputs when they cost fewer bytes: inputs
    kept already cost nothing, each input is itself kept or recomputed, whichever is smaller
    (walking back at most `RECOMPUTE_DEPTH` ops). GEMM inputs stay saved, as Transformer
    Engine's fused modules save them. So float32 norm internals become the norm's bf16 input,
    the SiLU's output is recomputed from the gate's, grouped-query K and V repeated for the
    attention kernel become the un-repeated ones, and a float mask made from a boolean one
    is made again."""
    cheap = fusion.cheap
    read_by_gemm: set[int] = set()
    for node in graph.calls():
        if node.phase == "forward" and node.id in fusion.gemms:
            read_by_gemm.update(sid for sid in (storages.of_ref.get(r)
                                                for r in node.input_refs()) if sid is not None)
    kept: set[int] = set()

    def best(sid: int, depth: int, memo: dict[int, tuple[int, frozenset[int]]]
             ) -> tuple[int, frozenset[int]]:
        if sid in kept:
            return 0, frozenset()
        if sid in memo:
            return memo[sid]
        keep = (storages.size[sid], frozenset({sid}))
        node, _ = storages.origin[sid]
        result = keep
        if depth > 0 and node.id in cheap and sid not in read_by_gemm:
            total, members = 0, frozenset[int]()
            for ref in node.input_refs():
                source = storages.of_ref.get(ref)
                if source is None or storages.category[source] is not Category.ACTIVATION:
                    continue
                cost, chosen = best(source, depth - 1, memo)
                total, members = total + cost, members | chosen
                if total >= keep[0]:
                    break
            if total < keep[0]:
                result = (total, members)
        memo[sid] = result
        return result

    for sid in saved:
        kept |= best(sid, RECOMPUTE_DEPTH, {})[1]
    return sorted(kept)


def _made_in(graph: Graph, node: Node, copy_ops: Collection[str], part_of: Mapping[int, str]
             ) -> str:
    """The module (or part) of the op `node` copies or views, through a chain of such ops."""
    made = node
    for source in islice(copy_sources(graph, TensorRef(node.id), copy_ops), 1, None):
        if graph.nodes[source.node].kind is not NodeKind.CALL:
            break
        made = graph.nodes[source.node]
    return part_of.get(made.id, made.module)


ACTIVATION_PART = "act_fn"


def expert_activation_parts(graph: Graph, regions: Mapping[int, Collection[int]]
                            ) -> dict[int, str]:
    """The part each op of a MoE layer's activation belongs to: `regions` gives, per expert
    row GEMM (the down-projection), the ops between it and its columns (the gate/up
    projection: the SwiGLU, clamps, biases), as `tensor_split` walks them. They form the part
    ``<experts module>.act_fn`` whether `transformers` wrote the activation as a module or
    inline (GPT-OSS): what Megatron's ``moe_act`` recompute drops is their output, the
    down-projection's input, and what it keeps is the up-projection's output."""
    return {node_id: f"{graph.nodes[row].module}.{ACTIVATION_PART}"
            for row, nodes in regions.items() for node_id in nodes}


@dataclass(frozen=True)
class ModulePart:
    """The forward of one module's own ops inside a unit (its children are parts of their
    own) and the activations they save: what a selective recompute of it costs and frees.
    Named and timed like a `Unit` so a layout sizes both alike (`name`: the module path)."""

    name: str
    saved_split_bytes: int = 0
    saved_whole_bytes: int = 0
    forward_split_s: float = 0.0
    forward_whole_s: float = 0.0
    backward_split_s: float = 0.0          # never recomputed: kept 0
    backward_whole_s: float = 0.0
    expert_gemms: tuple[ExpertGemm, ...] = ()
    expert_work: ExpertWork = ExpertWork()
    types: tuple[str, ...] = ()            # type names, lower case, of each path segment below
                                           # the unit down to this module
    launches: tuple[int, int] = (0, 0)     # kernels of its own ops, forward and backward
    serials: tuple[SerialSteps, ...] = ()  # its recurrences' steps (not in the seconds above)

    @cached_property
    def answers(self) -> dict[Hashable, Any]:
        """What the planner derives from this module part alone, by question (the layout's degrees
        it reads, a set of ``ckpt=`` patterns): `fxlens.analyzer.plan.types.remembered`."""
        return {}


def module_parts(graph: Graph, unit: str, members: Iterable[int], split_nodes: set[int],
                 times: Mapping[int, float], saved: Mapping[str, tuple[int, int]],
                 expert_part: Callable[[list[int]], tuple[tuple[ExpertGemm, ...], ExpertWork]],
                 part_of: Mapping[int, str] | None = None,
                 launched: Collection[int] = (),
                 serial_part: Callable[[list[int]], tuple[SerialSteps, ...]] | None = None
                 ) -> tuple[ModulePart, ...]:
    """One `ModulePart` per module of `unit`'s forward (`saved`: bytes per module path;
    `expert_part`: the expert GEMMs and expert-sized work of some nodes; `part_of`: a part
    other than its module for some nodes, `expert_activation_parts`; `launched`: the nodes
    that launch a kernel, counted per part and phase; `serial_part`: the serial steps of some
    nodes, `fxlens.analyzer.plan.serial`)."""
    by_module: defaultdict[str, list[int]] = defaultdict(list)
    backward: defaultdict[str, int] = defaultdict(int)
    for node_id in members:
        node = graph.nodes[node_id]
        module = (part_of or {}).get(node_id, node.module)
        if node.phase == "forward":
            by_module[module].append(node_id)
        elif node_id in launched:
            backward[module] += 1
    parts = []
    for module in sorted(by_module.keys() | saved.keys()):
        nodes = by_module.get(module, [])
        split = sum(times.get(n, 0.0) for n in nodes if n in split_nodes)
        whole = sum(times.get(n, 0.0) for n in nodes if n not in split_nodes)
        gemms, work = expert_part(nodes)
        kept = saved.get(module, (0, 0))
        below = module[len(unit) + 1:].split(".") if module.startswith(unit + ".") else []
        types = tuple(graph.module_types.get(".".join([unit, *below[:i + 1]]), "").lower()
                      for i in range(len(below)))
        forward = sum(1 for n in nodes if n in launched)
        parts.append(ModulePart(module, kept[0], kept[1], split, whole, expert_gemms=gemms,
                                expert_work=work, types=types,
                                launches=(forward, backward.get(module, 0)),
                                serials=serial_part(nodes) if serial_part else ()))
    return tuple(parts)


def router_s(graph: Graph, members: Iterable[int], routers: frozenset[str],
             times: Mapping[int, float]) -> tuple[float, float]:
    """Forward and backward seconds of `members`' nodes inside a router module."""
    forward = backward = 0.0
    if not routers:
        return forward, backward
    inside: dict[str, bool] = {}     # per module path: it or a module above it is a router
    for node_id in members:
        node = graph.nodes[node_id]
        if node.module not in inside:
            inside[node.module] = not routers.isdisjoint(ancestors(node.module))
        if not inside[node.module]:
            continue
        if node.phase == "forward":
            forward += times.get(node_id, 0.0)
        else:
            backward += times.get(node_id, 0.0)
    return forward, backward
