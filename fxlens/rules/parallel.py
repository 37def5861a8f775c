"""Op knowledge the parallelism planner reads (`fxlens.analyzer.plan.structure`).

GEMM ops that multiply an activation by a weight (a Megatron column or row split applies to
them), the grouped GEMM of MoE experts (a weight with a leading expert dimension), the ops a
weight passes through on its way there (views, transposes, dtype casts under autocast), the
embedding lookup (vocab-parallel), the attention kernels (context parallelism resizes
them), and what torchtitan's op-level checkpointing policy saves (``ckpt=ops``:
``_get_default_save_ops`` in ``torchtitan/distributed/activation_checkpoint.py``, 2026 — the
partitioner's compute-intensive ops (``mm``, ``addmm``, ``bmm``, ``_scaled_mm``, convolutions,
the attention kernels), ``linear``, FlexAttention, ``max``, ``topk``, and the reduce-scatters
and all-to-alls; ``mm`` and ``linear`` only every second one. Its Dec 2024 ``_save_list`` in
``parallelize_llama.py`` held ``mm``, attention, ``reduce_scatter_tensor`` and ``max``: the
same on Llama's blocks. The CPU flash kernel a capture on CPU records stands for the GPU's.)
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
    saved_ops=frozenset(str(op) for op in (*FUSED_FORWARD, *RAW_FORWARD))
    | {"aten.addmm", "aten.bmm", "aten._scaled_mm", "aten.convolution", "aten.max",
       "aten.topk", "higher_order.flex_attention", "_c10d_functional.reduce_scatter_tensor",
       "_c10d_functional.all_to_all_single"},
    alternate_saved_ops=frozenset({"aten.mm", "aten.linear"}),
    residual_ops=frozenset({"aten.add"}),
)
