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

Which GEMMs run in fp8 (`fp8_gemms`): those inside the model's repeated blocks. Megatron-core
builds its transformer layers of Transformer Engine modules and its LM head as a plain
``ColumnParallelLinear`` in bf16 (``megatron/core/models/gpt/gpt_model.py`` at d98e8a64: a TE
head only with ``fp8_output_proj`` under MXFP8); torchtitan's float8 conversion leaves the
output projection out likewise (its ``filter_fqns``). A model without repeated blocks runs
every GEMM in fp8.

The same modules save the fp8 copy of a GEMM's activation input for the weight-gradient GEMM,
not the bf16 tensor (`fp8_saved`): a saved tensor that only fp8 GEMMs read in the forward is
kept at one byte per element (the per-tensor scale is a few bytes, not counted).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from fxlens.analyzer.core.graph import Graph, TensorRef, block_of, repeated_blocks
from fxlens.analyzer.memory.liveness import Storages

SCALING_BYTES_PER_ELEMENT = 6


def fp8_gemms(graph: Graph, gemm_ops: Collection[str]) -> list[int]:
    """The GEMM calls (`gemm_ops`) the recipes run in fp8: those of the repeated blocks, or
    every one where the model has none (module docstring)."""
    blocks = repeated_blocks(graph.module_types)
    return [n.id for n in graph.calls() if n.packet in gemm_ops
            and (not blocks or block_of(n.module, blocks))]


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


def fp8_saved(graph: Graph, storages: Storages, saved: Iterable[int],
              fp8_gemms: frozenset[int]) -> dict[int, int]:
    """Bytes of each storage in `saved` that only GEMMs in `fp8_gemms` read in the forward
    (through views), as Transformer Engine saves it: its fp8 copy, one byte per element."""
    readers: dict[int, set[int]] = {}
    for node in graph.calls():
        if node.phase != "forward":
            continue
        made = {storages.of_ref.get(TensorRef(node.id, i)) for i in range(len(node.outputs))}
        for ref in node.input_refs():
            sid = storages.of_ref.get(ref)
            if sid is not None and sid not in made:    # a view of it is not a reader
                readers.setdefault(sid, set()).add(node.id)
    out = {}
    for sid in saved:
        users = readers.get(sid)
        if users and users <= fp8_gemms:
            out[sid] = storages.origin[sid][1].numel
    return out
