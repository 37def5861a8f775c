"""``ckpt=auto`` in the planner against brute force on tests/models/tiny_gpt.py (2 blocks, AMP
bf16): its frontier equals the Pareto set of every subset of writable module patterns, and the
layout it settles on is the fastest of every subset's layouts that fit, at every budget."""

from __future__ import annotations

import dataclasses
from itertools import combinations

import pytest

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.plan.auto_recompute import estimate_auto, frontier
from fxlens.analyzer.plan.estimate import estimate
from fxlens.analyzer.plan.recompute import recomputed
from fxlens.analyzer.plan.search import PlanRequest, candidates, plan_section
from fxlens.analyzer.plan.strategy import Strategy, parse
from fxlens.analyzer.plan.structure import ModelFacts
from fxlens.analyzer.plan.unit_share import is_block, phase_s, saved_on_gpu
from tests.analyzer.test_plan import H100

Facts = tuple[Report, ModelFacts]
# every module of a tiny_gpt block as a pattern meaning it alone (with its children), and the
# attention module's own ops alone
PATTERNS = ("ln1", "[a]ttn", "attn.qkv", "attn.proj", "ln2", "[m]lp", "mlp.0", "mlp.1",
            "mlp.2", "core_attn")


def _subsets() -> list[tuple[str, ...]]:
    return [c for n in range(len(PATTERNS) + 1) for c in combinations(PATTERNS, n)]


def _cost(facts: ModelFacts, s: Strategy, patterns: tuple[str, ...]) -> tuple[float, float]:
    """Seconds and bytes the patterns recompute and free, each module once, over the blocks."""
    seq_div = s.tp if s.sp else 1
    chosen = [p for u in facts.units if is_block(u) for p in recomputed(u.name, u.parts, patterns)]
    return (sum(phase_s(s, p, "forward") for p in chosen),
            sum(saved_on_gpu(p, s.tp, seq_div) for p in chosen) / s.cp)


def test_the_patterns_name_every_module_of_a_block(gpt: Facts) -> None:
    _, facts = gpt
    block = next(u for u in facts.units if is_block(u))
    every = {p.name for p in block.parts if p.name != block.name}
    assert {p.name for p in recomputed(block.name, block.parts, PATTERNS)} == every
    assert [p.name for p in recomputed(block.name, block.parts, ("[m]lp",))] == [
        f"{block.name}.mlp.{i}" for i in range(3)]


@pytest.mark.parametrize("text", ["dp=2", "dp=1,tp=2,sp", "dp=1,cp=2"])
def test_frontier_equals_brute_force(gpt: Facts, text: str) -> None:
    _, facts = gpt
    s = parse(text)
    costs = sorted({(round(t, 15), round(b)) for t, b in
                    (_cost(facts, s, c) for c in _subsets())})
    pareto: list[tuple[float, int]] = []
    for t, b in costs:
        if not pareto or b > pareto[-1][1]:
            pareto.append((t, b))
    found = frontier(facts, s)
    assert [(round(c.seconds, 15), round(c.freed)) for c in found] == pareto
    for choice in found:    # each point's patterns cost what the point says
        t, b = _cost(facts, s, choice.patterns)
        assert t == pytest.approx(choice.seconds) and b == pytest.approx(choice.freed)


def test_fits_as_it_is_recomputes_nothing(gpt: Facts) -> None:
    _, facts = gpt
    layout = estimate_auto(facts, parse("dp=2,ckpt=auto"), H100)
    assert layout.fits and layout.recompute_auto and layout.time.recompute_s == 0
    assert layout.strategy == "dp=2"


def _heavier(facts: ModelFacts, k: int) -> ModelFacts:
    """`facts` with every activation `k` times larger (a batch k times the captured one, as far
    as memory goes): tiny_gpt's own peak is its optimizer step's."""
    def scaled(x):  # noqa: ANN001, ANN202 - a Unit or a ModulePart
        more = {f: getattr(x, f) * k for f in ("saved_split_bytes", "saved_whole_bytes",
                                              "input_bytes") if hasattr(x, f)}
        if hasattr(x, "parts"):
            more["parts"] = tuple(scaled(p) for p in x.parts)
        return dataclasses.replace(x, **more)
    moments = tuple(dataclasses.replace(m, saved_bytes=m.saved_bytes * k,
                                        working_bytes=m.working_bytes * k)
                    for m in facts.moments)
    return dataclasses.replace(facts, units=tuple(scaled(u) for u in facts.units),
                               moments=moments)


def test_the_fastest_layout_that_fits_at_every_budget(gpt: Facts) -> None:
    """Budgets from the full-recompute peak to the plain one: ckpt=auto's step equals the
    fastest fitting layout over every subset of patterns (and full recompute), and its peak
    never rises as the budget tightens."""
    facts = _heavier(gpt[1], 1000)
    base = parse("dp=2,zero=1")
    plain = estimate(facts, base, H100).memory.peak_bytes
    full = estimate(facts, dataclasses.replace(base, checkpoint=True), H100).memory.peak_bytes
    layouts = [estimate(facts, dataclasses.replace(base, recompute=c), H100) for c in _subsets()]
    layouts.append(estimate(facts, dataclasses.replace(base, checkpoint=True), H100))
    assert min(x.memory.peak_bytes for x in layouts) < plain
    peaks = []
    for i in range(10):
        budget = full + (plain - 1 - full) * i // 9
        device = H100.with_usable(budget)
        chosen = estimate_auto(facts, dataclasses.replace(base, checkpoint_auto=True), device)
        fitting = [x for x in layouts if x.memory.peak_bytes <= budget]
        assert chosen.fits and chosen.recompute_auto
        assert chosen.time.step_s == pytest.approx(min(x.time.step_s for x in fitting))
        assert chosen.time.recompute_s > 0
        peaks.append(chosen.memory.peak_bytes)
    assert peaks == sorted(peaks)       # tighter budget (i smaller), never a higher peak


def test_nothing_fits_gives_the_least_peak(gpt: Facts) -> None:
    _, facts = gpt
    device = H100.with_usable(1)
    chosen = estimate_auto(facts, parse("dp=2,ckpt=auto"), device)
    full = estimate(facts, parse("dp=2,ckpt"), device)
    assert not chosen.fits and chosen.memory.peak_bytes <= full.memory.peak_bytes


def test_the_search_offers_selective_recompute_where_only_it_fits(gpt: Facts) -> None:
    """On a device between the full-recompute and plain peaks of every 2-GPU layout, the
    search's best layouts recompute some modules, not every block."""
    facts = _heavier(gpt[1], 1000)
    plain = [estimate(facts, dataclasses.replace(s, checkpoint_auto=False), H100)
             for s in candidates(facts, PlanRequest(gpus=2), 8)
             if isinstance(s, Strategy) and s.checkpoint_auto]
    device = H100.with_usable(min(x.memory.peak_bytes for x in plain) - 1)
    plan = plan_section(facts, PlanRequest(gpus=2), device, (), 0.8, "test", 1.0, 1.0)
    assert plan.layouts and all(x.fits for x in plan.layouts)
    assert any(x.recompute_auto and "ckpt=" in x.strategy and x.time.recompute_s > 0
               for x in plan.layouts)
    assert len({x.strategy for x in plan.layouts}) == len(plan.layouts)


@pytest.mark.parametrize("text, says", [
    ("dp=2,ckpt=auto,ckpt", "ckpt=auto chooses what to recompute: give it alone"),
    ("dp=2,ckpt=norm,ckpt=auto", "ckpt=auto chooses what to recompute: give it alone"),
    ("dp=2,ckpt=auto,ckpt=auto", "ckpt is given twice"),
])
def test_auto_is_given_alone(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse(text)


def test_auto_reads_back() -> None:
    s = parse("dp=4,tp=2,sp,ckpt=auto")
    assert s.checkpoint_auto and parse(s.label) == s
