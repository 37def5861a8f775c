"""The two steps a server runs — a batch's prefill and a decode step — on one GPU or sharded
over a tensor-parallel group, timed at any batch and context.

Tensor parallelism (Megatron's split, as engines shard a decoder: column-parallel QKV and
gate/up projections, row-parallel output and down projections, attention on its share of the
heads, the LM head vocab-parallel; `fxlens.analyzer.plan.forward`): each GPU runs the split
kernels' FLOPs and bytes ÷ t and every other kernel (norms, residual adds, rotary, the
embedding lookup) whole; each row-parallel GEMM's output is all-reduced over the group (a
MoE layer's once its experts' top-k rows are combined: the tokens' hidden states) after
the kernels (not overlapped: a decode step waits for each all-reduce before its next norm),
each call timed as the planner times a collective (`fxlens.analyzer.plan.transfers.
all_reduce_s`): the link's fixed latency per call (NCCL's: 7.8 µs over 2 NVLink GPUs, 15 µs
over 8; `fxlens.rules.links`), then ``2(t−1)/t`` of its bytes at the link's achievable
bandwidth. Where the device's links are in NCCL's table, each call runs the fastest of
NCCL's ring protocols for its size (`Link.protocols`, `fxlens.rules.links.RING_PROTOCOLS`):
LL's latency with a quarter of the bandwidth for a few KiB, LL128's or Simple's higher
latency with (nearly) all of it for the MiBs a step of hundreds of tokens all-reduces.
A decode step of a 70B model makes 160 of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from fxlens.analyzer.plan.transfers import all_reduce_s
from fxlens.analyzer.serve.kernels import AffineStep
from fxlens.analyzer.time.roofline import Device


@dataclass(frozen=True)
class Link:
    """The tensor-parallel group's link: achievable bytes/s per GPU, and the fixed seconds of
    one all-reduce call over the group; `protocols`: (fixed seconds, bytes/s) of each
    protocol the library picks from per call (() : the one pair above)."""

    bytes_per_s: float = 0.0
    latency_s: float = 0.0
    protocols: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class Steps:
    """`prefill` and `decode` per GPU; `*_reduce`: what one step all-reduces, a kernel per
    row-parallel output whose bytes are one call's payload (affine like the others) and whose
    weight is its calls per step; None on one GPU. `shared`: (decode, prefill) rows of the
    kernels reading the same weights, which a step running both reads once
    (`fxlens.analyzer.serve.mixed`)."""

    prefill: AffineStep
    decode: AffineStep
    tp: int = 1
    link: Link = Link()
    prefill_reduce: AffineStep | None = None
    decode_reduce: AffineStep | None = None
    shared: tuple[tuple[int, int], ...] = ()

    def prefill_s(self, device: Device, batch: float, prompt: int) -> float:
        return float(self.prefill.times_s(device, batch, [prompt])[0]
                     + self.reduce_s(self.prefill_reduce, batch, [prompt])[0])

    def decode_s(self, device: Device, batch: float, contexts: Sequence[float]
                 ) -> torch.Tensor:
        return (self.decode.times_s(device, batch, contexts)
                + self.reduce_s(self.decode_reduce, batch, contexts))

    def reduce_s(self, reduce: AffineStep | None, batch: float, contexts: Sequence[float]
                 ) -> torch.Tensor:
        """Seconds of a step's all-reduces at `batch`, for each of `contexts`."""
        if reduce is None or self.tp <= 1:
            return torch.zeros(len(contexts), dtype=torch.float64)
        _, payloads = reduce.works(batch, contexts)                   # (calls, contexts)
        return (self.calls_s(payloads) * reduce.weights[:, None]).sum(0)

    def calls_s(self, payloads: torch.Tensor) -> torch.Tensor:
        """Seconds of one all-reduce call of each payload (bytes): the planner's formula,
        its latency plus a time per byte, for the fastest of the link's protocols."""
        options = self.link.protocols or ((self.link.latency_s, self.link.bytes_per_s),)
        times = [all_reduce_s(0.0, self.tp, 1.0, latency)
                 + payloads * all_reduce_s(1.0, self.tp, bandwidth)
                 for latency, bandwidth in options]
        return torch.stack(times).amin(0)


def sharded(step: AffineStep, flop_ways: Sequence[float], byte_ways: Sequence[float],
            cache_ways: Sequence[float] | None = None) -> AffineStep:
    """`step` on one GPU of a tensor-parallel group: each kernel's FLOPs ÷ its `flop_ways`,
    its bytes ÷ its `byte_ways` (1 for a replicated kernel), the bytes that grow with the
    context (the cache it reads: the L and b·L terms) ÷ its `cache_ways` where given — fewer
    ways than the group for a cache of fewer KV heads than GPUs, which every GPU reads
    whole while its queries and outputs split with the heads."""
    def per(ways: Sequence[float]) -> torch.Tensor:
        return torch.tensor([1.0 / w for w in ways], dtype=torch.float64)[:, None]

    moved = step.bytes * per(byte_ways)
    if cache_ways is not None:
        moved[:, 2:] = step.bytes[:, 2:] * per(cache_ways)
    return replace(step, flops=step.flops * per(flop_ways), bytes=moved)
