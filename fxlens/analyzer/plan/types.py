"""The planner's contract with `fxlens.rules`: the op knowledge it reads."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class ParallelKnowledge:
    """The op knowledge the planner reads (built in `fxlens.rules.parallel`)."""

    gemm_ops: frozenset[str]          # packets multiplying an activation by a weight
    grouped_gemm_ops: frozenset[str]  # the same per expert (a weight with a leading expert dim)
    weight_path_ops: frozenset[str]   # ops a weight may pass through on its way to a GEMM
    embedding_ops: frozenset[str]
    attention_ops: frozenset[str]     # attention kernels, forward and backward
    # ops that make a weight from stored buffers (QLoRA's NF4 dequantization): the GEMM they
    # feed is a weight GEMM, its weight named by the first buffer
    dequantize_ops: frozenset[str] = frozenset()
    # ``ckpt=ops`` (`fxlens.analyzer.plan.op_policy`): ops whose outputs the policy saves, and
    # those it saves every second one of (the 1st, 3rd, … in a block's forward)
    saved_ops: frozenset[str] = frozenset()
    alternate_saved_ops: frozenset[str] = frozenset()
    residual_ops: frozenset[str] = frozenset()   # additions whose backward reads no input


def remembered(answers: dict[Hashable, Any], question: Hashable, work: Callable[[], T]) -> T:
    """`work()`'s answer to `question`, computed once per `answers` (the `answers` dict a
    unit, module part or the model keeps: a search asks thousands of layouts the same few
    questions of each)."""
    if question not in answers:
        answers[question] = work()
    answer: T = answers[question]
    return answer
