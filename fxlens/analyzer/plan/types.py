"""The planner's contract with `fxlens.rules`: the op knowledge it reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelKnowledge:
    """The op knowledge the planner reads (built in `fxlens.rules.parallel`)."""

    gemm_ops: frozenset[str]          # packets multiplying an activation by a weight
    grouped_gemm_ops: frozenset[str]  # the same per expert (a weight with a leading expert dim)
    weight_path_ops: frozenset[str]   # ops a weight may pass through on its way to a GEMM
    embedding_ops: frozenset[str]
    attention_ops: frozenset[str]     # attention kernels, forward and backward
