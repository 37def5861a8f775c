"""Cost rules for the gated delta rule (gated DeltaNet) as `flash-linear-attention`'s chunked
kernels run it: ``fxlens_gdn::chunk`` and its backward (the capture's
`fxlens.analyzer.capture.hf_gdn`).

Legend: q, k (B, T, H_k, K), v (B, T, H, V): batch, tokens, value heads, key and value head
dims; C the chunk size (64), c = ⌈T/C⌉ chunks (the last one padded, as the kernels compute
it). Every kernel works per value head (a key head serves H/H_k of them), so every product
below is per value head.

Forward, per chunk and head, one multiply-add each (`chunk_gated_delta_rule_fwd`):
- ``chunk_scaled_dot_kkt``: β·K·Kᵀ, ``C²K``; ``solve_tril``: the unit lower-triangular
  inverse A, ``C³/6``;
- ``recompute_w_u``: W = A·(β·K·decay), U = A·(β·V), ``C²K + C²V``;
- ``chunk_gated_delta_rule_fwd_h``: the new values U − W·h and the state update Kᵀ·v_new,
  ``2CKV``;
- ``chunk_fwd_o``: Q·h, Q·Kᵀ and the masked scores times v_new, ``CKV + C²K + C²V``;
so ``3C²K + 2C²V + 3CKV + C³/6``; plus the decays, ``exp`` of a difference per score of both
squares (``SPECIAL_FUNCTION_FLOPS`` + 1 each), and the state's decay and update between
chunks (2 FLOPs per state element). Every score of a chunk's square is counted: the kernels
compute whole tiles.

Backward (`chunk_gated_delta_rule_bwd`), per chunk and head: W, U and h recomputed
(``C²K + C²V + 2CKV``); ``chunk_bwd_dv_local`` (``C²K + C²V``); ``bwd_dhu``, the state
gradient's recurrence (``3CKV``); ``chunk_bwd_dqkwg`` (``2C²K + C²V + 3CKV``);
``prepare_wy_repr_bwd``, through A and the triangular inverse (``4C²K + 2C²V + 2C³``):
``8C²K + 5C²V + 8CKV + 2C³``, and the forward's pointwise work once more.

Bytes: the default (inputs read once, outputs written once) plus what the kernels hand each
other through memory, e the bytes of q's dtype. Forward, per token and head: A in float32
from ``kkt`` to ``solve_tril`` (written and read, 2·4C), A read again by ``recompute_w_u``
(eC), W and U written and read (2e(K+V)), v_new written and read (2eV), K read three times
more and the decay (float32) three times more; per chunk and head the state h (K × V, e)
written and read. Backward, per token and head: W, U, v_new, the local and the updated dv, dW
and the second dK each written and read (e(6K + 8V)), K read five times more, Q twice, V once;
per chunk and head h and its gradient dh written and read (4·eKV).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule
from fxlens.analyzer.core.graph import dtype_bytes
from fxlens.rules.conventions import FLOPS_PER_MAC, SPECIAL_FUNCTION_FLOPS

FLOAT32_BYTES = 4
DECAY_SQUARES = 2           # the exp-decayed squares: β·K·Kᵀ and Q·Kᵀ
STATE_PASS_FLOPS = 2        # decay × state + update, per state element per chunk


@dataclass(frozen=True)
class DeltaRule:
    """The sizes one chunked gated delta rule works on."""

    batch: int
    tokens: int
    chunks: int
    chunk: int
    heads: int
    key_dim: int
    value_dim: int
    element: int            # bytes of q's dtype

    @classmethod
    def of(cls, call: OpCall) -> DeltaRule:
        batch, tokens, heads, value_dim = call.shape("v")
        chunk = int(call.arg("chunk_size"))
        return cls(batch, tokens, math.ceil(tokens / chunk), chunk, heads, call.shape("k")[3],
                   value_dim, int(dtype_bytes(call.tensor("q").dtype)))

    def _per_chunk(self, kk: int, vv: int, kv: int, cube: float) -> int:
        c, k, v = self.chunk, self.key_dim, self.value_dim
        per = kk * c * c * k + vv * c * c * v + kv * c * k * v + cube * c ** 3
        return int(self.batch * self.chunks * self.heads * per)

    @property
    def forward_macs(self) -> int:
        return self._per_chunk(3, 2, 3, 1 / 6)

    @property
    def backward_macs(self) -> int:
        return self._per_chunk(8, 5, 8, 2)

    @property
    def pointwise_flops(self) -> int:
        scores = DECAY_SQUARES * self.chunk ** 2 * (SPECIAL_FUNCTION_FLOPS + 1)
        passing = self.key_dim * self.value_dim * STATE_PASS_FLOPS
        return self.batch * self.chunks * self.heads * (scores + passing)

    def _token_heads(self) -> int:
        return self.batch * self.tokens * self.heads

    def _states(self) -> int:
        return self.batch * self.chunks * self.heads * self.key_dim * self.value_dim * self.element

    @property
    def forward_traffic(self) -> tuple[int, int]:
        """(read, written) beyond the default, through memory between the kernels."""
        e, k, v, c = self.element, self.key_dim, self.value_dim, self.chunk
        handed = self._token_heads() * (FLOAT32_BYTES * c + e * (k + v + v)) + self._states()
        reread = self._token_heads() * (e * c + 3 * e * k + 3 * FLOAT32_BYTES)
        return handed + reread, handed

    @property
    def backward_traffic(self) -> tuple[int, int]:
        e, k, v = self.element, self.key_dim, self.value_dim
        handed = self._token_heads() * e * (3 * k + 4 * v) + 2 * self._states()
        reread = self._token_heads() * e * (5 * k + 2 * k + v)
        return handed + reread, handed


@cost_rule("fxlens_gdn.chunk")
def chunk(call: OpCall) -> Cost:
    """Gated delta rule forward: five kernels' matmuls, the decays, their hand-offs."""
    rule = DeltaRule.of(call)
    read, written = rule.forward_traffic
    return Cost(flops=FLOPS_PER_MAC * rule.forward_macs + rule.pointwise_flops,
                bytes_read=call.default_bytes_read + read,
                bytes_written=call.default_bytes_written + written,
                note="gated DeltaNet chunked rule as flash-linear-attention's kernels")


@cost_rule("fxlens_gdn.chunk_backward")
def chunk_backward(call: OpCall) -> Cost:
    """Gated delta rule backward: the recomputation and the gradient kernels."""
    rule = DeltaRule.of(call)
    read, written = rule.backward_traffic
    return Cost(flops=FLOPS_PER_MAC * rule.backward_macs + rule.pointwise_flops,
                bytes_read=call.default_bytes_read + read,
                bytes_written=call.default_bytes_written + written,
                note="gated DeltaNet chunked rule backward as flash-linear-attention's kernels")
