"""Op knowledge the parallelism planner reads (`fxlens.analyzer.plan.structure`).

GEMM ops that multiply an activation by a weight (a Megatron column or row split applies to
them), the grouped GEMM of MoE experts (a weight with a leading expert dimension), the ops a
weight passes through on its way there (views, transposes, dtype casts under autocast), and the
embedding lookup (vocab-parallel).
"""

from __future__ import annotations

from fxlens.analyzer.plan.types import ParallelKnowledge
from fxlens.rules.views import VIEW_OPS

PARALLEL = ParallelKnowledge(
    gemm_ops=frozenset({"aten.mm", "aten.addmm", "aten.linear", "aten.matmul"}),
    grouped_gemm_ops=frozenset({"aten._grouped_mm"}),
    weight_path_ops=VIEW_OPS | {"aten._to_copy", "aten.to", "aten.clone", "aten.contiguous",
                                "aten._to_dtype", "aten.type_as"},
    embedding_ops=frozenset({"aten.embedding"}),
)
