"""Attention masks built inside the graph: which scores does the eager run's kernel compute?

Why: tracing changes what a model hands to SDPA. `transformers` (and code like it) drops the
mask and calls SDPA with ``is_causal=True`` when it runs eagerly without padding, so a fused
kernel computes only the lower triangle; when it detects tracing (fake tensors, export) it
materialises the same causal mask and passes it as ``attn_mask``. Counting what the graph says
would count the dense square, and the figure would depend on the capture path. So a mask is
judged by the values it holds, which the eager run would have seen.

The rule (`mask_convention`), for the ``attn_mask`` / ``attn_bias`` argument of a call:

1. No mask: the call's own ``is_causal`` decides.
2. The mask is a constant of the graph when every op that builds it starts from factories
   (``arange``, ``ones``, ``full``…) and reaches no graph input, parameter, buffer or lifted
   constant — the positions-only masks of causal LMs. Such a mask is evaluated on CPU
   (real tensors, only its own ops) and compared with the top-left causal pattern (query i
   sees keys j ≤ i, SDPA's ``is_causal``) and, when T_q ≠ T_k, the bottom-right one (query i
   sees keys j ≤ i + T_k − T_q: new tokens after a cache), broadcast over batch and heads.
   A bool mask allows its True entries; a float mask allows the entries above the dtype's
   lowest finite value (``-inf`` and ``finfo.min`` both block), and is causal only when every
   allowed entry is exactly 0 (a bias such as ALiBi is not).
3. Exactly causal → counted causal, as a fused kernel called with ``is_causal=True`` computes
   it. All allowed → counted dense (the mask removes nothing). Anything else — sliding windows,
   packed sequences, prefixes, a mask read from the inputs, buffers or constants whose values
   fake tensors do not hold, or a mask too large to evaluate — is counted dense: a kernel
   handed an explicit mask computes every score (the convention of `fxlens.rules.attention`).

Every verdict carries a note (`MaskVerdict.note`) saying which convention was applied and why.

Known limitations: a mask is evaluated only while every tensor that builds it holds at most
``MAX_MASK_ELEMENTS`` elements (64 Mi: one 8192 × 8192 square, whatever the batch, since
copies along batch and head dims are kept once; a few hundred MiB while it runs); beyond, it
is counted dense and the note says so. Input-dependent masks (an ``attention_mask`` of ones
passed by the user) are counted dense although an eager ``transformers`` run would drop an
all-ones padding mask: fake tensors do not hold its values. Sliding-window and block-sparse
masks count every score, not the fraction a block-sparse kernel (flex attention) would skip.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from fxlens.analyzer.core.aten import resolve_op
from fxlens.analyzer.core.costs import OpCall
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef, TensorSpec, dtype_bytes
from fxlens.rules.pointwise import POINTWISE

MAX_MASK_ELEMENTS = 2**26
MAX_MASK_NODES = 400        # a positions-only mask takes tens of ops; more means something else
MASK_ARGUMENTS = ("attn_mask", "attn_bias", "bias")


@dataclass(frozen=True)
class MaskVerdict:
    """How to count one attention call: `causal` or dense, and why (shown in the report)."""

    causal: bool
    note: str
    bottom_right: bool = False    # causal aligned to the last key (query i sees j ≤ i + T_k − T_q)


def mask_convention(call: OpCall) -> MaskVerdict:
    """The convention for an attention call: from ``is_causal`` or from its mask's values."""
    ref = next((call.ref(n) for n in MASK_ARGUMENTS if call.ref(n) is not None), None)
    if bool(call.arg("is_causal", False)):
        return MaskVerdict(True, "causal: is_causal=True")
    if ref is None:
        return MaskVerdict(False, "dense: no mask, is_causal=False")
    return _cached(call.graph, ref, call.shape("query")[-2], call.shape("key")[-2])


Key = tuple[TensorRef, int, int]
_CACHE: dict[int, tuple[weakref.ref[Graph], dict[Key, MaskVerdict]]] = {}


def _cached(graph: Graph, ref: TensorRef, t_q: int, t_k: int) -> MaskVerdict:
    """`classify` once per mask of a graph: the layers of a model share one mask."""
    entry = _CACHE.get(id(graph))
    if entry is None or entry[0]() is not graph:
        entry = (weakref.ref(graph, lambda _: _CACHE.pop(id(graph), None)), {})
        _CACHE[id(graph)] = entry
    verdicts = entry[1]
    if (ref, t_q, t_k) not in verdicts:
        verdicts[(ref, t_q, t_k)] = classify(graph, ref, t_q, t_k)
    return verdicts[(ref, t_q, t_k)]


def classify(graph: Graph, ref: TensorRef, t_q: int, t_k: int) -> MaskVerdict:
    """The verdict for the mask `ref` of `graph` on `t_q` queries and `t_k` keys (see the
    module docstring)."""
    nodes, reason = _constant_subgraph(graph, ref)
    if reason:
        return MaskVerdict(False, f"dense: the mask {reason}")
    value = _evaluate(graph, nodes, ref)
    if isinstance(value, str):
        return MaskVerdict(False, f"dense: the mask {value}")
    try:
        return _judge(value, t_q, t_k)
    except RuntimeError as error:  # a mask that does not broadcast to (T_q, T_k): say so
        return MaskVerdict(False, f"dense: the mask could not be compared ({error})"[:200])


def _constant_subgraph(graph: Graph, ref: TensorRef) -> tuple[list[Node], str]:
    """The call nodes that build `ref`, in graph order, or why it is not a graph constant."""
    seen: set[int] = set()
    todo = [ref.node]
    while todo:
        node = graph.nodes[todo.pop()]
        if node.id in seen:
            continue
        if node.kind is not NodeKind.CALL:
            what = {NodeKind.INPUT: "an input", NodeKind.PARAM: "a parameter",
                    NodeKind.BUFFER: "a buffer"}[node.kind]
            return [], f"depends on {what} ({node.target}), whose values fake tensors lack"
        if not node.target.startswith("aten."):
            return [], f"is built by {node.target}, which is not evaluated"
        seen.add(node.id)
        if len(seen) > MAX_MASK_NODES:
            return [], f"is built by more than {MAX_MASK_NODES} ops"
        todo.extend(r.node for r in node.input_refs())
    return [graph.nodes[i] for i in sorted(seen)], ""


# Ops whose output element depends only on the inputs' elements at the same (broadcast)
# position: evaluated on their inputs' bases (broadcast dims of size 1), then expanded.
BROADCAST_OPS = frozenset(POINTWISE) | {"aten.to", "aten._to_copy", "aten.clone",
                                        "aten.type_as", "aten.alias"}


def _evaluate(graph: Graph, nodes: list[Node], ref: TensorRef) -> torch.Tensor | str:
    """Run `nodes` on CPU; the value of `ref`, or why it could not be computed.

    NB: values are kept small: a pointwise op runs on its inputs' bases and its result is
    expanded (a view), and a result that repeats along a leading (batch, head) dim is kept
    as one slice expanded — so a batch of B copies of one T × T mask costs one T × T.
    """
    values: dict[TensorRef, torch.Tensor] = {}
    last_use = {r: n.id for n in nodes for r in n.input_refs()}

    for node in nodes:
        op = resolve_op(node.target)
        broadcast = node.packet in BROADCAST_OPS or node.target in BROADCAST_OPS

        args = {k: torch.device("cpu") if k == "device" and v is not None else
                _real(v, values, broadcast, op._schema.is_mutable)
                for k, v in node.args.items()}
        size = _result_elements(node, op, args, broadcast)
        if size > MAX_MASK_ELEMENTS:
            return f"needs a tensor of {size:,} elements to evaluate (limit {MAX_MASK_ELEMENTS:,})"
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


def _real(value: Any, values: dict[TensorRef, torch.Tensor], broadcast: bool, mutable: bool
          ) -> Any:
    """An argument's value: a broadcast op reads its inputs' bases; an op that writes into
    an input gets a copy (values are shared views)."""
    if isinstance(value, TensorRef):
        tensor = values[value]
        return _base(tensor) if broadcast else (tensor.clone() if mutable else tensor)
    if isinstance(value, (list, tuple)):
        return type(value)(_real(v, values, broadcast, mutable) for v in value)
    return value


def _result_elements(node: Node, op: Any, args: dict[str, Any], broadcast: bool) -> int:
    """Elements the op's result will really hold (see `_evaluate`); a view holds none."""
    if broadcast:
        shapes = [t.shape for t in _tensors(args.values())]
        return math.prod(torch.broadcast_shapes(*shapes)) if shapes else 1
    if any(r.alias_info is not None for r in op._schema.returns):
        return 0
    return max((_elements(o) for o in node.outputs if o is not None), default=0)


def _tensors(values: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(_tensors(v))
    return found


def _elements(spec: TensorSpec) -> int:
    """Elements a tensor really holds: an expanded view (stride 0) holds only its base."""
    return min(spec.numel, spec.allocation_bytes // max(int(dtype_bytes(spec.dtype)), 1))


def _base(t: torch.Tensor) -> torch.Tensor:
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


def _judge(mask: torch.Tensor, t_q: int, t_k: int) -> MaskVerdict:
    """Causal, all allowed or other, for a mask broadcast to (…, T_q, T_k)."""
    mask = _base(mask)
    if mask.dim() < 2:
        mask = mask.reshape(1, 1) if mask.dim() == 0 else mask.unsqueeze(0)
    mask = _base(mask.expand(*mask.shape[:-2], t_q, t_k))
    if mask.dtype == torch.bool:
        allowed, exact = mask, True
    else:
        lowest = torch.finfo(mask.dtype).min if mask.is_floating_point() else None
        allowed = mask > lowest if lowest is not None else mask != 0
        exact = bool((mask[allowed] == 0).all()) if mask.is_floating_point() else True
    if bool(allowed.all()):
        return MaskVerdict(False, "dense: the mask allows every score")
    top_left = torch.ones(t_q, t_k, dtype=torch.bool).tril()
    if exact and bool((allowed == top_left).all()):
        return MaskVerdict(True, "causal: the mask built in the graph is exactly causal "
                                 "(the eager run calls a fused kernel with is_causal=True)")
    bottom_right = torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=t_k - t_q)
    if exact and bool((allowed == bottom_right).all()):
        return MaskVerdict(True, "causal: the mask built in the graph is exactly causal, "
                                 "aligned to the last key (as a kernel with a KV cache)", True)
    what = "adds a bias" if not exact else "is not causal (window, padding or custom)"
    return MaskVerdict(False, f"dense: the mask {what}; a kernel given it computes every score")
