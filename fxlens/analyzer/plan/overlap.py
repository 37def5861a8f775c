"""How much of a step's data-parallel transfers its compute hides, as the schedules run them.

Megatron-core's data parallelism (``overlap_grad_reduce``, ``overlap_param_gather``: what
NeMo, Megatron-Bridge and the MLPerf GPT-3 runs set) splits the traffic in two halves:
- the **gradient reduce** (the reduce-scatter of ZeRO-1/2, DDP's all-reduce) of a model chunk
  starts once the chunk's last backward has produced its gradients, bucket by bucket, and
  runs beside the backwards still to come;
- the **weight gather** of ZeRO-1/2 (the updated weights, all-gathered) runs beside the next
  step's forwards: a chunk's weights must be in place when its first forward starts.

Without interleaving a stage is one chunk: its reduce hides behind its last micro-batch's
backward, its gather behind its first forward. Interleaved 1F1B (v > 1) runs micro-batches in
groups of ``g = min(p, m)`` per model chunk: the last group's backwards go through the chunks
in turn (chunk v − 1 first), so chunk k's gradients are final ``(k·g + 1)`` chunk-backwards
(of 1/v of a micro-batch's backward each) before the step ends, counting the one its buckets
overlap; the first group's forwards reach chunk k after ``k·g`` chunk-forwards. With the v
chunks' transfers (1/v of the half each) run one after another in that order, the step ends
late by ``max over k of ((k + 1)·T/v − (k·g + 1)·w/v)`` (T: the half's time, w: one
micro-batch's backward or forward), 0 when every chunk's transfer fits its window.

FSDP / ZeRO-3 gathers and reduces every unit every micro-batch, beside all of its compute.

NB: the transfers of a half run one after another at full bandwidth; NCCL's
per-bucket calls (their latency is in each collective's time) and the host time to launch
them are not split further.
"""

from __future__ import annotations

from collections.abc import Sequence

from fxlens.analyzer.core.sections import Collective
from fxlens.analyzer.plan.strategy import Strategy


def late_s(transfer_s: float, per_micro_s: float, s: Strategy) -> float:
    """Seconds `transfer_s` of one half runs past the step's edge, its chunks hidden behind
    one micro-batch's phase of `per_micro_s` seconds on the stage (see the module doc)."""
    if transfer_s <= 0:
        return 0.0
    group = min(s.pp, s.micro_batches)
    chunk, window = transfer_s / s.v, per_micro_s / s.v
    return max(0.0, max((k + 1) * chunk - (k * group + 1) * window for k in range(s.v)))


def halves_s(s: Strategy, collectives: Sequence[Collective], extra_s: float = 0.0
             ) -> tuple[float, float]:
    """(gradient reduce, weight gather) seconds of one stage's data-parallel collectives;
    `extra_s` (PowerSGD's factorisation) is on the reduce's path."""
    gather = sum(c.time_s for c in collectives
                 if c.kind == "all-gather" and s.zero in (1, 2))
    return sum(c.time_s for c in collectives) + extra_s - gather, gather


def exposed_s(s: Strategy, reduce_s: float, gather_s: float, forward_s: float,
              backward_s: float) -> float:
    """The data-parallel seconds a step does not hide (`forward_s`, `backward_s`: every
    micro-batch's on the stage, recompute with the backward)."""
    if s.zero == 3:
        return max(0.0, reduce_s + gather_s - forward_s - backward_s)
    m = s.micro_batches
    return late_s(reduce_s, backward_s / m, s) + late_s(gather_s, forward_s / m, s)
