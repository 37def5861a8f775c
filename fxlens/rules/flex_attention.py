"""Cost rule for FlexAttention (`torch.nn.attention.flex_attention`): the blocks its kernel
computes, at the cost of SDPA's per score plus the ``score_mod``'s own ops.

The higher-order op ``flex_attention(query, key, value, score_mod, block_mask, scale,
kernel_options, score_mod_other_buffers, mask_mod_other_buffers)`` is captured as one node
(``higher_order.flex_attention``; its function arguments as `Subgraph`s, the ops they run).
Its ``block_mask`` is `BlockMask.as_tuple()`: (Q_LEN, KV_LEN, kv_num_blocks, kv_indices,
full_kv_num_blocks, full_kv_indices, …, Q_BLOCK_SIZE, KV_BLOCK_SIZE, mask_mod). For each
(batch, head, query block) the kernel computes the ``kv_num_blocks`` partial key blocks listed
in ``kv_indices`` (masked inside by ``mask_mod``, but every score computed) and the
``full_kv_num_blocks`` full ones: computed scores = Σ over those blocks of their area, clipped
to Q_LEN × KV_LEN. Batch and head dims of size 1 in the block mask broadcast over the query's.

Per computed score, forward: QKᵀ and A·V (``2·d_qk + 2·d_v``), the softmax (8, as SDPA's) and
one FLOP per op of ``score_mod`` (``s + bias[h]``: 1; ``tanh`` soft-capping: several). Outputs:
the attention output and the logsumexp (and max scores), written once, as SDPA's kernels.

The block counts are values, which fake tensors do not hold: when ``create_block_mask`` runs
inside the model from positions alone (causal, sliding-window, prefix masks; document masks
whose ids are built from positions) the graph builds them from factories, and they are
computed on CPU as an attention mask is (`fxlens.rules.mask_values.constant_value`). A block
mask made before the forward (torchtitan's pattern: held by the model or handed to it) is
read from the values the capture kept of its tensors (`Node.value`; real, small integers).
One whose values nobody holds (made on fake or meta tensors, or from the inputs) is counted
dense (every block), the note says.
The node's note gives the block sparsity the count assumes.

The backward, ``flex_attention_backward(query, key, value, out, logsumexp, grad_out,
grad_logsumexp, fw_graph, joint_graph, block_mask, …)``, recorded with the training step,
counts SDPA's backward per computed score (`fxlens.rules.attention`: scores recomputed, five
GEMMs, the softmax backward) plus one FLOP per op of the score_mod's joint graph, and
D = rowsum(dO·O).

Every capture method records it alike: torch.export and make_fx as the traced higher-order
op, the dispatch-level recording (and so the training step) through
`fxlens.analyzer.capture.recorder`.
"""

from __future__ import annotations

from typing import Any

import torch

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule
from fxlens.analyzer.core.graph import Subgraph, TensorRef
from fxlens.rules.attention import (
    OUTPUT_DOT_FLOPS_PER_ELEMENT,
    SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT,
)
from fxlens.rules.conventions import FLOPS_PER_MAC, SOFTMAX_FLOPS_PER_ELEMENT
from fxlens.rules.hardware import ATTENTION_BACKWARD, ATTENTION_FORWARD
from fxlens.rules.mask_values import constant_value

FLEX = "higher_order.flex_attention"
FLEX_BACKWARD = "higher_order.flex_attention_backward"
KV_NUM, KV_INDICES, FULL_NUM, FULL_INDICES = 2, 3, 4, 5    # after Q_LEN, KV_LEN
Q_BLOCK, KV_BLOCK = -3, -2


@cost_rule(FLEX)
def flex_attention(call: OpCall) -> Cost:
    """FlexAttention forward on (B, H, T, d): SDPA's work per computed score, over the block
    mask's computed blocks, plus the score_mod's ops."""
    q, v = call.shape("arg0"), call.shape("arg2")
    bh, t_q, t_k = q[0] * q[1], q[-2], call.shape("arg1")[-2]
    extra = _ops(call.arg("arg3"))
    scores, note = computed_scores(call, "arg4", bh, t_q, t_k)
    per_score = FLOPS_PER_MAC * (q[-1] + v[-1]) + SOFTMAX_FLOPS_PER_ELEMENT + extra
    note += f"; score_mod {extra} op{'s' if extra != 1 else ''} per score"
    return Cost(flops=scores * per_score, note=note, kernel=ATTENTION_FORWARD)


@cost_rule(FLEX_BACKWARD)
def flex_attention_backward(call: OpCall) -> Cost:
    """FlexAttention backward: SDPA's backward per computed score (scores recomputed, five
    GEMMs, the softmax backward), the score_mod's joint graph per score, and D = rowsum(dO·O)
    per output element."""
    q, v = call.shape("arg0"), call.shape("arg2")
    bh, t_q, t_k = q[0] * q[1], q[-2], call.shape("arg1")[-2]
    extra = _ops(call.arg("arg8"))
    scores, note = computed_scores(call, "arg9", bh, t_q, t_k)
    per_score = (FLOPS_PER_MAC * (3 * q[-1] + 2 * v[-1]) + SOFTMAX_BACKWARD_FLOPS_PER_ELEMENT
                 + extra)
    note += f"; score_mod's joint graph {extra} op{'s' if extra != 1 else ''} per score"
    return Cost(flops=scores * per_score + OUTPUT_DOT_FLOPS_PER_ELEMENT * bh * t_q * v[-1],
                note=note, kernel=ATTENTION_BACKWARD)


def _ops(function: Any) -> int:
    return len(function.ops) if isinstance(function, Subgraph) else 0


def computed_scores(call: OpCall, argument: str, bh: int, t_q: int, t_k: int
                    ) -> tuple[int, str]:
    """Scores the kernel computes over every (batch, head), from the block mask in
    `argument`, and the note saying how many of the blocks that is."""
    mask = call.node.args.get(argument)    # the refs themselves: their values are read
    dense = bh * t_q * t_k
    if not isinstance(mask, (tuple, list)) or len(mask) < 8:
        return dense, "dense: no block mask"
    q_block, kv_block = int(mask[Q_BLOCK]), int(mask[KV_BLOCK])
    values = [_value(call, mask[i]) for i in (KV_NUM, KV_INDICES, FULL_NUM, FULL_INDICES)]
    reason = next((v for v in values if isinstance(v, str)), None)
    if reason is not None:
        return dense, f"dense: the block mask {reason}"
    counts = [torch.as_tensor(v).long() for v in values]
    area = _block_areas(t_q, t_k, q_block, kv_block)
    units = 0
    for num, indices in ((counts[0], counts[1]), (counts[2], counts[3])):
        rows = torch.arange(indices.shape[-2]).clamp(max=area.shape[0] - 1)
        scores = area[rows[:, None].expand_as(indices), indices.clamp(0, area.shape[1] - 1)]
        taken = torch.arange(indices.shape[-1]) < num[..., None]    # the first `num` slots
        units += int((scores * taken).sum())
    computed = units * bh // max(counts[0][..., 0].numel(), 1)    # B, H of 1 broadcast
    blocks = f"{q_block}×{kv_block}"
    share = computed / dense if dense else 0.0
    return computed, (f"block-sparse: {computed:,} of {dense:,} scores ({share:.0%}) in the "
                      f"computed {blocks} blocks, the partial ones in full")


def _value(call: OpCall, ref: Any) -> torch.Tensor | str:
    if not isinstance(ref, TensorRef):
        return "gives no block counts (none given: every block computed)"
    return constant_value(call.graph, ref)


def _block_areas(t_q: int, t_k: int, q_block: int, kv_block: int) -> torch.Tensor:
    """(query blocks, key blocks): the scores of each block inside T_q × T_k."""
    rows = torch.clamp(t_q - torch.arange(0, t_q, q_block), max=q_block)
    cols = torch.clamp(t_k - torch.arange(0, t_k, kv_block), max=kv_block)
    return rows[:, None] * cols[None, :]
