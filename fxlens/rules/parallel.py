"""Op knowledge the parallelism planner reads (`fxlens.analyzer.plan.structure`).

GEMM ops that multiply an activation by a weight (a Megatron column or row split applies to
them), the grouped GEMM of MoE experts (a weight with a leading expert dimension), the ops a
weight passes through on its way there (views, transposes, dtype casts under autocast), the
embedding lookup (vocab-parallel), the attention kernels (context parallelism resizes
them), and what torchtitan's op-level checkpointing policy saves (``ckpt=ops``: its
``_save_list`` in ``torchtitan/models/llama3/parallelize_llama.py`` — ``aten.mm`` every second
one, the flash and memory-efficient attention kernels, ``reduce_scatter_tensor``, ``max``;
cuDNN's attention and the CPU flash kernel a capture on CPU records stand for the GPU's).
"""

from __future__ import annotations

import torch

from fxlens.analyzer.plan.types import ParallelKnowledge
from fxlens.rules.attention import FUSED_BACKWARD, FUSED_FORWARD, RAW_BACKWARD, RAW_FORWARD
from fxlens.rules.views import VIEW_OPS

aten = torch.ops.aten

PARALLEL = ParallelKnowledge(
    gemm_ops=frozenset({"aten.mm", "aten.addmm", "aten.linear", "aten.matmul"}),
    grouped_gemm_ops=frozenset({"aten._grouped_mm"}),
    weight_path_ops=VIEW_OPS | {"aten._to_copy", "aten.to", "aten.clone", "aten.contiguous",
                                "aten._to_dtype", "aten.type_as"},
    embedding_ops=frozenset({"aten.embedding"}),
    dequantize_ops=frozenset({"fxlens_nf4.dequantize"}),
    # the raw flash and memory-efficient kernels too: packed sequences' varlen attention
    attention_ops=frozenset(str(op) for op in (*FUSED_FORWARD, *FUSED_BACKWARD,
                                               aten._scaled_dot_product_attention_math,
                                               *RAW_FORWARD, *RAW_BACKWARD)),
    saved_ops=frozenset(str(op) for op in FUSED_FORWARD)
    | {"aten.max", "_c10d_functional.reduce_scatter_tensor"},
    alternate_saved_ops=frozenset({"aten.mm"}),
    residual_ops=frozenset({"aten.add"}),
)
