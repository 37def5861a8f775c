"""Cost rules for Mamba-2's chunked scan (SSD) as `mamba_ssm`'s fused kernels run it:
``fxlens_ssd::chunk_scan`` and its backward (the capture's `fxlens.analyzer.capture.hf_ssd`).

Legend: x (B, T, H, P): batch, tokens, heads, head dim; B and C (B, T, G, N): groups and state
size; Q the chunk size, c = ⌈T/Q⌉ chunks (the last one padded, as the kernel computes it).

Forward, per sequence, the four matmul passes of the chunked algorithm (Mamba-2 paper §6;
`mamba_ssm`'s ``_bmm_chunk_fwd``, ``_chunk_state_fwd``, ``_state_passing_fwd``,
``_chunk_scan_fwd``), one multiply-add each:
- scores C·Bᵀ within each chunk, per *group* (the kernel does not repeat B and C per head):
  ``c·G·Q²·N``;
- the chunk's contribution to its end state, Bᵀ·(decay ⊙ x): ``c·H·Q·N·P``;
- the within-chunk output (scores ⊙ decay)·x: ``c·H·Q²·P``;
- the output from the chunk's start state, C·state: ``c·H·Q·N·P``;
plus the decay mask, ``exp(segment sum)`` per score of each head (``SPECIAL_FUNCTION_FLOPS``
+ 1 for its product with the scores) and the state passing between chunks (2 FLOPs per state
element per chunk). Every score of a chunk's square is counted: the kernels compute whole
tiles, the causal half of each diagonal block included.

Backward: twice the forward's matmul work (each product's two operand gradients), and its
pointwise terms once more (the decay recomputed). NB: an approximation of `mamba_ssm`'s seven
backward kernels, which also recompute the chunk states.

Bytes: the default (inputs read once, outputs written once) plus the float32 chunk states
(B, c, H, P, N) the kernels hand each other through memory: written by the state pass, read
and rewritten by the state passing, read by the output pass (4 × their size) in the forward,
twice that in the backward (recomputed, then their gradients).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule
from fxlens.rules.conventions import FLOPS_PER_MAC, SPECIAL_FUNCTION_FLOPS

FLOAT32_BYTES = 4
STATE_PASSES = 4            # states written, read and rewritten, read (forward)
STATE_PASS_FLOPS = 2        # decay × state + contribution, per state element per chunk
BACKWARD_MATMUL_FACTOR = 2


@dataclass(frozen=True)
class Scan:
    """The sizes one chunked scan works on."""

    batch: int
    chunks: int
    chunk: int
    heads: int
    head_dim: int
    groups: int
    state: int

    @classmethod
    def of(cls, call: OpCall) -> Scan:
        batch, tokens, heads, head_dim = call.shape("x")
        _, _, groups, state = call.shape("B")
        chunk = int(call.arg("chunk_size"))
        return cls(batch, math.ceil(tokens / chunk), chunk, heads, head_dim, groups, state)

    @property
    def matmul_macs(self) -> int:
        q, n, p = self.chunk, self.state, self.head_dim
        per_chunk = self.groups * q * q * n + self.heads * (2 * q * n * p + q * q * p)
        return self.batch * self.chunks * per_chunk

    @property
    def pointwise_flops(self) -> int:
        mask = self.heads * self.chunk * self.chunk * (SPECIAL_FUNCTION_FLOPS + 1)
        passing = self.heads * self.head_dim * self.state * STATE_PASS_FLOPS
        return self.batch * self.chunks * (mask + passing)

    @property
    def state_bytes(self) -> int:
        elements = self.batch * self.chunks * self.heads * self.head_dim * self.state
        return elements * FLOAT32_BYTES


@cost_rule("fxlens_ssd.chunk_scan")
def chunk_scan(call: OpCall) -> Cost:
    """SSD forward: the four matmul passes, the decay mask, the states through memory."""
    scan = Scan.of(call)
    states = STATE_PASSES * scan.state_bytes
    return Cost(flops=FLOPS_PER_MAC * scan.matmul_macs + scan.pointwise_flops,
                bytes_read=call.default_bytes_read + states // 2,
                bytes_written=call.default_bytes_written + states // 2,
                note="Mamba-2 chunked scan as mamba_ssm's fused kernels")


@cost_rule("fxlens_ssd.chunk_scan_backward")
def chunk_scan_backward(call: OpCall) -> Cost:
    """SSD backward: twice the forward's matmuls, its pointwise work again, states twice."""
    scan = Scan.of(call)
    states = 2 * STATE_PASSES * scan.state_bytes
    flops = BACKWARD_MATMUL_FACTOR * FLOPS_PER_MAC * scan.matmul_macs + scan.pointwise_flops
    return Cost(flops=flops, bytes_read=call.default_bytes_read + states // 2,
                bytes_written=call.default_bytes_written + states // 2,
                note="Mamba-2 chunked scan backward as mamba_ssm's fused kernels")
