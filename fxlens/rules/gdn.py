"""Cost rules for chunked gated delta rules as `flash-linear-attention`'s kernels run them:
``fxlens_gdn::chunk`` and its backward (the capture's `fxlens.analyzer.capture.hf_gdn`), for a
decay per head (gated DeltaNet: Qwen3-Next, Qwen3.5, OLMo-hybrid; ``chunk_gated_delta_rule``)
or per head and key channel (Kimi Delta Attention, Kimi Linear; ``chunk_kda``).

Legend: q, k (B, T, H_k, K), v (B, T, H, V): batch, tokens, value heads, key and value head
dims; C the chunk size (64), c = ⌈T/C⌉ chunks (the last one padded, as the kernels compute
it); d the decay's width per token and head (1, or K per channel); S = 16 the sub-chunk of
the per-channel kernels. Every kernel works per value head (a key head serves H/H_k of them),
so every product below is per value head.

Forward, per chunk and head, one multiply-add each (GDN's ``chunk_gated_delta_rule_fwd``;
KDA's ``chunk_kda_fwd`` runs the same products in ``chunk_kda_fwd_intra``):
- β·K·Kᵀ (``chunk_scaled_dot_kkt``), ``C²K``; its unit lower-triangular inverse A
  (``solve_tril``), ``C³/6``;
- W = A·(β·K·decay), U = A·(β·V) (``recompute_w_u``), ``C²K + C²V``;
- the new values U − W·h and the state update Kᵀ·v_new (``chunk_gated_delta_rule_fwd_h``),
  ``2CKV``;
- Q·h, Q·Kᵀ and the masked scores times v_new (``chunk_fwd_o``), ``CKV + C²K + C²V``;
so ``3C²K + 2C²V + 3CKV + C³/6``. A per-channel decay cannot be factored out of a product:
KDA's kernels decay Q and K channel by channel and compute the diagonal S × S sub-blocks of
both squares elementwise, ``2SCK`` more. Pointwise: a per-head decay's ``exp`` of a
difference per score of both squares; a per-channel one's per element of each diagonal
sub-block and of Q and K gated both ways (4 per token, head and channel); each
``SPECIAL_FUNCTION_FLOPS`` + 1; and the state's decay and update between chunks (2 FLOPs
per state element).

Backward, per chunk and head (``chunk_gated_delta_rule_bwd``): W, U and h recomputed
(``C²K + C²V + 2CKV``); ``chunk_bwd_dv_local`` (``C²K + C²V``); ``bwd_dhu``, the state
gradient's recurrence (``3CKV``); ``chunk_bwd_dqkwg`` (``2C²K + C²V + 3CKV``);
``prepare_wy_repr_bwd``, through A and the triangular inverse (``4C²K + 2C²V + 2C³``):
``8C²K + 5C²V + 8CKV + 2C³``, twice the diagonal sub-blocks' work with a per-channel decay,
and the forward's pointwise work once more.

Bytes: the default (inputs read once, outputs written once) plus what the kernels hand each
other through memory, e the bytes of q's dtype. Forward, per token and head: A in float32
from ``kkt`` to ``solve_tril`` (written and read, 2·4C), A read again by ``recompute_w_u``
(eC), W and U written and read (2e(K+V)), v_new written and read (2eV), K read three times
more; the decay's chunk sums in float32 written once and read four times (4d each); per
chunk and head the state h (K × V, e) written and read. Backward, per token and head: W, U,
v_new, the local and the updated dv, dW and the second dK each written and read
(e(6K + 8V)), K read five times more, Q twice, V once; the decay's sums read five times and
its gradient in float32 written and read twice (4d each); per chunk and head h and its
gradient dh written and read (4·eKV).

Latency: the state kernels (``fwd_h``; backward ``bwd_dhu`` and ``fwd_h`` recomputed) walk a
sequence's chunks in order, one program per sequence, value head and 32 value channels, each
step waiting on the last; the other kernels run every chunk at once. On an H200
(bench/gpu/gdn.py) the forward's kernels took their roofline plus c steps of the device's
`recurrence_step_s` per wave of programs (1k–32k tokens, 16–512 programs: kernels ÷ fxlens
1.5–5× without the steps), and ``bwd_dhu``'s step took 1.85× ``fwd_h``'s (2.21–2.33 against
1.23–1.27 µs): the serial steps are c forward, c(1 + 1.85) backward (`Cost.recurrence`).
KDA's state kernels have the same shape; their times are unmeasured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fxlens.analyzer.core.costs import Cost, OpCall, Recurrence, cost_rule
from fxlens.analyzer.core.graph import dtype_bytes
from fxlens.rules.conventions import FLOPS_PER_MAC, SPECIAL_FUNCTION_FLOPS

FLOAT32_BYTES = 4
DECAY_SQUARES = 2           # the decayed squares: β·K·Kᵀ and Q·Kᵀ
SUB_CHUNK = 16              # the per-channel kernels' diagonal sub-blocks
GATED_PASSES = 4            # per-channel: Q and K each decayed both ways
STATE_PASS_FLOPS = 2        # decay × state + update, per state element per chunk
EXP = SPECIAL_FUNCTION_FLOPS + 1
VALUE_BLOCK = 32            # value channels one state-kernel program holds
BACKWARD_STEPS = 1 + 1.85   # fwd_h recomputed, then bwd_dhu, in forward steps (docstring)


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
    per_channel: bool       # a decay per key channel (KDA), else per head (GDN)

    @classmethod
    def of(cls, call: OpCall) -> DeltaRule:
        batch, tokens, heads, value_dim = call.shape("v")
        chunk = int(call.arg("chunk_size"))
        return cls(batch, tokens, math.ceil(tokens / chunk), chunk, heads, call.shape("k")[3],
                   value_dim, int(dtype_bytes(call.tensor("q").dtype)),
                   len(call.shape("g")) == 4)

    @property
    def _chunk_heads(self) -> int:
        return self.batch * self.chunks * self.heads

    @property
    def _token_heads(self) -> int:
        return self.batch * self.tokens * self.heads

    @property
    def _decay_width(self) -> int:
        return self.key_dim if self.per_channel else 1

    @property
    def _diagonal_macs(self) -> int:
        """Per chunk and head, both squares' diagonal sub-blocks elementwise (per-channel)."""
        return DECAY_SQUARES * SUB_CHUNK * self.chunk * self.key_dim if self.per_channel else 0

    def _per_chunk(self, kk: int, vv: int, kv: int, cube: float, diagonal: int) -> int:
        c, k, v = self.chunk, self.key_dim, self.value_dim
        per = (kk * c * c * k + vv * c * c * v + kv * c * k * v + cube * c ** 3
               + diagonal * self._diagonal_macs)
        return int(self._chunk_heads * per)

    @property
    def forward_macs(self) -> int:
        return self._per_chunk(3, 2, 3, 1 / 6, 1)

    @property
    def backward_macs(self) -> int:
        return self._per_chunk(8, 5, 8, 2, 2)

    @property
    def pointwise_flops(self) -> int:
        if self.per_channel:
            decays = (self._diagonal_macs + GATED_PASSES * self.chunk * self.key_dim) * EXP
        else:
            decays = DECAY_SQUARES * self.chunk ** 2 * EXP
        passing = self.key_dim * self.value_dim * STATE_PASS_FLOPS
        return self._chunk_heads * (decays + passing)

    @property
    def programs(self) -> int:
        """The state kernels' programs, each walking one sequence's chunks."""
        return self.batch * self.heads * math.ceil(self.value_dim / VALUE_BLOCK)

    def _states(self) -> int:
        return self._chunk_heads * self.key_dim * self.value_dim * self.element

    @property
    def forward_traffic(self) -> tuple[int, int]:
        """(read, written) beyond the default, through memory between the kernels."""
        e, k, v, c = self.element, self.key_dim, self.value_dim, self.chunk
        decay = FLOAT32_BYTES * self._decay_width
        handed = self._token_heads * (FLOAT32_BYTES * c + e * (k + 2 * v) + decay) + self._states()
        reread = self._token_heads * (e * c + 3 * e * k + 3 * decay)
        return handed + reread, handed

    @property
    def backward_traffic(self) -> tuple[int, int]:
        e, k, v = self.element, self.key_dim, self.value_dim
        decay = FLOAT32_BYTES * self._decay_width
        handed = self._token_heads * (e * (3 * k + 4 * v) + 2 * decay) + 2 * self._states()
        reread = self._token_heads * (e * (5 * k + 2 * k + v) + 5 * decay)
        return handed + reread, handed


def _cost(call: OpCall, rule: DeltaRule, macs: int, traffic: tuple[int, int],
          steps: float, what: str) -> Cost:
    read, written = traffic
    return Cost(flops=FLOPS_PER_MAC * macs + rule.pointwise_flops,
                bytes_read=call.default_bytes_read + read,
                bytes_written=call.default_bytes_written + written,
                note=f"chunked gated delta rule{what} as flash-linear-attention's kernels",
                recurrence=Recurrence(steps * rule.chunks, rule.programs))


@cost_rule("fxlens_gdn.chunk")
def chunk(call: OpCall) -> Cost:
    """Gated delta rule forward: the kernels' matmuls, the decays, their hand-offs."""
    rule = DeltaRule.of(call)
    return _cost(call, rule, rule.forward_macs, rule.forward_traffic, 1, "")


@cost_rule("fxlens_gdn.chunk_backward")
def chunk_backward(call: OpCall) -> Cost:
    """Gated delta rule backward: the recomputation and the gradient kernels."""
    rule = DeltaRule.of(call)
    return _cost(call, rule, rule.backward_macs, rule.backward_traffic, BACKWARD_STEPS,
                 " backward")
