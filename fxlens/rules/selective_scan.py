"""Cost rules for Mamba-1's selective scan as `mamba_ssm`'s fused kernels run it:
``fxlens_mamba::selective_scan`` and its backward (the capture's
`fxlens.analyzer.capture.hf_selective_scan`).

Legend: u, delta and the gate z (B, D, T): batch, channels, tokens; A (D, N); B and C
(B, N, T), N the state size. The kernels keep each channel's state on chip and walk the
tokens once (``selective_scan_fwd_kernel``), so the work is per channel, token and state
(B·D·T·N elements) plus per channel and token (B·D·T):

- forward, per element of the state: the discretised decay ``exp(δ·A)`` (a product and
  ``SPECIAL_FUNCTION_FLOPS``), δ·u times B (one product), the state update (a multiply-add,
  2) and the output C·state (a multiply-add, 2): ``SPECIAL_FUNCTION_FLOPS + 6``; per channel
  and token: softplus of δ plus its bias (2 special functions + 1), δ·u (1), the skip D·u
  (2) and the SiLU gate times the output (a special function + 3):
  ``3·SPECIAL_FUNCTION_FLOPS + 7``;
- backward (``selective_scan_bwd_kernel``), per element of the state: the states recomputed
  chunk by chunk (``SPECIAL_FUNCTION_FLOPS + 4``) and the reverse scan with the gradients of
  the state, A, B, C, delta and u (16): ``SPECIAL_FUNCTION_FLOPS + 20``; per channel and
  token, the forward's pointwise work and its gradients, twice the forward's.

Bytes: the default (inputs read once, outputs written once; B and C are re-read per block of
channels from L2, not memory), plus, forward, the ungated output the kernel also writes for
the backward (B·D·T in u's dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule
from fxlens.analyzer.core.graph import dtype_bytes
from fxlens.rules.conventions import SPECIAL_FUNCTION_FLOPS

FORWARD_PER_STATE = SPECIAL_FUNCTION_FLOPS + 6
BACKWARD_PER_STATE = SPECIAL_FUNCTION_FLOPS + 20
FORWARD_PER_TOKEN = 3 * SPECIAL_FUNCTION_FLOPS + 7


@dataclass(frozen=True)
class SelectiveScan:
    """The sizes one selective scan works on."""

    batch: int
    channels: int
    tokens: int
    states: int
    element: int            # bytes of u's dtype

    @classmethod
    def of(cls, call: OpCall) -> SelectiveScan:
        batch, channels, tokens = call.shape("u")
        return cls(batch, channels, tokens, call.shape("A")[1],
                   int(dtype_bytes(call.tensor("u").dtype)))

    @property
    def channel_tokens(self) -> int:
        return self.batch * self.channels * self.tokens


@cost_rule("fxlens_mamba.selective_scan")
def selective_scan(call: OpCall) -> Cost:
    """Selective scan forward: one pass over the tokens, the state on chip."""
    scan = SelectiveScan.of(call)
    flops = scan.channel_tokens * (scan.states * FORWARD_PER_STATE + FORWARD_PER_TOKEN)
    return Cost(flops=flops, bytes_read=call.default_bytes_read,
                bytes_written=call.default_bytes_written + scan.channel_tokens * scan.element,
                note="Mamba-1 selective scan as mamba_ssm's fused kernel")


@cost_rule("fxlens_mamba.selective_scan_backward")
def selective_scan_backward(call: OpCall) -> Cost:
    """Selective scan backward: the states recomputed, the reverse scan and the gradients."""
    scan = SelectiveScan.of(call)
    flops = scan.channel_tokens * (scan.states * BACKWARD_PER_STATE + 2 * FORWARD_PER_TOKEN)
    return Cost(flops=flops, bytes_read=call.default_bytes_read,
                bytes_written=call.default_bytes_written,
                note="Mamba-1 selective scan backward as mamba_ssm's fused kernels")
