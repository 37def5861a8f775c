"""Attention masks built inside the graph: what they allow, and what a kernel handed them does.

The count follows the kernel the call runs (`mask_convention`, for the ``attn_mask`` /
``attn_bias`` argument of a call):

1. ``is_causal=True`` → causal: a flash kernel skips the upper triangle.
2. No mask → dense.
3. Any explicit mask → dense: the math, memory-efficient and cuDNN kernels compute every score
   they are handed a mask for, whatever it holds.

`transformers` hands SDPA a mask in a traced run where its eager run passes ``is_causal=True``
instead; the capture makes it decide as its eager run does (`fxlens.analyzer.capture.hf_masks`),
so a graph holds an explicit mask only where the eager run has one too (Falcon, a hand-built
``tril``, a sliding window).

What an explicit mask allows (`MaskVerdict.mask`, read by the "pass is_causal" finding) is
judged by its values, where the graph can compute them: when every op that builds it starts
from factories (``arange``, ``ones``, ``full``…) and reaches no parameter, buffer or lifted
constant — the positions-only masks of causal LMs. An integer graph input of at most two dims
it reads (a padding ``attention_mask``) is taken as all ones: the unpadded batch a tokenizer
gives. Such a mask is evaluated on CPU (real tensors, only its own ops) and compared with the
top-left causal pattern (query i sees keys j ≤ i, SDPA's ``is_causal``) and, when T_q ≠ T_k,
the bottom-right one (query i sees keys j ≤ i + T_k − T_q: new tokens after a cache,
``torch.nn.attention.bias.causal_lower_right``), broadcast over batch and heads. A bool mask
allows its True entries; a float mask allows the entries above the dtype's lowest finite value
(``-inf`` and ``finfo.min`` both block), and is causal only when every allowed entry is
exactly 0 (a bias such as ALiBi is not). Anything else — sliding windows, packed sequences,
prefixes, an explicit mask read from the inputs, buffers or constants whose values fake tensors
do not hold, or a mask that cannot be evaluated — is `MaskPattern.OTHER`.

Every verdict carries a note (`MaskVerdict.note`) saying which convention was applied and why.

Large masks are never materialised: a tensor that builds the mask is held whole only up to
``MAX_MASK_ELEMENTS`` elements (64 Mi: one 8192 × 8192 square, whatever the batch, since
copies along batch and head dims are kept once). Beyond, an elementwise (broadcast) op's
result is kept as a recipe (`_Lazy`) and computed, and judged, a block of query rows at a
time (``BLOCK_ELEMENTS`` per block), so a 16 k or 128 k context costs time, not memory.
Recipes start earlier, past ``HOLD_ELEMENTS`` (16 Mi), wherever the op allows: the ops that
build an 8192² mask hold int64 and float squares of 512 MiB each, which took a training step
of llama-3-8b at 8 k from 0.6 to 1.8 GiB of peak RSS. Between the two limits an op that cannot
run by rows gets its recipes computed whole, so every verdict is the one of holding each mask
up to ``MAX_MASK_ELEMENTS`` (`tests/rules/test_masks.py`).

Known limitations: only elementwise ops and views that keep the last two dims (``expand``,
leading ``unsqueeze``) run on such a recipe; any other op on a mask beyond the limit (a
reduction, an index, a slice of the square) counts dense, and the note says so. A recipe of
more than ``MAX_LAZY_ELEMENTS`` scores (a 128 k context: 2^34) would take minutes to read
whole, so it is judged on row blocks evenly spread over it, the first and last among them,
and the note says how many rows were read: a window, packed documents or padding show in
every block past their first boundary, but a defect confined to unread rows would be missed.
A padding mask from the inputs is assumed all ones (no padding), as the capture assumes it.
Sliding-window and block-sparse masks count every score, as SDPA runs them, not the fraction a
block-sparse kernel (flex attention) would skip.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from fxlens.analyzer.core.aten import resolve_op
from fxlens.analyzer.core.costs import OpCall
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef, TensorSpec, dtype_bytes
from fxlens.rules.pointwise import POINTWISE

MAX_MASK_ELEMENTS = 2**26
HOLD_ELEMENTS = 2**24       # beyond, a result that can be computed by rows is kept a recipe
MAX_LAZY_ELEMENTS = 2**30   # 32 k × 32 k scores read whole: seconds; beyond, rows sampled
BLOCK_ELEMENTS = 2**22      # per block of query rows of a mask too large to hold
MAX_MASK_NODES = 400        # a positions-only mask takes tens of ops; more means something else
MASK_ARGUMENTS = ("attn_mask", "attn_bias", "bias")


class MaskPattern(Enum):
    """What an explicit mask allows, as far as a kernel could use it."""

    OTHER = "other"                  # a window, packed sequences, a bias, padding, unknown
    ALL = "all"                      # every score: the mask removes nothing
    CAUSAL = "causal"                # exactly SDPA's is_causal (top-left)
    CAUSAL_LOWER_RIGHT = "causal-lower-right"   # exactly causal aligned to the last key
    WINDOW = "window"                # causal to the last key, each query sees its last w keys


@dataclass(frozen=True)
class MaskVerdict:
    """How to count one attention call: `causal` or dense, and why (shown in the report);
    `mask`: what an explicit mask allows (the "pass is_causal" finding reads it)."""

    causal: bool
    note: str
    mask: MaskPattern = MaskPattern.OTHER
    window: int = 0                  # the keys each query sees, for `MaskPattern.WINDOW`


def mask_convention(call: OpCall) -> MaskVerdict:
    """The convention for an attention call: ``is_causal=True`` counts causal; no mask, or any
    explicit mask, counts every score (a kernel handed a mask computes them all). The mask's
    values, where the graph builds it, say what it allows (`MaskVerdict.mask`)."""
    ref = next((call.ref(n) for n in MASK_ARGUMENTS if call.ref(n) is not None), None)
    if bool(call.arg("is_causal", False)):
        return MaskVerdict(True, "causal: is_causal=True (a flash kernel skips the upper "
                                 "triangle)")
    if ref is None:
        return MaskVerdict(False, "dense: no mask, is_causal=False")
    return judged(call.graph, ref, call.shape("query")[-2], call.shape("key")[-2])


Key = tuple[TensorRef, int, int]
_CACHE: dict[int, tuple[weakref.ref[Graph], dict[Any, MaskVerdict]]] = {}


def judged(graph: Graph, ref: TensorRef, t_q: int, t_k: int) -> MaskVerdict:
    """`classify` once per mask of a graph: the layers of a model share one mask.

    A recorded training step hands each layer its own copy of the mask (autograd's SDPA
    expands or casts it per call), so verdicts are also kept by the mask's *recipe*
    (`_recipe`): the ops that build it with their arguments, node ids made relative. Two
    masks with one recipe hold the same values, so `classify` would give the same verdict;
    a window, a different shape or another dtype is another recipe."""
    entry = _CACHE.get(id(graph))
    if entry is None or entry[0]() is not graph:
        entry = (weakref.ref(graph, lambda _: _CACHE.pop(id(graph), None)), {})
        _CACHE[id(graph)] = entry
    verdicts = entry[1]
    if (ref, t_q, t_k) not in verdicts:
        built = _constant_subgraph(graph, ref)
        recipe = (_recipe(built, ref), t_q, t_k) if not built[2] else None
        if recipe is not None and recipe in verdicts:
            verdicts[(ref, t_q, t_k)] = verdicts[recipe]
        else:
            verdicts[(ref, t_q, t_k)] = classify(graph, ref, t_q, t_k)
            if recipe is not None:
                verdicts[recipe] = verdicts[(ref, t_q, t_k)]
    return verdicts[(ref, t_q, t_k)]


def _recipe(built: tuple[list[Node], list[Node], str], ref: TensorRef) -> tuple[Any, ...]:
    """What `classify` reads of a mask, with node ids replaced by positions in the recipe:
    each op's target, arguments and output specs, the padding inputs' names and specs."""
    nodes, padding, _ = built
    local = {n.id: i for i, n in enumerate([*padding, *nodes])}

    def relative(value: Any) -> Any:
        if isinstance(value, TensorRef):
            return ("ref", local[value.node], value.index)
        if isinstance(value, (list, tuple)):
            return (type(value).__name__, *(relative(v) for v in value))
        return (type(value).__name__, repr(value))

    ops = tuple((n.target, tuple((k, relative(v)) for k, v in n.args.items()), n.outputs)
                for n in nodes)
    return (tuple((n.target, n.outputs) for n in padding), ops, relative(ref))


def classify(graph: Graph, ref: TensorRef, t_q: int, t_k: int) -> MaskVerdict:
    """The verdict for the mask `ref` of `graph` on `t_q` queries and `t_k` keys (see the
    module docstring)."""
    nodes, padding, reason = _constant_subgraph(graph, ref)
    if reason:
        return MaskVerdict(False, f"dense: the mask {reason}")
    value = _evaluate(graph, nodes, ref, padding)
    if isinstance(value, str):
        return MaskVerdict(False, f"dense: the mask {value}")
    try:
        verdict = _judge(value, t_q, t_k)
    except RuntimeError as error:  # a mask that does not broadcast to (T_q, T_k): say so
        return MaskVerdict(False, f"dense: the mask could not be compared ({error})"[:200])
    if not padding:
        return verdict
    names = ", ".join(n.target for n in padding)
    return MaskVerdict(verdict.causal, f"{verdict.note}; the input {names} taken as all ones "
                       "(no padding, as a tokenizer gives an unpadded batch)", verdict.mask)


def constant_value(graph: Graph, ref: TensorRef) -> torch.Tensor | str:
    """The values of `ref` when the graph builds it from positions alone (a FlexAttention
    block mask's block counts), computed on CPU as a mask is; else why not."""
    nodes, padding, reason = _constant_subgraph(graph, ref)
    if reason:
        return reason
    value = _evaluate(graph, nodes, ref, padding)
    return value if isinstance(value, str) else _whole(value)


def mask_builders(graph: Graph, ref: TensorRef) -> list[Node]:
    """The ops that build the mask `ref` from positions alone (none when it is not built so):
    what a call with ``is_causal=True`` would no longer run."""
    return _constant_subgraph(graph, ref)[0]


def _constant_subgraph(graph: Graph, ref: TensorRef) -> tuple[list[Node], list[Node], str]:
    """The call nodes that build `ref`, in graph order, and the padding masks among the graph
    inputs they read (taken as all ones); or why it is not a graph constant."""
    seen: set[int] = set()
    padding: dict[int, Node] = {}
    todo = [ref.node]
    while todo:
        node = graph.nodes[todo.pop()]
        if node.id in seen or node.id in padding:
            continue
        if node.kind is NodeKind.INPUT and _is_padding_mask(node):
            padding[node.id] = node
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
    return [graph.nodes[i] for i in sorted(seen)], [padding[i] for i in sorted(padding)], ""


def _is_padding_mask(node: Node) -> bool:
    """An integer input of at most two dims: a tokenizer's (B, T) ``attention_mask``, 1 where
    a token is real. NB: a bool or float input, or one of more dims, is an explicit attention
    mask whose values cannot be guessed."""
    spec = node.outputs[0] if len(node.outputs) == 1 else None
    return spec is not None and len(spec.shape) <= 2 and spec.dtype.startswith(("int", "uint"))


# Ops whose output element depends only on the inputs' elements at the same (broadcast)
# position: evaluated on their inputs' bases (broadcast dims of size 1), then expanded.
BROADCAST_OPS = frozenset(POINTWISE) | {"aten.to", "aten._to_copy", "aten.clone",
                                        "aten.type_as", "aten.alias", "aten.where",
                                        "aten.masked_fill"}
# Views that a recipe (`_Lazy`) passes through: they change only the leading dims.
LAZY_VIEWS = frozenset({"aten.expand", "aten.unsqueeze", "aten.alias", "aten.view",
                        "aten._unsafe_view", "aten.reshape"})


@dataclass(frozen=True)
class _Lazy:
    """An elementwise op's result too large to hold: the op and its arguments (tensors or
    recipes), computed a block of query rows (dim -2) at a time, broadcast like its output."""

    op: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    shape: tuple[int, ...] = ()
    held: int = 0        # elements the value would hold computed whole (see `_evaluate`)

    def whole(self) -> torch.Tensor:
        """The value computed at once, as `_evaluate` holds a computed result."""
        rows = self.rows(0, self.shape[-2]) if _has_rows(self.shape) else self.rows(0, 1)
        return _fold_repeats(rows.expand(self.shape))

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Query rows ``start:stop`` of the value (its other dims possibly still of size 1)."""
        def part(v: Any) -> Any:
            if isinstance(v, _Lazy):
                return v.rows(start, stop) if _has_rows(v.shape) else v.rows(0, 1)
            if isinstance(v, torch.Tensor) and v.dim() >= 2 and v.shape[-2] > 1:
                return v.narrow(-2, start, stop - start)
            if isinstance(v, (list, tuple)):
                return type(v)(part(x) for x in v)
            return v

        return self.op(*map(part, self.args), **{k: part(v) for k, v in self.kwargs.items()})


def _has_rows(shape: tuple[int, ...]) -> bool:
    return len(shape) >= 2 and shape[-2] > 1


def _passes_through(value: torch.Tensor, *_: Any) -> torch.Tensor:
    return value


def _lazy(node: Node, op: Any, args: dict[str, Any], broadcast: bool, held: int
          ) -> _Lazy | None:
    """`node` as a recipe when it can be computed by rows: an elementwise op, or a view of a
    recipe that keeps its last two dims. None when it cannot."""
    shape = node.outputs[0].shape if node.outputs and node.outputs[0] is not None else ()
    if broadcast:
        positional = tuple(args[a.name] for a in op._schema.arguments
                           if not a.kwarg_only and a.name in args)
        keywords = {a.name: args[a.name] for a in op._schema.arguments
                    if a.kwarg_only and a.name in args}
        return _Lazy(op, positional, keywords, shape, held)
    source = args.get("self")
    if node.packet in LAZY_VIEWS and isinstance(source, _Lazy) and len(shape) >= 2 and (
            shape[-2:] == source.shape[-2:] or node.packet == "aten.expand"):
        return _Lazy(_passes_through, (source,), {}, shape, source.held)
    return None


def _evaluate(graph: Graph, nodes: list[Node], ref: TensorRef, padding: list[Node]
              ) -> torch.Tensor | _Lazy | str:
    """Run `nodes` on CPU, the `padding` inputs all ones; the value of `ref` (a recipe when
    too large to hold), or why it could not be computed.

    NB: values are kept small: a pointwise op runs on its inputs' bases and its result is
    expanded (a view), and a result that repeats along a leading (batch, head) dim is kept
    as one slice expanded — so a batch of B copies of one T × T mask costs one T × T.
    """
    values: dict[TensorRef, Any] = {
        TensorRef(n.id, 0): torch.ones(n.outputs[0].shape, dtype=getattr(torch, n.outputs[0].dtype))
        for n in padding if n.outputs[0] is not None}
    last_use = {r: n.id for n in nodes for r in n.input_refs()}

    for node in nodes:
        op = resolve_op(node.target)
        broadcast = node.packet in BROADCAST_OPS or node.target in BROADCAST_OPS

        args = {k: torch.device("cpu") if k == "device" and v is not None else
                _real(v, values, broadcast, op._schema.is_mutable)
                for k, v in node.args.items()}
        lazies = [v for v in _flat(args.values()) if isinstance(v, _Lazy)]
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


def _real(value: Any, values: dict[TensorRef, torch.Tensor], broadcast: bool, mutable: bool
          ) -> Any:
    """An argument's value: a broadcast op reads its inputs' bases; an op that writes into
    an input gets a copy (values are shared views)."""
    if isinstance(value, TensorRef):
        tensor = values[value]
        if isinstance(tensor, _Lazy):
            return tensor
        return _base(tensor) if broadcast else (tensor.clone() if mutable else tensor)
    if isinstance(value, (list, tuple)):
        return type(value)(_real(v, values, broadcast, mutable) for v in value)
    return value


def _whole(value: Any) -> Any:
    """`value` with its recipes computed whole."""
    if isinstance(value, _Lazy):
        return value.whole()
    if isinstance(value, (list, tuple)):
        return type(value)(_whole(v) for v in value)
    return value


def _result_elements(node: Node, op: Any, args: dict[str, Any], broadcast: bool) -> int:
    """Elements the op's result will really hold (see `_evaluate`); a view holds none."""
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
        if isinstance(v, (torch.Tensor, _Lazy)):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(_flat(v))
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


def _judge(mask: torch.Tensor | _Lazy, t_q: int, t_k: int) -> MaskVerdict:
    """Causal, all allowed or other, for a mask broadcast to (…, T_q, T_k), a block of query
    rows at a time (one block when the mask is held whole)."""
    all_allowed = exact = top_left = bottom_right = banded = True
    counts: list[tuple[int, int]] = []     # (query row, keys it sees) of a banded mask
    starts, step = _row_starts(mask, t_q, t_k)
    for start, block in _row_blocks(mask, t_q, t_k, starts, step):
        if block.dtype == torch.bool:
            allowed = block
        else:
            lowest = torch.finfo(block.dtype).min if block.is_floating_point() else None
            allowed = block > lowest if lowest is not None else block != 0
            exact = exact and (not block.is_floating_point() or bool((block[allowed] == 0).all()))
        all_allowed = all_allowed and bool(allowed.all())
        top_left = top_left and _matches(allowed, start, t_k, 0)
        bottom_right = top_left if t_q == t_k else (
            bottom_right and _matches(allowed, start, t_k, t_k - t_q))
        banded = banded and exact and _band(allowed, start, t_k, t_k - t_q, counts)
        if not (all_allowed or top_left or bottom_right or banded) and not exact:
            break
    judged = min(t_q, len(starts) * step)
    sampled = "" if judged == t_q else (
        f" (judged on {judged:,} of its {t_q:,} query rows, in {len(starts)} blocks evenly "
        "spread: a square this large is too slow to read whole)")
    if all_allowed:
        return MaskVerdict(False, f"dense: the mask allows every score{sampled}", MaskPattern.ALL)
    explicit = "a kernel handed an explicit mask computes every score"
    if exact and top_left:
        return MaskVerdict(False, f"dense: the mask is exactly causal, but {explicit}; "
                                  f"is_causal=True instead would skip the upper triangle{sampled}",
                           MaskPattern.CAUSAL)
    if exact and bottom_right:
        return MaskVerdict(False, f"dense: the mask is exactly causal aligned to the last key, "
                                  f"but {explicit}; torch.nn.attention.bias.causal_lower_right "
                                  f"instead would skip the masked scores{sampled}",
                           MaskPattern.CAUSAL_LOWER_RIGHT)
    window = _window(counts, t_k - t_q) if banded else 0
    if window:
        return MaskVerdict(False, f"dense: the mask is a sliding window of {window} keys per "
                                  f"query, but {explicit}; a windowed kernel (flash-attn's "
                                  f"window_size, FlexAttention) would skip the rest{sampled}",
                           MaskPattern.WINDOW, window)
    what = "adds a bias" if not exact else "is not causal (window, padding or custom)"
    return MaskVerdict(False, f"dense: the mask {what}; {explicit}")


def _band(allowed: torch.Tensor, start: int, t_k: int, offset: int,
          counts: list[tuple[int, int]]) -> bool:
    """Rows ``start…`` of `allowed` (…, rows, T_k), alike over the leading dims, each allow
    one run of keys ending at j = i + offset; their lengths are added to `counts`."""
    rows = allowed.reshape(-1, *allowed.shape[-2:])
    if not bool((rows == rows[:1]).all()):
        return False
    first = rows[0]
    seen = first.sum(-1)
    ends = torch.arange(start, start + first.shape[-2])[:, None] + offset
    keys = torch.arange(t_k)[None, :]
    if not torch.equal(first, (keys <= ends) & (keys > ends - seen[:, None])):
        return False
    counts.extend(zip(range(start, start + first.shape[-2]), seen.tolist(), strict=True))
    return True


def _window(counts: list[tuple[int, int]], offset: int) -> int:
    """The window w of a band whose rows see min(i + offset + 1, w) keys, narrower than the
    causal rows it cuts; 0 when the counts are no such band."""
    window = max((seen for _, seen in counts), default=0)
    reach = max((row + offset + 1 for row, _ in counts), default=0)
    if not 0 < window < reach:
        return 0
    return window if all(seen == min(row + offset + 1, window) for row, seen in counts) else 0


def _row_starts(mask: torch.Tensor | _Lazy, t_q: int, t_k: int) -> tuple[list[int], int]:
    """The first rows of the blocks to judge, and the rows per block: every block, or for a
    recipe of more than `MAX_LAZY_ELEMENTS` scores as many as that allows, evenly spread
    (the first and the last always among them)."""
    if isinstance(mask, torch.Tensor) or not _has_rows(mask.shape):
        return [0], t_q
    step = max(1, BLOCK_ELEMENTS // max(t_k, 1))
    starts = list(range(0, t_q, step))
    budget = max(2, MAX_LAZY_ELEMENTS // (step * t_k))
    if len(starts) <= budget:
        return starts, step
    picks = sorted({round(i * (len(starts) - 1) / (budget - 1)) for i in range(budget)})
    return [starts[i] for i in picks], step


def _matches(allowed: torch.Tensor, start: int, t_k: int, offset: int) -> bool:
    """Rows ``start…`` of `allowed` (…, rows, T_k) are causal: query i sees keys j ≤ i + offset."""
    rows = torch.arange(start, start + allowed.shape[-2])[:, None] + offset
    causal = torch.arange(t_k)[None, :] <= rows
    return torch.equal(allowed, causal.expand(allowed.shape))


def _row_blocks(mask: torch.Tensor | _Lazy, t_q: int, t_k: int, starts: list[int], step: int
                ) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, rows of the mask as (…, rows, T_k) without broadcast copies) per start."""
    if isinstance(mask, torch.Tensor) or not _has_rows(mask.shape):
        whole = mask if isinstance(mask, torch.Tensor) else mask.rows(0, 1)
        whole = _base(whole)
        if whole.dim() < 2:
            whole = whole.reshape(1, 1) if whole.dim() == 0 else whole.unsqueeze(0)
        yield 0, _base(whole.expand(*whole.shape[:-2], t_q, t_k))
        return
    if mask.shape[-2] != t_q:
        raise RuntimeError(f"a mask of {mask.shape[-2]} rows for {t_q} queries")
    for start in starts:
        stop = min(start + step, t_q)
        block = _base(mask.rows(start, stop))
        yield start, _base(block.expand(*block.shape[:-2], stop - start, t_k))
