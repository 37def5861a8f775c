"""The two steps a server runs — a batch's prefill and a decode step — on one GPU or sharded
over a tensor-parallel group, timed at any batch and context.

Tensor parallelism (Megatron's split, as engines shard a decoder: column-parallel QKV and
gate/up projections, row-parallel output and down projections, attention on its share of the
heads, the LM head vocab-parallel; `fxlens.analyzer.plan.forward`): each GPU runs the split
kernels' FLOPs and bytes ÷ t and every other kernel (norms, residual adds, rotary, the
embedding lookup) whole; each row-parallel GEMM's output is all-reduced over the group, ring
bytes ``2(t−1)/t`` of it at the link's achievable bandwidth, after the kernels (not
overlapped: a decode step waits for each all-reduce before its next norm).
NB: an all-reduce's fixed latency (a few µs per call inside a node) is not modelled; at small
batches, where the payload is a few KiB, it is what the collective costs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fxlens.analyzer.plan.transfers import all_reduce_s
from fxlens.analyzer.serve.kernels import AffineStep
from fxlens.analyzer.time.roofline import Device


@dataclass(frozen=True)
class Steps:
    """`prefill` and `decode` per GPU; `*_reduce`: the bytes one step all-reduces (one
    kernel's bytes, affine like the others), None on one GPU."""

    prefill: AffineStep
    decode: AffineStep
    tp: int = 1
    link_bytes_per_s: float = 0.0
    prefill_reduce: AffineStep | None = None
    decode_reduce: AffineStep | None = None

    def prefill_s(self, device: Device, batch: int, prompt: int) -> float:
        return float(self.prefill.times_s(device, batch, [prompt])[0]
                     + self._reduce_s(self.prefill_reduce, batch, [prompt])[0])

    def decode_s(self, device: Device, batch: int, contexts: Sequence[int]) -> torch.Tensor:
        return (self.decode.times_s(device, batch, contexts)
                + self._reduce_s(self.decode_reduce, batch, contexts))

    def _reduce_s(self, reduce: AffineStep | None, batch: int, contexts: Sequence[int]
                  ) -> torch.Tensor:
        if reduce is None or self.tp <= 1:
            return torch.zeros(len(contexts), dtype=torch.float64)
        payloads = [float(reduce.work(batch, c)[1] @ reduce.weights) for c in contexts]
        return torch.tensor([all_reduce_s(p, self.tp, self.link_bytes_per_s) for p in payloads],
                            dtype=torch.float64)


def sharded(step: AffineStep, split: Sequence[bool], tp: int) -> AffineStep:
    """`step` on one GPU of `tp`: the `split` kernels' work ÷ tp."""
    scale = torch.tensor([1.0 / tp if s else 1.0 for s in split], dtype=torch.float64)
    return AffineStep(step.kernels, step.flops * scale[:, None], step.bytes * scale[:, None],
                      step.weights)
