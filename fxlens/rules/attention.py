"""Cost rules for scaled-dot-product attention: the composite op, its backend kernels and
their backward.

Legend: ``B, H, T_q, T_k, d``; ``BH`` is every leading dim of the query (batch × query
heads), ``d_qk`` the query/key head dim, ``d_v`` the value head dim. The ``aten._sdpa_*``
ops take ``(B, H, T, d)``; the raw ``_flash_attention_*`` / ``_efficient_attention_*``
kernels take ``(B, T, H, d)``.

Forward, per computed score (one query-key pair of one head):
- QKᵀ ``2·d_qk`` and A·V ``2·d_v`` FLOPs, so ``4·BH·T_q·T_k·d`` dense when d_qk = d_v;
- softmax ``SOFTMAX_FLOPS_PER_ELEMENT`` (8: max, subtract, exp 4, sum, divide).
Backward, as torch.utils.flop_counter: five GEMMs, recompute S = QKᵀ (``2·d_qk``),
dP = dO·Vᵀ (``2·d_v``), dV = Pᵀ·dO (``2·d_v``), dQ = dS·K and dK = dSᵀ·Q (``2·d_qk`` each),
i.e. 2.5× the forward GEMMs; plus the softmax backward,
``SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT`` per score (P = exp(S − logsumexp): 1 + 4;
dS = P ⊙ (dP − D): 2) and ``D = rowsum(dO ⊙ O)``, 2 FLOPs per output element.

Causal masking counts the work actually done: only computed scores. ``is_causal`` is
top-left aligned as in SDPA (query i sees keys j ≤ i), so a head computes
``Σ_i min(i + 1, T_k)`` scores, ``T(T + 1)/2`` for a square. The raw efficient kernels'
``custom_mask_type`` 2 is bottom-right aligned (query i sees keys j ≤ i + T_k − T_q).
NB: kernels skip whole tiles, not single scores, so real causal work is slightly higher.

Which convention applies is what the kernel the call runs does: ``is_causal=True`` counts
causal; no mask or any explicit mask counts every score, since the math, memory-efficient and
cuDNN kernels handed a mask compute them all, even an exactly causal one. `transformers`'
causal LMs pass ``is_causal=True`` in their eager run, and the capture makes them do so while
traced too (`fxlens.analyzer.capture.hf_masks`); a model that builds its own mask (Falcon, a
``tril`` by hand) counts dense, as its eager run computes. What an explicit mask allows is
judged from its values where the graph builds it (`fxlens.rules.masks`): an exactly causal one
is named in the note, and the finding FUS009 says what ``is_causal=True`` would skip.
Every attention cost carries a note (`Cost.note`) naming the convention applied and why.

Grouped-query attention (fewer key/value heads, ``enable_gqa``): FLOPs follow the query
heads, as every query head computes its own scores.

Bytes: the default (inputs read once, outputs written once) is right for the fused kernels,
which never materialise the score matrix. ``_scaled_dot_product_attention_math`` does: when it
stays whole (it normally decomposes) we add writing the raw scores and reading scores and
probabilities back (its second output, the probabilities, is already written by the default),
and count its FLOPs on the dense square even when causal (there the mask is applied to a full
score matrix, no work is skipped).

Against FlopCounterMode (torch 2.13), ours = its GEMMs + the softmax terms, except where it is
knowingly off: it counts 0 for the CPU flash kernel and its backward, the dense square for
causal, and reads the raw kernels' (B, T, H, d) tensors as if they were (B, H, T, d).

Sliding windows: the raw flash kernels' ``window_size_left`` w (causal) counts the w + 1 keys
each query sees, as FlashAttention computes them; a banded mask handed to a kernel is counted
as that kernel computes it, every score (the "pass is_causal" finding, `skippable`, prices the
window a windowed kernel would skip).

Known limitations: the additive mask/bias and the score scaling (1 FLOP per score each) and
dropout are not counted; variable-length (nested/``cum_seq``) batches count every sequence at
the maximum length, as FlopCounterMode does (fake tensors do not know the offsets).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule, numel
from fxlens.rules.conventions import (
    FLOPS_PER_MAC,
    SOFTMAX_FLOPS_PER_ELEMENT,
    SPECIAL_FUNCTION_FLOPS,
)
from fxlens.rules.hardware import ATTENTION_BACKWARD, ATTENTION_FORWARD
from fxlens.rules.masks import MaskPattern, MaskVerdict, mask_convention

aten = torch.ops.aten

SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT = 1 + SPECIAL_FUNCTION_FLOPS + 2
OUTPUT_DOT_FLOPS_PER_ELEMENT = 2  # D = rowsum(dO ⊙ O): one multiply-add per output element


@dataclass(frozen=True)
class Attn:
    """Sizes of one attention call: `scores` is computed scores per (batch, query head)."""

    bh: int
    t_q: int
    d_qk: int
    d_v: int
    scores: int
    note: str = ""


def causal_scores(t_q: int, t_k: int, offset: int = 0) -> int:
    """Σ_i clamp(i + 1 + offset, 0, t_k): scores when query i sees keys j ≤ i + offset."""

    def prefix(m: int) -> int:  # Σ_{j<m} clamp(j, 0, t_k)
        if m <= t_k + 1:
            return m * (m - 1) // 2
        return t_k * (t_k + 1) // 2 + (m - t_k - 1) * t_k

    start = 1 + offset
    return prefix(max(start + t_q, 0)) - prefix(max(start, 0))


def window_scores(t_q: int, t_k: int, offset: int, window: int) -> int:
    """Scores when query i sees the `window` keys ending at key i + offset."""
    return causal_scores(t_q, t_k, offset) - causal_scores(t_q, t_k, offset - window)


def _attn(call: OpCall, seq_first: bool = False, mask_type: int | None = None) -> Attn:
    """Sizes from query/key/value, `(B, H, T, d)` or `(B, T, H, d)` when `seq_first`."""
    q, k, v = call.shape("query"), call.shape("key"), call.shape("value")
    t = -3 if seq_first else -2
    seqs = _varlen_seqs(call) if seq_first else 1
    t_q, t_k = (q[t], k[t]) if seqs == 1 else _max_lens(call)
    if mask_type is None:
        verdict = mask_convention(call)
        mask_type, note = int(verdict.causal), verdict.note
    else:
        note = MASK_TYPE_NOTES.get(mask_type, f"custom_mask_type={mask_type}")
    offset = (mask_type - 1) * (t_k - t_q)
    scores = t_q * t_k if mask_type == 0 else causal_scores(t_q, t_k, offset)
    left = call.arg("window_size_left")
    if mask_type and isinstance(left, int) and 0 <= left < t_k:   # FlashAttention's window
        scores = window_scores(t_q, t_k, offset, left + 1)
        note += f"; sliding window: each query sees its last {left + 1} keys"
    bh = numel(q) // max(q[t] * q[-1], 1) * seqs
    return Attn(bh, t_q, q[-1], v[-1], scores, note)


MASK_TYPE_NOTES = {
    0: "dense: custom_mask_type=0",
    1: "causal: custom_mask_type=1 (top-left)",
    2: "causal: custom_mask_type=2 (bottom-right)",
}


def _varlen_seqs(call: OpCall) -> int:
    """Sequences packed into one varlen batch (offsets `cum_seq_q`); 1 for a padded batch."""
    for name in ("cum_seq_q", "cu_seqlens_q"):
        if call.has(name) and call.shape(name)[0] > 1:
            return call.shape(name)[0] - 1
    return 1


def _max_lens(call: OpCall) -> tuple[int, int]:
    """NB: a varlen batch counts every sequence at the max length (as FlopCounterMode)."""
    names = ("max_q", "max_k") if call.has("max_q") else ("max_seqlen_q", "max_seqlen_k")
    return int(call.arg(names[0])), int(call.arg(names[1]))


def forward_flops(a: Attn) -> int:
    per_score = FLOPS_PER_MAC * (a.d_qk + a.d_v) + SOFTMAX_FLOPS_PER_ELEMENT
    return a.bh * a.scores * per_score


def backward_flops(a: Attn) -> int:
    per_score = FLOPS_PER_MAC * (3 * a.d_qk + 2 * a.d_v) + SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT
    return a.bh * (a.scores * per_score + OUTPUT_DOT_FLOPS_PER_ELEMENT * a.t_q * a.d_v)


FUSED_FORWARD = (
    aten.scaled_dot_product_attention,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_cudnn_attention,
)
RAW_FORWARD = (aten._flash_attention_forward, aten._efficient_attention_forward)   # (B, T, H, d)
RAW_BACKWARD = (aten._flash_attention_backward, aten._efficient_attention_backward)
FUSED_BACKWARD = (
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention_backward,
)


@cost_rule(*FUSED_FORWARD)
def sdpa(call: OpCall) -> Cost:
    """Fused attention forward on (B, H, T, d): GEMMs + softmax on every computed score."""
    a = _attn(call)
    return Cost(flops=forward_flops(a), note=a.note, kernel=ATTENTION_FORWARD)


@cost_rule(*FUSED_BACKWARD)
def sdpa_backward(call: OpCall) -> Cost:
    """Fused attention backward on (B, H, T, d): five GEMMs + softmax backward."""
    a = _attn(call)
    return Cost(flops=backward_flops(a), note=a.note, kernel=ATTENTION_BACKWARD)


@cost_rule(aten._flash_attention_forward)
def flash_forward(call: OpCall) -> Cost:
    """Raw flash kernel on (B, T, H, d) or varlen (total, H, d)."""
    a = _attn(call, seq_first=True)
    return Cost(flops=forward_flops(a), note=a.note, kernel=ATTENTION_FORWARD)


@cost_rule(aten._flash_attention_backward)
def flash_backward(call: OpCall) -> Cost:
    a = _attn(call, seq_first=True)
    return Cost(flops=backward_flops(a), note=a.note, kernel=ATTENTION_BACKWARD)


@cost_rule(aten._efficient_attention_forward)
def efficient_forward(call: OpCall) -> Cost:
    """Raw memory-efficient kernel on (B, T, H, d); causality from `custom_mask_type`."""
    a = _attn(call, seq_first=True, mask_type=int(call.arg("custom_mask_type")))
    return Cost(flops=forward_flops(a), note=a.note, kernel=ATTENTION_FORWARD)


@cost_rule(aten._efficient_attention_backward)
def efficient_backward(call: OpCall) -> Cost:
    a = _attn(call, seq_first=True, mask_type=int(call.arg("custom_mask_type")))
    return Cost(flops=backward_flops(a), note=a.note, kernel=ATTENTION_BACKWARD)


@cost_rule(aten._scaled_dot_product_attention_math)
def sdpa_math(call: OpCall) -> Cost:
    """Unfused reference path: the dense square (causal is a mask, not skipped work), and
    the score matrix goes through memory."""
    a = _attn(call, mask_type=0)
    score_bytes = call.outputs[1].nbytes  # (…, T_q, T_k) probabilities, q's dtype
    return Cost(
        flops=forward_flops(a),
        bytes_read=call.default_bytes_read + 2 * score_bytes,
        bytes_written=call.default_bytes_written + score_bytes,
        note="dense: the unfused math path computes every score, masked or not",
    )


MASKED_OPS = frozenset(str(op) for op in (
    aten.scaled_dot_product_attention, aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_cudnn_attention,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention_backward))
BACKWARD_OPS = frozenset(str(op) for op in FUSED_BACKWARD)


def skippable(call: OpCall) -> tuple[int, int, MaskVerdict]:
    """What an SDPA call (B, H, T, d) handed an exactly causal or sliding-window mask would
    skip on a kernel that skips masked tiles (``is_causal=True``, ``causal_lower_right``, a
    windowed flash or flex kernel): (FLOPs skipped, its FLOPs now, the mask's verdict);
    (0, 0, verdict) for a call whose mask is neither."""
    verdict = mask_convention(call)
    if call.node.packet not in MASKED_OPS or verdict.causal or verdict.mask not in (
            MaskPattern.CAUSAL, MaskPattern.CAUSAL_LOWER_RIGHT, MaskPattern.WINDOW):
        return 0, 0, verdict
    dense = _attn(call)
    t_k = call.shape("key")[-2]
    offset = 0 if verdict.mask is MaskPattern.CAUSAL else t_k - dense.t_q
    scores = (window_scores(dense.t_q, t_k, offset, verdict.window)
              if verdict.mask is MaskPattern.WINDOW else causal_scores(dense.t_q, t_k, offset))
    flops = backward_flops if call.node.packet in BACKWARD_OPS else forward_flops
    return flops(dense) - flops(replace(dense, scores=scores)), flops(dense), verdict
