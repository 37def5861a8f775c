"""The planner's shortcuts, against the long way: a layout's peak asked alone (`peak_bytes`)
equals the fullest of every stage's, the estimate over the first of each run of stages alike
(`distinct_stages`) equals the estimate over every stage, ``ckpt=auto`` settles on the layout
the whole estimate would, and identical blocks answer through one twin as each would alone.
On tests/models/tiny_gpt.py deepened to nine blocks (its second block repeated), activations
scaled so that in-flight micro-batches decide the peak, and the zoo's Mixtral likewise."""

from __future__ import annotations

import dataclasses

import pytest

from fxlens.analyzer.plan import estimate as estimate_module
from fxlens.analyzer.plan.auto_recompute import estimate_auto, resolve_auto
from fxlens.analyzer.plan.estimate import estimate
from fxlens.analyzer.plan.search import PlanRequest, candidates, plan_section
from fxlens.analyzer.plan.stage_memory import (
    distinct_stages,
    model_stages,
    peak_bytes,
    stage_memory,
)
from fxlens.analyzer.plan.strategy import Strategy, parse
from fxlens.analyzer.plan.structure import ModelFacts, Unit
from fxlens.analyzer.plan.unit_share import is_block, recomputed_bytes, recomputed_s
from tests.analyzer.test_plan import H100, hf_facts
from tests.analyzer.test_plan_auto_recompute import Facts, _heavier


def _renamed(unit: Unit, name: str) -> Unit:
    """`unit` as the block at module path `name` (its parts moved with it)."""
    def moved(path: str) -> str:
        inside = path == unit.name or path.startswith(unit.name + ".")
        return name + path[len(unit.name):] if inside else path
    return dataclasses.replace(unit, name=name, parts=tuple(
        dataclasses.replace(p, name=moved(p.name)) for p in unit.parts))


def _deep(facts: ModelFacts, blocks: int, first_saves: float = 1.0) -> ModelFacts:
    """`facts` with `blocks` blocks: the first saving `first_saves` of what it does, the
    second repeated."""
    pre, first, second, *post = facts.units
    stem = second.name.rsplit(".", 1)[0]
    clones = [_renamed(second, f"{stem}.{i}") for i in range(1, blocks)]
    light = dataclasses.replace(first, **{f: int(getattr(first, f) * first_saves) for f in (
        "saved_split_bytes", "saved_whole_bytes")})
    return dataclasses.replace(facts, units=(pre, light, *clones, *post), blocks=blocks)


@pytest.fixture(scope="module")
def deep(gpt: Facts) -> ModelFacts:
    return _deep(_heavier(gpt[1], 1000), 9)


@pytest.fixture(scope="module")
def light_first(gpt: Facts) -> ModelFacts:
    """`deep` with a first block that saves almost nothing: a later stage is the fullest."""
    return _deep(_heavier(gpt[1], 1000), 9, first_saves=0.01)


@pytest.fixture(scope="module")
def wide_input(deep: ModelFacts) -> ModelFacts:
    """`deep` with its sixth block taking an input four times as large: the stage before it
    sends more to the next than the stages alike before that."""
    units = list(deep.units)
    units[6] = dataclasses.replace(units[6], input_bytes=units[6].input_bytes * 4)
    return dataclasses.replace(deep, units=tuple(units))


def test_identical_blocks_answer_through_one_twin(deep: ModelFacts) -> None:
    blocks = [u for u in deep.units if is_block(u)]
    assert {deep.twin(u).name for u in blocks[1:]} == {blocks[1].name}
    assert deep.twin(blocks[0]) is blocks[0]
    odd = dataclasses.replace(blocks[4], parts=tuple(
        dataclasses.replace(p, saved_whole_bytes=p.saved_whole_bytes + 1) if i == 0 else p
        for i, p in enumerate(blocks[4].parts)))
    heavier = dataclasses.replace(blocks[6], states_split=dataclasses.replace(
        blocks[6].states_split, weights_bytes=blocks[6].states_split.weights_bytes + 2))
    other = dataclasses.replace(deep, units=tuple(
        odd if u is blocks[4] else heavier if u is blocks[6] else u for u in deep.units))
    assert other.twin(odd) is odd and other.twin(heavier) is heavier
    assert other.twin(blocks[5]).name == blocks[1].name


@pytest.mark.parametrize("patterns", [("attn",), ("mlp",), ("norm", "core_attn"), ("mlp.0",)])
def test_a_twins_recompute_is_each_blocks_own(deep: ModelFacts,
                                              patterns: tuple[str, ...]) -> None:
    s = dataclasses.replace(parse("dp=1,tp=2,sp,cp=2"), recompute=patterns)
    for unit in (u for u in deep.units if is_block(u)):
        fresh = dataclasses.replace(unit)        # no answers remembered
        assert recomputed_bytes(s, deep.twin(unit)) == recomputed_bytes(s, fresh) > 0
        assert recomputed_s(s, deep.twin(unit)) == recomputed_s(s, fresh) > 0


@pytest.mark.parametrize("text, m", [
    ("dp=1,pp=3", 8), ("dp=1,pp=4", 2), ("dp=2,pp=4,v=2", 8), ("dp=2,pp=3,ckpt", 8),
    ("dp=2,pp=4,zero=3", 8), ("dp=1,pp=3,ckpt=attn", 8), ("dp=1,tp=2,sp,pp=2,cp=2", 4),
    ("dp=2,pp=9", 16)])
@pytest.mark.parametrize("model", ["deep", "light_first"])
def test_the_peak_asked_alone_is_the_fullest_of_every_stage(
        model: str, text: str, m: int, request: pytest.FixtureRequest) -> None:
    facts = request.getfixturevalue(model)
    s = parse(text, micro_batches=m)
    every = [stage_memory(facts, s, H100, i).memory.peak_bytes
             for i in range(len(model_stages(facts, s)))]
    assert len(set(every)) > 1
    assert peak_bytes(facts, s, H100) == max(every) == estimate(facts, s, H100).memory.peak_bytes


def test_a_later_stage_can_be_the_fullest(light_first: ModelFacts) -> None:
    """The case `peak_bytes`'s shortcut has to get right: the fullest stage is the first of a
    run of stages alike, not the first stage."""
    s = parse("dp=2,pp=9", micro_batches=16)
    every = [stage_memory(light_first, s, H100, i).memory.peak_bytes
             for i in range(len(model_stages(light_first, s)))]
    assert every.index(max(every)) == 1 and every[1] > every[2]
    assert peak_bytes(light_first, s, H100) == every[1]


def test_the_search_drops_and_times_as_the_whole_estimate_would(deep: ModelFacts) -> None:
    """Every layout of a 4-GPU search on a device that only some fit: the memory-only answer
    (the strategy ckpt=auto settles on, its peak) is the whole estimate's, and the plan keeps
    exactly the layouts whose whole estimate fits."""
    request = PlanRequest(gpus=4, global_batch=16)
    items = [c for c in candidates(deep, request, 8) if isinstance(c, Strategy)]
    full = sorted(estimate(deep, s, H100).memory.peak_bytes for s in items if s.checkpoint)
    device = H100.with_usable(full[len(full) // 2])
    whole = []
    for item in items:
        resolved, peak = resolve_auto(deep, item, device)
        layout = estimate_auto(deep, item, device)
        assert (resolved.label, peak) == (layout.strategy, layout.memory.peak_bytes)
        whole.append(layout)
    plan = plan_section(deep, request, device, (), 0.8, "test", 1.0, 1.0)
    fitting = {x.strategy for x in whole if x.fits}
    assert 0 < len(fitting) < len({x.strategy for x in whole})
    assert {x.strategy for x in plan.layouts} <= fitting
    assert plan.dropped_by_reason["does not fit"] == len({x.strategy for x in whole
                                                          if not x.fits})
    needed = {x.strategy: x.memory.peak_bytes for x in whole}
    assert all(d.needed_bytes == needed[d.strategy] for d in plan.dropped
               if d.reason == "does not fit")


LAYOUTS = [("dp=1,pp=3", 8), ("dp=2,pp=4,v=2", 8), ("dp=2,pp=9", 16), ("dp=2,pp=3,ckpt", 8),
           ("dp=1,tp=2,sp,pp=9,cp=2,zero=1", 4), ("dp=2,pp=3,layout=Et|tt|tt|tt|t|tL", 8)]


def _every_stage(facts: ModelFacts, s: Strategy) -> list[tuple[int, list[Unit]]]:
    return list(enumerate(model_stages(facts, s)))


def _both_ways(facts: ModelFacts, text: str, m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    s = parse(text, micro_batches=m)
    if s.pp == 9:       # a block a stage: stages alike in the middle
        assert len(distinct_stages(facts, s)) < s.pp
    shortcut = estimate(facts, s, H100)
    with monkeypatch.context() as patch:
        patch.setattr(estimate_module, "distinct_stages", _every_stage)
        assert estimate(facts, s, H100) == shortcut


@pytest.mark.parametrize("model", ["deep", "light_first", "wide_input"])
@pytest.mark.parametrize("text, m", LAYOUTS)
def test_the_estimate_over_distinct_stages_is_the_estimate_over_every_stage(
        model: str, text: str, m: int, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _both_ways(request.getfixturevalue(model), text, m, monkeypatch)


@pytest.mark.slow
def test_an_moe_estimate_over_distinct_stages_is_the_estimate_over_every_stage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Mixtral (4 experts) deepened to nine blocks: the all-to-alls a stage exposes under
    ``a2a-overlap`` grow with the micro-batches it keeps in flight."""
    facts = _deep(hf_facts("mixtral"), 9)
    for text, m in [*LAYOUTS, ("dp=2,pp=9,ep=2,a2a-overlap", 16),
                    ("dp=4,pp=3,v=3,ep=4,a2a-overlap", 8), ("dp=2,tp=2,pp=9,ep=4,etp=1", 8)]:
        _both_ways(facts, text, m, monkeypatch)
