"""The expert all-to-alls a stage's compute does not hide, as Megatron-core runs ``a2a-overlap``.

Without it every dispatch and combine all-to-all waits for its compute and stalls the next.
With it (``overlap_moe_expert_parallel_comm``: the combined 1F1B schedule), the steady state
runs one micro-batch's forward of a layer beside another micro-batch's backward of a layer,
on two streams (``TransformerLayerSchedulePlan.run`` in
``megatron/core/models/common/model_chunk_schedule_plan.py``):

    communication: combine bwd | dispatch fwd        | dispatch bwd      | combine fwd
    compute:       attention fwd | experts' dgrad, wgrad | experts' fwd | attention bwd

each transfer waiting for what produces its input and each compute for its operands
(`layer_pair_s` simulates the two streams). "Attention" is everything of the layer that is not
routed-expert work (the router, the shared experts: Megatron's ``pre_dispatch_computation``);
the experts' backward is half data gradient, half weight gradient (equal GEMM FLOPs), and the
dispatch backward waits only for the first. So an all-to-all hides behind the compute it is
paired with, not behind the step's compute at large: a long inter-node dispatch is exposed
where it outlasts the experts' backward, though the whole step's compute is longer.

The pairs exist only where a forward and a backward are both in flight: the forwards of the
warm-up and as many backwards of the cool-down run alone, their transfers exposed (one
micro-batch without a pipeline; on stage i of an interleaved one the chunks it warms up,
`fxlens.analyzer.plan.pipeline_layout.in_flight`). Under full recompute the recomputed
forward's two transfers are not paired either.

NB: a pair's forward and backward are the same layer (identical blocks); a dense layer paired
with a MoE one (DeepSeek-V3's first three) is not modelled, nor the host time of launching
the two streams' kernels.
"""

from __future__ import annotations

from collections.abc import Sequence

from fxlens.analyzer.plan.stage_memory import in_flight
from fxlens.analyzer.plan.strategy import Strategy
from fxlens.analyzer.plan.structure import Unit
from fxlens.analyzer.plan.transfers import expert_passes
from fxlens.analyzer.plan.unit_share import experts_s, phase_s


def layer_pair_s(transfer_s: float, attention_fwd_s: float, experts_fwd_s: float,
                 attention_bwd_s: float, experts_bwd_s: float) -> float:
    """Seconds of one layer's forward beside one layer's backward on the two streams, each of
    the four all-to-alls `transfer_s` long (see the module docstring)."""
    q = transfer_s
    dgrad_end = max(attention_fwd_s, q) + experts_bwd_s / 2     # waits for the combine bwd
    dispatch_fwd_end = max(attention_fwd_s, q) + q
    wgrad_end = dgrad_end + experts_bwd_s / 2
    dispatch_bwd_end = max(dispatch_fwd_end, dgrad_end) + q
    experts_fwd_end = max(wgrad_end, dispatch_fwd_end) + experts_fwd_s
    attention_bwd_end = max(experts_fwd_end, dispatch_bwd_end) + attention_bwd_s
    combine_fwd_end = max(experts_fwd_end, dispatch_bwd_end) + q
    return max(attention_bwd_end, combine_fwd_end)


def expert_exposed_s(s: Strategy, units: Sequence[Unit], all_to_all_s: float,
                     stage: int = 0) -> float:
    """The stage's expert all-to-all seconds on its critical path (all micro-batches), of
    `all_to_all_s` in all (`fxlens.analyzer.plan.transfers.expert_parallel`'s, shared among
    the MoE layers by their routed bytes)."""
    routed = sum(u.routed_bytes for u in units)
    if not s.a2a_overlap or not routed or all_to_all_s <= 0:
        return all_to_all_s
    m = s.micro_batches
    passes = expert_passes(s)
    paired = 0.0        # one micro-batch's exposed seconds, every layer paired
    for u in units:
        if not u.routed_bytes:
            continue
        q = all_to_all_s * u.routed_bytes / routed / (passes * m)
        experts = experts_s(s, u, "forward"), experts_s(s, u, "backward")
        attention = phase_s(s, u, "forward") - experts[0], phase_s(s, u, "backward") - experts[1]
        alone = attention[0] + experts[0] + attention[1] + experts[1]
        paired += layer_pair_s(q, attention[0], experts[0], attention[1], experts[1]) - alone
        paired += (passes - 4) * q          # a recomputed forward's, unpaired
    unpaired = in_flight(s, stage) / m
    return paired * m * (1 - unpaired) + all_to_all_s * unpaired
