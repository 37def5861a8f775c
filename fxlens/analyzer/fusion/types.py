"""The fusion room's rule-facing API: what `fxlens.rules.fusion` (and rule packs) may use.

- `OpKind`: how a fusing compiler treats an op; the rules classify every call node.
- `FusionGraph`: the captured graph as kernels see it, with the helpers matchers walk it with.
- `Match`: what a matcher found; `FusionMatcher`: ``(FusionGraph, Node) -> Match | None``.
- ``@fusion_rule(code, priority)``: declare a matcher as a coded rule (`FusionRule`). Its
  docstring is the only text users see: the title, why it matters and the ``Fix:`` lines
  (format: `fxlens.analyzer.core.coded`); a `Match` adds only what is particular to it.

Rules apply by ascending ``priority`` (the most specific first, since an intermediate is
credited to the first finding that claims it; see `fxlens.analyzer.fusion.kernels`), then in
registration order. The engine (`kernels`) imports from here, never the other way round.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from fxlens.analyzer.core.coded import CodedRule
from fxlens.analyzer.core.costs import declare_coded
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef


class OpKind(str, Enum):
    """How a fusing compiler treats an op (the rules decide which op is which)."""

    FREE = "free"            # views, metadata: no kernel
    POINTWISE = "pointwise"  # elementwise, gathers, copies: fuse with anything fusable
    REDUCTION = "reduction"  # reductions, norms, pooling: fuse with pointwise producers/consumers
    GEMM = "gemm"            # matmuls and convolutions: a library call; may take an epilogue
    EXTERN = "extern"        # other library calls (attention, RNNs, unknown ops): alone


FUSABLE = frozenset({OpKind.POINTWISE, OpKind.REDUCTION})


@dataclass(frozen=True)
class Match:
    """What a rule's matcher found: nodes involved, intermediates a fused kernel would not
    materialise, tensors it would read fewer times ((tensor, reads avoided)), what this match
    is in its own terms (ops, shapes), and which ``Fix:`` line of the rule's docstring applies
    ("" for the plain one, "conv" for ``Fix (conv):``). The generic text is the docstring's.
    A fix that skips work as well says how many FLOPs (`flops_saved`)."""

    nodes: tuple[int, ...]
    intermediates: tuple[TensorRef, ...]
    message: str
    rereads: tuple[tuple[TensorRef, int], ...] = ()
    fix_variant: str = ""
    flops_saved: int = 0      # work the fix skips, at `nodes[0]` (FUS009's is_causal=True)


class FusionGraph:
    """The graph as kernels see it: free nodes are see-through. Every tensor is traced to the
    non-free node that produced its storage (`source`), and `consumers` lists who reads it.
    Read-only for matchers; `fxlens.analyzer.fusion.kernels` builds one per analysed graph."""

    def __init__(self, graph: Graph, kinds: Mapping[int, OpKind], rules_of: Callable[[Node], Any]
                 = lambda _: None) -> None:
        self.graph = graph
        self.kinds = kinds
        self._rules_of = rules_of
        self._rule: dict[int, Any] = {}
        self._source: dict[TensorRef, TensorRef] = {}
        self.reads: dict[int, list[tuple[TensorRef, int]]] = {}   # node → (source, bytes read)
        self.consumers: dict[TensorRef, list[int]] = defaultdict(list)
        for node in graph.nodes:
            if node.kind is NodeKind.CALL and self.kind(node.id) is not OpKind.FREE:
                self._add_reads(node)
        self.outputs = frozenset(self.source(r) for r in graph.outputs) | frozenset(
            self.source(r) for r in graph.roles)

    def kind(self, node_id: int) -> OpKind:
        return self.kinds.get(node_id, OpKind.FREE)

    def rule_of(self, node: Node) -> Any:
        """The cost rule of `node` (what `rules_of` says), looked up once per node: every
        matcher asks."""
        try:
            return self._rule[node.id]
        except KeyError:
            found = self._rule[node.id] = self._rules_of(node)
            return found

    def node(self, node_id: int) -> Node:
        return self.graph.nodes[node_id]

    def source(self, ref: TensorRef) -> TensorRef:
        """The tensor whose storage `ref` reads: through free nodes to their first input."""
        seen = ref
        while True:
            node = self.graph.nodes[seen.node]
            if node.kind is not NodeKind.CALL or self.kind(node.id) is not OpKind.FREE:
                break
            first = next(node.input_refs(), None)
            if first is None:
                break
            seen = first
        self._source[ref] = seen
        return seen

    def _add_reads(self, node: Node) -> None:
        reads: dict[TensorRef, int] = {}
        for ref in node.input_refs():
            spec = self.graph.spec(ref)
            src = self.source(ref)
            if spec is not None and src not in reads:
                reads[src] = spec.storage_bytes
        self.reads[node.id] = list(reads.items())
        for src in reads:
            self.consumers[src].append(node.id)

    # --- helpers for matchers ------------------------------------------------------------

    def producer(self, node: Node, arg: str | None = None) -> Node | None:
        """The non-free node producing `node`'s argument `arg` (default: first tensor input)."""
        ref = node.args.get(arg) if arg else next(node.input_refs(), None)
        if isinstance(ref, (list, tuple)):
            ref = next((r for r in ref if isinstance(r, TensorRef)), None)
        if not isinstance(ref, TensorRef):
            return None
        src = self.graph.nodes[self.source(ref).node]
        return src if src.kind is NodeKind.CALL else None

    def sources(self, node: Node) -> list[TensorRef]:
        return [src for src, _ in self.reads.get(node.id, [])]

    def out(self, node: Node, index: int = 0) -> TensorRef:
        return TensorRef(node.id, index)

    def sole_consumer(self, node: Node, index: int = 0) -> Node | None:
        """The only reader of `node`'s output, when it has exactly one and is no graph output."""
        ref = TensorRef(node.id, index)
        users = self.consumers.get(ref, [])
        if len(users) != 1 or ref in self.outputs:
            return None
        return self.graph.nodes[users[0]]

    def is_param(self, ref: TensorRef) -> bool:
        return self.graph.nodes[self.source(ref).node].kind in (NodeKind.PARAM, NodeKind.BUFFER)

    def nbytes(self, ref: TensorRef) -> int:
        spec = self.graph.spec(ref)
        return spec.nbytes if spec is not None else 0

    def traffic(self, ref: TensorRef) -> int:
        """Bytes written + bytes read by every consumer of one intermediate tensor."""
        reads = sum(b for user in self.consumers.get(ref, [])
                    for src, b in self.reads[user] if src == ref)
        return self.nbytes(ref) + reads


FusionMatcher = Callable[[FusionGraph, Node], Match | None]
FusionRule = CodedRule[FusionMatcher]
FAMILY = "fusion"


def fusion_rule(code: str, priority: int) -> Callable[[FusionMatcher], FusionMatcher]:
    """Declare the decorated matcher as the fusion rule `code`; rules apply by ascending
    `priority` (see the module docstring). A duplicate code is refused naming both sites."""
    return declare_coded(FAMILY, code, priority)
