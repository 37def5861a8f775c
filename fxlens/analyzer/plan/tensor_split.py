"""Megatron's tensor-parallel split of one unit of a forward graph, found from the graph's
structure, not from class or parameter names (Shoeybi et al. 2019).

Inside a unit, a GEMM against a weight whose output has the unit's width (the residual stream's
last dimension; the stream is what enters the unit and leaves it in kind, `residual_stream`,
not a mask made once for every block) is *row-parallel* when walking back from its input along
floating-point data, without crossing another weight GEMM, reaches weight GEMMs: those are
*column-parallel*, and every op between them (attention, activation functions, per-head norms)
runs on 1/t of the features. One all-reduce of the row GEMM's output per pair in the forward,
one of the column GEMMs' input gradient in the backward; a MoE layer's experts (a grouped GEMM
whose rows are the tokens' top-k routed copies) all-reduce once their rows are combined per
token, so their payload is the tokens entering the unit × its width, not the routed rows
(TensorRT-LLM, vLLM and Megatron reduce after the combine). A GEMM in ``post`` with no row
partner (the LM head) is vocab-parallel with the loss after it; embedding tables are
vocab-parallel too (one all-reduce of their output). Everything else (norms, routers, low-rank
down-projections) is replicated. A low-rank bypass of a weight GEMM (a LoRA adapter,
`low_rank_bypasses`) is not a pair of its own: it takes its base GEMM's split, so a row layer's
adapter adds an all-reduce of R features, not of the unit's width.

Between a row and its columns, a GEMM whose weight is batched by head (absorbed MLA's W_UK
and W_UV) splits with its heads and the walk goes on through it; an attention's single-head
key and value (MQA, an MLA latent) are held whole by every rank, so the walk does not follow
them to the projection that made them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef, TensorSpec
from fxlens.analyzer.plan.types import ParallelKnowledge


@dataclass(frozen=True)
class Gemm:
    """A GEMM against a weight: its weights, activation inputs and features."""

    node: int
    weights: tuple[str, ...]
    activations: tuple[TensorRef, ...]
    in_features: int
    out_features: int
    output_bytes: int
    head_batched: bool = False    # a weight batched by head (absorbed MLA's W_UK, W_UV)


@dataclass
class TensorSplit:
    """Tensor-parallel roles found in one unit's forward."""

    rows: set[int] = field(default_factory=set)
    columns: set[int] = field(default_factory=set)
    split_nodes: set[int] = field(default_factory=set)
    split_params: set[str] = field(default_factory=set)
    payloads: dict[int, int] = field(default_factory=dict)  # row node → its all-reduce's bytes
    expert_rows: set[int] = field(default_factory=set)      # rows that are routed experts'
    # per expert row, the ops between it and its columns: the experts' activation
    expert_activations: dict[int, set[int]] = field(default_factory=dict)
    gemms: dict[int, Gemm] = field(default_factory=dict)


def weight_param(graph: Graph, ref: TensorRef, knowledge: ParallelKnowledge) -> str | None:
    """The parameter `ref` is, seen through casts and views (or the buffer a dequantization
    made it from: an NF4 weight); None for an activation."""
    node = graph.nodes[ref.node]
    dequantized = False
    for _ in range(8):
        if node.kind is NodeKind.PARAM or (dequantized and node.kind is NodeKind.BUFFER):
            return node.target
        dequantized |= node.kind is NodeKind.CALL and node.packet in knowledge.dequantize_ops
        if node.kind is not NodeKind.CALL or node.packet not in (
                knowledge.weight_path_ops | knowledge.dequantize_ops):
            return None
        refs = list(node.input_refs())
        if not refs:
            return None
        node = graph.nodes[refs[0].node]
    return None


def weight_gemms(graph: Graph, scope: Iterable[int], knowledge: ParallelKnowledge
                 ) -> dict[int, Gemm]:
    """Every GEMM of `scope` against a weight (seen through casts and views), by node."""
    found = {}
    for node_id in scope:
        node = graph.nodes[node_id]
        if node.packet not in knowledge.gemm_ops | knowledge.grouped_gemm_ops:
            continue
        weights: list[str] = []
        activations: list[TensorRef] = []
        batched = False
        for ref in node.input_refs():
            name = weight_param(graph, ref, knowledge)
            if name:
                weights.append(name)
                spec = graph.spec(ref)
                batched |= (node.packet in knowledge.gemm_ops and spec is not None
                            and len(spec.shape) >= 3)
            else:
                activations.append(ref)
        out = node.outputs[0] if node.outputs else None
        first = graph.spec(activations[0]) if activations else None
        if weights and activations and out is not None and first is not None and out.shape:
            found[node_id] = Gemm(node_id, tuple(weights), tuple(activations),
                                   first.shape[-1] if first.shape else 0, out.shape[-1],
                                   out.nbytes, batched)
    return found


def split_unit(graph: Graph, scope: set[int], terminal_column: bool,
               knowledge: ParallelKnowledge,
               handed: frozenset[tuple[int, ...]] = frozenset()) -> TensorSplit:
    """Row/column pairs in `scope` (forward CALL nodes of one unit), as the module docstring
    walks them: its residual width and tokens are those of its residual stream
    (`residual_stream`; `handed`: the shapes the unit hands to others, `handed_on`)."""
    gemms = weight_gemms(graph, sorted(scope), knowledge)
    split = TensorSplit(gemms=gemms)
    stream = residual_stream(graph, scope, handed, {g.out_features for g in gemms.values()})
    width = stream.shape[-1] if stream is not None else 0
    tokens = stream.numel // width if stream is not None and width > 0 else 0
    region: set[int] = set()
    feeding = {g.node: _feeding(graph, g, gemms, scope, knowledge) for g in gemms.values()}
    dense = {n: g for n, g in gemms.items()      # adapters are dense GEMMs, never experts
             if graph.nodes[n].packet not in knowledge.grouped_gemm_ops}
    bypasses = low_rank_bypasses(dense, feeding, lambda ref: _source(graph, ref, knowledge))
    for row in (g for g in gemms.values() if g.out_features == width and g.node not in bypasses):
        columns, seen = feeding[row.node]
        if columns:
            split.rows.add(row.node)
            split.columns |= columns
            region |= seen - columns
            if graph.nodes[row.node].packet in knowledge.grouped_gemm_ops:
                split.expert_rows.add(row.node)
                if all(graph.nodes[c].packet in knowledge.grouped_gemm_ops for c in columns):
                    split.expert_activations[row.node] = seen - columns
                split.payloads[row.node] = _combined_bytes(graph, row, tokens)
            else:
                split.payloads[row.node] = row.output_bytes
    for down, base in bypasses.values():   # a row's adapter: its down GEMM reads the split input
        if base in split.rows:
            split.rows.add(down)
            split.payloads[down] = gemms[down].output_bytes
    if terminal_column and not split.rows and gemms:
        head = max(gemms.values(), key=lambda g: g.out_features * g.in_features)
        split.columns.add(head.node)
        region |= scope
    split.split_nodes = split.rows | split.columns
    for node_id in sorted(region):
        if node_id in split.split_nodes:
            continue
        producers = {ref.node for ref in graph.nodes[node_id].input_refs()}
        if producers & split.split_nodes:
            split.split_nodes.add(node_id)
    for node_id in split.columns | {n for n in region if n in gemms}:
        split.split_params.update(gemms[node_id].weights)
    for node_id in split.rows:
        split.split_params.update(w for w in gemms[node_id].weights
                                  if len(graph_param_shape(graph, w)) >= 2)
    return split


def _feeding(graph: Graph, gemm: Gemm, gemms: Mapping[int, Gemm], scope: set[int],
             knowledge: ParallelKnowledge) -> tuple[set[int], set[int]]:
    """The weight GEMMs that `gemm`'s input comes from, walking back along floating-point data
    inside `scope` (through per-head attention inputs), and the nodes the walk crossed."""
    found, seen = set(), set()
    stack = [ref.node for ref in gemm.activations if _floating(graph, ref)]
    while stack:
        node_id = stack.pop()
        if node_id in seen or node_id not in scope:
            continue
        seen.add(node_id)
        if node_id in gemms and not gemms[node_id].head_batched:
            found.add(node_id)
            continue
        stack.extend(ref.node for ref in _per_head_inputs(graph, graph.nodes[node_id], knowledge)
                     if _floating(graph, ref))
    return found, seen


def low_rank_bypasses(gemms: Mapping[int, Gemm],
                      feeding: Mapping[int, tuple[set[int], set[int]]],
                      source: Callable[[TensorRef], TensorRef] = lambda ref: ref,
                      ) -> dict[int, tuple[int, int]]:
    """LoRA's adapters, found from structure: an up GEMM (R → out) fed by one down GEMM
    (in → R) alone, where the down GEMM reads the input of a base GEMM of the same output width
    and R is below both widths (`source`: the tensor an activation views or casts, as each
    GEMM reshapes its input for itself). By up GEMM: (its down GEMM, the base GEMM). The pair
    takes its base's split: beside a column GEMM the up GEMM is a column and the down one
    replicated; beside a row GEMM the down GEMM splits by rows (its all-reduce carries R
    features) and the up one is replicated (Megatron-Bridge's ``ParallelLinearAdapter``).
    `gemms`: the candidates, dense GEMMs only (`feeding` may name others, which are skipped):
    a MoE's experts can have an adapter pair's shape (Nemotron-3 Nano's hidden → 1,856 →
    hidden) and are never one."""
    readers: dict[TensorRef, list[int]] = {}
    for gemm in gemms.values():
        for ref in gemm.activations:
            readers.setdefault(source(ref), []).append(gemm.node)
    found = {}
    for up in gemms.values():
        fed = feeding[up.node][0]
        if len(fed) != 1 or next(iter(fed)) not in gemms:
            continue
        down = gemms[next(iter(fed))]
        rank = down.out_features
        if up.in_features != rank or rank >= down.in_features or rank >= up.out_features:
            continue
        base = next((b for ref in down.activations for b in readers[source(ref)]
                     if b != down.node and gemms[b].out_features == up.out_features), None)
        if base is not None:
            found[up.node] = (down.node, base)
    return found


def _source(graph: Graph, ref: TensorRef, knowledge: ParallelKnowledge) -> TensorRef:
    """The tensor `ref` is a view or cast of (itself when it is neither)."""
    for _ in range(8):
        node = graph.nodes[ref.node]
        refs = list(node.input_refs())
        if node.kind is not NodeKind.CALL or node.packet not in knowledge.weight_path_ops \
                or not refs:
            break
        ref = refs[0]
    return ref


def _combined_bytes(graph: Graph, row: Gemm, tokens: int) -> int:
    """What a grouped GEMM's all-reduce carries (its routed rows, k per token, once combined):
    `tokens` × its width at its output's element size."""
    out = graph.nodes[row.node].outputs[0]
    if tokens <= 0 or out is None:
        return row.output_bytes
    return min(row.output_bytes, tokens * out.shape[-1] * out.nbytes // max(out.numel, 1))


def _per_head_inputs(graph: Graph, node: Node, knowledge: ParallelKnowledge
                     ) -> list[TensorRef]:
    """`node`'s inputs but, for attention, a key or value of one head shared by many query
    heads (4-D, one head where the query has more)."""
    refs = list(node.input_refs())
    if node.packet not in knowledge.attention_ops or not refs:
        return refs
    query = graph.spec(refs[0])
    heads = query.shape[1] if query is not None and len(query.shape) == 4 else 1
    return [ref for ref in refs
            if not ((spec := graph.spec(ref)) is not None and len(spec.shape) == 4
                    and spec.shape[1] == 1 < heads)]


def _floating(graph: Graph, ref: TensorRef) -> bool:
    """Data, not indices: a router reaches its experts through integer indices and routing
    weights applied after them, so walking back from an expert stops there."""
    spec = graph.spec(ref)
    return spec is not None and spec.dtype.startswith(("float", "bfloat", "complex"))


def graph_param_shape(graph: Graph, name: str) -> tuple[int, ...]:
    return next((p.spec.shape for p in graph.params if p.name == name), ())


def entering(graph: Graph, scope: set[int]) -> dict[TensorRef, TensorSpec]:
    """The activations `scope`'s nodes read from calls outside it."""
    found = {}
    for node_id in scope:
        for ref in graph.nodes[node_id].input_refs():
            spec = graph.spec(ref)
            if (ref.node not in scope and graph.nodes[ref.node].kind is NodeKind.CALL
                    and spec is not None):
                found[ref] = spec
    return found


def handed_on(graph: Graph, units: Mapping[str, set[int]]
              ) -> dict[str, frozenset[tuple[int, ...]]]:
    """Per unit (forward CALL nodes by unit name), the shapes of the floating-point tensors
    its nodes make and another unit's forward reads: its residual stream leaves as it came,
    where a mask or a rotary table that every block reads is made once, before them."""
    owner = {node_id: name for name, scope in units.items() for node_id in scope}
    shapes: dict[str, set[tuple[int, ...]]] = {name: set() for name in units}
    for node_id, reader in owner.items():
        for ref in graph.nodes[node_id].input_refs():
            maker = owner.get(ref.node)
            if maker is not None and maker != reader and _floating(graph, ref):
                spec = graph.spec(ref)
                assert spec is not None
                shapes[maker].add(tuple(spec.shape))
    return {name: frozenset(found) for name, found in shapes.items()}


def residual_stream(graph: Graph, scope: set[int], handed: frozenset[tuple[int, ...]],
                    widths: Collection[int] = ()) -> TensorSpec | None:
    """The unit's residual stream: of the floating-point activations entering it from outside,
    one of a shape it hands on, else one as wide as a GEMM's output in it, else the largest.
    (An eager attention's mask, batch × 1 × T × T, outgrows the hidden states once T passes
    their width, and does not leave the block.)"""
    floating = [spec for spec in entering(graph, scope).values()
                if spec.shape and spec.dtype.startswith(("float", "bfloat"))]
    return max(floating, default=None,
               key=lambda s: (tuple(s.shape) in handed, s.shape[-1] in widths, s.nbytes))
