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
from factories (``arange``, ``ones``, ``full``…) or from inputs whose values the capture kept
(small integer or bool buffers and constants it saw real: a causal-mask buffer) and reaches no
other parameter, buffer or input — the positions-only masks of causal LMs. An integer graph
input of at most two dims
it reads (a padding ``attention_mask``) is taken as all ones: the unpadded batch a tokenizer
gives. Such a mask is evaluated on CPU (real tensors, only its own ops) and compared with the
top-left causal pattern (query i sees keys j ≤ i, SDPA's ``is_causal``) and, when T_q ≠ T_k,
the bottom-right one (query i sees keys j ≤ i + T_k − T_q: new tokens after a cache,
``torch.nn.attention.bias.causal_lower_right``), broadcast over batch and heads. A bool mask
allows its True entries; a float mask allows the entries above the dtype's lowest finite value
(``-inf`` and ``finfo.min`` both block), and is causal only when every allowed entry is
exactly 0 (a bias such as ALiBi is not). Anything else — sliding windows, packed sequences,
prefixes, an explicit mask read from the inputs, or from buffers or constants whose values
were not kept (float, fake, meta or large ones), or a mask that cannot be evaluated — is
`MaskPattern.OTHER`.

Every verdict carries a note (`MaskVerdict.note`) saying which convention was applied and why.

The mask's values are computed by `fxlens.rules.mask_values` (positions-only subgraphs on
CPU, large ones kept as row-by-row recipes, never held past ``MAX_MASK_ELEMENTS``); a recipe
is judged a block of query rows at a time (``BLOCK_ELEMENTS`` per block), so a 16 k or 128 k
context costs time, not memory, and every verdict is the one of holding the mask whole
(`tests/rules/test_masks.py`).

Known limitations: a mask `mask_values` cannot compute (an op beyond its limits that cannot
run by rows) is `MaskPattern.OTHER`, and the note says so. A recipe of
more than ``MAX_LAZY_ELEMENTS`` scores (a 128 k context: 2^34) would take minutes to read
whole, so it is judged on row blocks evenly spread over it, the first and last among them,
and the note says how many rows were read: a window, packed documents or padding show in
every block past their first boundary, but a defect confined to unread rows would be missed.
A padding mask from the inputs is assumed all ones (no padding), as the capture assumes it.
Sliding-window and block-sparse masks count every score, as SDPA runs them, not the fraction a
block-sparse kernel (flex attention) would skip.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from fxlens.analyzer.core.costs import OpCall
from fxlens.analyzer.core.graph import Graph, Node, TensorRef
from fxlens.rules.mask_values import (
    Recipe,
    base_of,
    constant_subgraph,
    evaluate,
    has_rows,
    is_padding,
)

MAX_LAZY_ELEMENTS = 2**30   # 32 k × 32 k scores read whole: seconds; beyond, rows sampled
BLOCK_ELEMENTS = 2**22      # per block of query rows of a mask too large to hold
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
        built = constant_subgraph(graph, ref)
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
    each op's target, arguments and output specs, the padding inputs' names and specs (an
    input of known values by its node: its values are not compared)."""
    nodes, leaves, _ = built
    local = {n.id: i for i, n in enumerate([*leaves, *nodes])}

    def relative(value: Any) -> Any:
        if isinstance(value, TensorRef):
            return ("ref", local[value.node], value.index)
        if isinstance(value, (list, tuple)):
            return (type(value).__name__, *(relative(v) for v in value))
        return (type(value).__name__, repr(value))

    ops = tuple((n.target, tuple((k, relative(v)) for k, v in n.args.items()), n.outputs)
                for n in nodes)
    inputs = tuple((n.target, n.outputs, n.id if n.value is not None else None)
                   for n in leaves)
    return (inputs, ops, relative(ref))


def classify(graph: Graph, ref: TensorRef, t_q: int, t_k: int) -> MaskVerdict:
    """The verdict for the mask `ref` of `graph` on `t_q` queries and `t_k` keys (see the
    module docstring)."""
    nodes, leaves, reason = constant_subgraph(graph, ref)
    if reason:
        return MaskVerdict(False, f"dense: the mask {reason}")
    value = evaluate(graph, nodes, ref, leaves)
    if isinstance(value, str):
        return MaskVerdict(False, f"dense: the mask {value}")
    try:
        verdict = _judge(value, t_q, t_k)
    except RuntimeError as error:  # a mask that does not broadcast to (T_q, T_k): say so
        return MaskVerdict(False, f"dense: the mask could not be compared ({error})"[:200])
    padding = [n for n in leaves if is_padding(n)]
    if not padding:
        return verdict
    names = ", ".join(n.target for n in padding)
    return MaskVerdict(verdict.causal, f"{verdict.note}; the input {names} taken as all ones "
                       "(no padding, as a tokenizer gives an unpadded batch)", verdict.mask)


def _judge(mask: torch.Tensor | Recipe, t_q: int, t_k: int) -> MaskVerdict:
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


def _row_starts(mask: torch.Tensor | Recipe, t_q: int, t_k: int) -> tuple[list[int], int]:
    """The first rows of the blocks to judge, and the rows per block: every block, or for a
    recipe of more than `MAX_LAZY_ELEMENTS` scores as many as that allows, evenly spread
    (the first and the last always among them)."""
    if isinstance(mask, torch.Tensor) or not has_rows(mask.shape):
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


def _row_blocks(mask: torch.Tensor | Recipe, t_q: int, t_k: int, starts: list[int], step: int
                ) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, rows of the mask as (…, rows, T_k) without broadcast copies) per start."""
    if isinstance(mask, torch.Tensor) or not has_rows(mask.shape):
        whole = mask if isinstance(mask, torch.Tensor) else mask.rows(0, 1)
        whole = base_of(whole)
        if whole.dim() < 2:
            whole = whole.reshape(1, 1) if whole.dim() == 0 else whole.unsqueeze(0)
        yield 0, base_of(whole.expand(*whole.shape[:-2], t_q, t_k))
        return
    if mask.shape[-2] != t_q:
        raise RuntimeError(f"a mask of {mask.shape[-2]} rows for {t_q} queries")
    for start in starts:
        stop = min(start + step, t_q)
        block = base_of(mask.rows(start, stop))
        yield start, base_of(block.expand(*block.shape[:-2], stop - start, t_k))
