"""The values of tensors a graph builds from positions alone, computed on CPU: attention masks
(`fxlens.rules.masks`) and FlexAttention block counts (`fxlens.rules.flex_attention`).

A tensor is such a graph constant when every op that builds it starts from factories
(``arange``, ``ones``, ``full``…) or from graph inputs whose values the capture kept
(`Node.value`: small integer tensors it saw real, such as a BlockMask made before the forward),
and reaches no other parameter, buffer or input. An integer graph input of at most two dims it
reads (a padding ``attention_mask``) is taken as all ones: the unpadded batch a tokenizer
gives. The ops run on real CPU tensors, only its own.

Large values are never materialised: a tensor that builds a mask is held whole only up to
``MAX_MASK_ELEMENTS`` elements (64 Mi: one 8192 × 8192 square, whatever the batch, since
copies along batch and head dims are kept once). Beyond, an elementwise (broadcast) op's
result is kept as a recipe (`Recipe`) and computed a block of query rows at a time by whoever
reads it. Recipes start earlier, past ``HOLD_ELEMENTS`` (16 Mi), wherever the op allows: the
ops that build an 8192² mask hold int64 and float squares of 512 MiB each. Between the two
limits an op that cannot run by rows gets its recipes computed whole. Only elementwise ops and
views that keep the last two dims (``expand``, leading ``unsqueeze``) run on a recipe; any
other op on a value beyond the limit makes it not computable, and the reason says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from fxlens.analyzer.core.aten import resolve_op
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef, TensorSpec, dtype_bytes
from fxlens.rules.pointwise import POINTWISE

MAX_MASK_ELEMENTS = 2**26
HOLD_ELEMENTS = 2**24       # beyond, a result that can be computed by rows is kept a recipe
MAX_MASK_NODES = 400        # a positions-only mask takes tens of ops; more means something else


def constant_value(graph: Graph, ref: TensorRef) -> torch.Tensor | str:
    """The values of `ref` when the graph builds it from positions alone (a FlexAttention
    block mask's block counts), computed on CPU as a mask is; else why not."""
    nodes, leaves, reason = constant_subgraph(graph, ref)
    if reason:
        return reason
    value = evaluate(graph, nodes, ref, leaves)
    return value if isinstance(value, str) else _whole(value)


def mask_builders(graph: Graph, ref: TensorRef) -> list[Node]:
    """The ops that build the mask `ref` from positions alone (none when it is not built so):
    what a call with ``is_causal=True`` would no longer run."""
    return constant_subgraph(graph, ref)[0]


def constant_subgraph(graph: Graph, ref: TensorRef) -> tuple[list[Node], list[Node], str]:
    """The call nodes that build `ref`, in graph order, and the graph inputs they read whose
    values are known (`Node.value`) or assumed (padding masks, all ones: `is_padding`); or
    why it is not a graph constant."""
    seen: set[int] = set()
    leaves: dict[int, Node] = {}
    todo = [ref.node]
    while todo:
        node = graph.nodes[todo.pop()]
        if node.id in seen or node.id in leaves:
            continue
        if node.kind is not NodeKind.CALL and (node.value is not None or is_padding(node)):
            leaves[node.id] = node
            continue
        if node.kind is not NodeKind.CALL:
            what = {NodeKind.INPUT: "an input", NodeKind.PARAM: "a parameter",
                    NodeKind.BUFFER: "a buffer"}[node.kind]
            return [], [], f"depends on {what} ({node.target}), whose values fake tensors lack"
        if not node.target.startswith("aten."):
            return [], [], f"is built by {node.target}, which is not evaluated"
        seen.add(node.id)
        if len(seen) > MAX_MASK_NODES:
            return [], [], f"is built by more than {MAX_MASK_NODES} ops"
        todo.extend(r.node for r in node.input_refs())
    return [graph.nodes[i] for i in sorted(seen)], [leaves[i] for i in sorted(leaves)], ""


def is_padding(node: Node) -> bool:
    """Taken as all ones: an integer input of at most two dims whose values were not kept, a
    tokenizer's (B, T) ``attention_mask``, 1 where a token is real. NB: a bool or float
    input, or one of more dims, is an explicit attention mask whose values cannot be
    guessed."""
    spec = node.outputs[0] if len(node.outputs) == 1 else None
    return (node.kind is NodeKind.INPUT and node.value is None and spec is not None
            and len(spec.shape) <= 2 and spec.dtype.startswith(("int", "uint")))


# Ops whose output element depends only on the inputs' elements at the same (broadcast)
# position: evaluated on their inputs' bases (broadcast dims of size 1), then expanded.
BROADCAST_OPS = frozenset(POINTWISE) | {"aten.to", "aten._to_copy", "aten.clone",
                                        "aten.type_as", "aten.alias", "aten.where",
                                        "aten.masked_fill"}
# Views that a recipe (`Recipe`) passes through: they change only the leading dims.
LAZY_VIEWS = frozenset({"aten.expand", "aten.unsqueeze", "aten.alias", "aten.view",
                        "aten._unsafe_view", "aten.reshape"})


@dataclass(frozen=True)
class Recipe:
    """An elementwise op's result too large to hold: the op and its arguments (tensors or
    recipes), computed a block of query rows (dim -2) at a time, broadcast like its output."""

    op: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    shape: tuple[int, ...] = ()
    held: int = 0        # elements the value would hold computed whole (see `evaluate`)

    def whole(self) -> torch.Tensor:
        """The value computed at once, as `evaluate` holds a computed result."""
        rows = self.rows(0, self.shape[-2]) if has_rows(self.shape) else self.rows(0, 1)
        return _fold_repeats(rows.expand(self.shape))

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Query rows ``start:stop`` of the value (its other dims possibly still of size 1)."""
        def part(v: Any) -> Any:
            if isinstance(v, Recipe):
                return v.rows(start, stop) if has_rows(v.shape) else v.rows(0, 1)
            if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[-2] > 1:
                return v.narrow(-2, start, stop - start)
            if isinstance(v, (list, tuple)):
                return type(v)(part(x) for x in v)
            return v

        return self.op(*map(part, self.args), **{k: part(v) for k, v in self.kwargs.items()})


def has_rows(shape: tuple[int, ...]) -> bool:
    return len(shape) >= 2 and shape[-2] > 1


def _passes_through(value: torch.Tensor, *_: Any) -> torch.Tensor:
    return value


def _lazy(node: Node, op: Any, args: dict[str, Any], broadcast: bool, held: int
          ) -> Recipe | None:
    """`node` as a recipe when it can be computed by rows: an elementwise op, or a view of a
    recipe that keeps its last two dims. None when it cannot."""
    shape = node.outputs[0].shape if node.outputs and node.outputs[0] is not None else ()
    if broadcast:
        positional = tuple(args[a.name] for a in op._schema.arguments
                           if not a.kwarg_only and a.name in args)
        keywords = {a.name: args[a.name] for a in op._schema.arguments
                    if a.kwarg_only and a.name in args}
        return Recipe(op, positional, keywords, shape, held)
    source = args.get("self")
    if node.packet in LAZY_VIEWS and isinstance(source, Recipe) and len(shape) >= 2 and (
            shape[-2:] == source.shape[-2:] or node.packet == "aten.expand"):
        return Recipe(_passes_through, (source,), {}, shape, source.held)
    return None


def evaluate(graph: Graph, nodes: list[Node], ref: TensorRef, leaves: list[Node]
              ) -> torch.Tensor | Recipe | str:
    """Run `nodes` on CPU from the `leaves`' known values (padding inputs all ones); the
    value of `ref` (a recipe when too large to hold), or why it could not be computed.

    NB: values are kept small: a pointwise op runs on its inputs' bases and its result is
    expanded (a view), and a result that repeats along a leading (batch, head) dim is kept
    as one slice expanded — so a batch of B copies of one T × T mask costs one T × T.
    """
    values: dict[TensorRef, Any] = {TensorRef(n.id, 0): _leaf_value(n) for n in leaves}
    last_use = {r: n.id for n in nodes for r in n.input_refs()}

    for node in nodes:
        op = resolve_op(node.target)
        broadcast = node.packet in BROADCAST_OPS or node.target in BROADCAST_OPS

        args = {k: torch.device("cpu") if k == "device" and v is not None else
                _real(v, values, broadcast, op._schema.is_mutable)
                for k, v in node.args.items()}
        lazies = [v for v in _flat(args.values()) if isinstance(v, Recipe)]
        size = _result_elements(node, op, args, broadcast)
        if size > min(HOLD_ELEMENTS, MAX_MASK_ELEMENTS) or lazies:
            recipe = _lazy(node, op, args, broadcast, size)
            if recipe is not None:
                values[TensorRef(node.id, 0)] = recipe
                continue
            if size > MAX_MASK_ELEMENTS or any(r.held > MAX_MASK_ELEMENTS for r in lazies):
                return (f"needs a tensor of {size:,} elements to evaluate (limit "
                        f"{MAX_MASK_ELEMENTS:,}) and {node.target} cannot be computed by rows")
            args = {k: _whole(v) for k, v in args.items()}   # within the limit: as held
        positional = [args[a.name] for a in op._schema.arguments
                      if not a.kwarg_only and a.name in args]
        keywords = {a.name: args[a.name] for a in op._schema.arguments
                    if a.kwarg_only and a.name in args}
        try:
            out = op(*positional, **keywords)
        except Exception as error:  # an op that needs what we do not have: count dense
            return f"could not be evaluated ({node.target}: {type(error).__name__})"
        flat = out if isinstance(out, (tuple, list)) else (out,)
        for index, tensor in enumerate(flat):
            spec = node.outputs[index] if index < len(node.outputs) else None
            if isinstance(tensor, torch.Tensor) and spec is not None:
                tensor = tensor.expand(spec.shape) if broadcast else tensor
                values[TensorRef(node.id, index)] = _fold_repeats(tensor)
        for used in [r for r in node.input_refs() if last_use.get(r) == node.id and r != ref]:
            values.pop(used, None)
    return values[ref]


def _leaf_value(node: Node) -> torch.Tensor:
    if node.value is not None:
        return node.value
    spec = node.outputs[0]
    assert spec is not None    # `is_padding`
    return torch.ones(spec.shape, dtype=getattr(torch, spec.dtype))


def _real(value: Any, values: dict[TensorRef, torch.Tensor], broadcast: bool, mutable: bool
          ) -> Any:
    """An argument's value: a broadcast op reads its inputs' bases; an op that writes into
    an input gets a copy (values are shared views)."""
    if isinstance(value, TensorRef):
        tensor = values[value]
        if isinstance(tensor, Recipe):
            return tensor
        return base_of(tensor) if broadcast else (tensor.clone() if mutable else tensor)
    if isinstance(value, (list, tuple)):
        return type(value)(_real(v, values, broadcast, mutable) for v in value)
    return value


def _whole(value: Any) -> Any:
    """`value` with its recipes computed whole."""
    if isinstance(value, Recipe):
        return value.whole()
    if isinstance(value, (list, tuple)):
        return type(value)(_whole(v) for v in value)
    return value


def _result_elements(node: Node, op: Any, args: dict[str, Any], broadcast: bool) -> int:
    """Elements the op's result will really hold (see `evaluate`); a view holds none."""
    if broadcast:
        shapes = [t.shape for t in _flat(args.values())]
        return math.prod(torch.broadcast_shapes(*shapes)) if shapes else 1
    if any(r.alias_info is not None for r in op._schema.returns):
        return 0
    return max((_elements(o) for o in node.outputs if o is not None), default=0)


def _flat(values: Any) -> list[Any]:
    """The tensors and recipes among `values`, lists unpacked."""
    found: list[Any] = []
    for v in values:
        if isinstance(v, (torch.Tensor, Recipe)):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(_flat(v))
    return found


def _elements(spec: TensorSpec) -> int:
    """Elements a tensor really holds: an expanded view (stride 0) holds only its base."""
    return min(spec.numel, spec.allocation_bytes // max(int(dtype_bytes(spec.dtype)), 1))


def base_of(t: torch.Tensor) -> torch.Tensor:
    """`t` without its broadcast copies: every stride-0 dim narrowed to size 1."""
    for dim in range(t.dim()):
        if t.shape[dim] > 1 and t.stride(dim) == 0:
            t = t.narrow(dim, 0, 1)
    return t


def _fold_repeats(t: torch.Tensor) -> torch.Tensor:
    """`t` with each leading dim along which it repeats stored once (an expanded slice)."""
    for dim in range(t.dim() - 2):
        if t.shape[dim] > 1 and t.stride(dim) != 0:
            first = t.narrow(dim, 0, 1)
            if bool((t == first).all()):
                t = first.expand(t.shape)
    return t
