"""What fp8 training pays besides its faster GEMMs: scaling each GEMM's operands to fp8.

With Transformer Engine's per-tensor current scaling ("FP8-CS"), every fp8 GEMM that reads a
weight first quantizes its other operand: the forward its activation input, the backward's
data-gradient GEMM the incoming output gradient. Each quantization is an amax pass (read the
bf16 tensor), then a cast that reads it again and writes the fp8 copy twice, row-wise and
column-wise (Hopper's fp8 GEMMs take only the TN layout, and the weight-gradient GEMM needs
the transpose): `SCALING_BYTES_PER_ELEMENT` = 2 + 2 + 1 + 1. The weight-gradient GEMM reads
the two copies already made, and weights are quantized once per step (Megatron's
``is_first_microbatch``), not counted. Delayed scaling fuses the amax into the cast (4 bytes);
kernels that emit fp8 from a fused norm or activation avoid part of it: both make this an
upper bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fxlens.analyzer.core.graph import Graph, TensorRef

SCALING_BYTES_PER_ELEMENT = 6


def scaling_s(graph: Graph, gemms: Iterable[int], is_weight: Callable[[TensorRef], bool],
              bandwidth_bytes_per_s: float) -> dict[int, float]:
    """Seconds of quantizing the non-weight operands of each GEMM in `gemms` that reads a
    weight, at `bandwidth_bytes_per_s`."""
    out = {}
    for node_id in gemms:
        refs = list(graph.nodes[node_id].input_refs())
        weights = [r for r in refs if is_weight(r)]
        if not weights or bandwidth_bytes_per_s <= 0:
            continue
        specs = [graph.spec(r) for r in refs if r not in weights]
        elements = sum(s.numel for s in specs
                       if s is not None and len(s.shape) >= 2 and "float" in s.dtype)
        out[node_id] = elements * SCALING_BYTES_PER_ELEMENT / bandwidth_bytes_per_s
    return out
