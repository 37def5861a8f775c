"""Context parallelism in the planner's search: which cp it tries and that each is a layout
the estimate and the strategy text both take (tests/models/tiny_gpt.py's facts, its sequence
stretched where a test needs a long one)."""

from __future__ import annotations

import dataclasses

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.plan.search import (
    CP_MIN_TOKENS,
    PlanRequest,
    candidates,
    context_degrees,
    plan_section,
)
from fxlens.analyzer.plan.strategy import Strategy, parse
from fxlens.analyzer.plan.structure import ModelFacts
from tests.analyzer.test_plan import H100

Facts = tuple[Report, ModelFacts]


def _long(facts: ModelFacts, seq: int) -> ModelFacts:
    """`facts` read as if each sample were `seq` tokens (the search reads the length alone)."""
    return dataclasses.replace(facts, tokens=facts.samples * seq)


def test_short_sequences_are_not_split(gpt: Facts) -> None:
    _, facts = gpt                       # 16 tokens a sample
    assert context_degrees(facts, 8) == [1]


def test_long_sequences_are_split_while_each_gpu_keeps_enough(gpt: Facts) -> None:
    facts = _long(gpt[1], 4 * CP_MIN_TOKENS)
    assert context_degrees(facts, 16) == [1, 2, 4]
    assert context_degrees(facts, 2) == [1, 2]
    odd = _long(gpt[1], 4 * CP_MIN_TOKENS + 2)     # not in 2·cp chunks for cp = 2 or 4
    assert context_degrees(odd, 16) == [1]


def test_a_model_without_attention_is_not_split(gpt: Facts) -> None:
    facts = _long(gpt[1], 4 * CP_MIN_TOKENS)
    flat = dataclasses.replace(facts, units=tuple(
        dataclasses.replace(u, attention=dataclasses.replace(u.attention, kv_bytes=0))
        for u in facts.units))
    assert context_degrees(flat, 16) == [1]


def test_searched_cp_layouts_use_every_gpu_and_read_back(gpt: Facts) -> None:
    facts = _long(gpt[1], 4 * CP_MIN_TOKENS)
    layouts = [s for s in candidates(facts, PlanRequest(gpus=8), 8) if isinstance(s, Strategy)]
    split = [s for s in layouts if s.cp > 1]
    assert {s.cp for s in split} == {2, 4}
    for s in split:
        assert s.gpus == 8 and not s.problems()
        assert parse(s.label, micro_batches=s.micro_batches) == s
    plan = plan_section(facts, PlanRequest(gpus=8), H100, (), 0.8, "test", 1.0, 1.0)
    assert plan.considered >= len({s.label for s in split})
