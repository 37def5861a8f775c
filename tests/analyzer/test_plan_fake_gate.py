"""``routing=blocks``: a benchmark's fake gate (NeMo Automodel's ``FakeBalancedGate``) has no
weights and runs no GEMM, so a layout with it leaves the router's work out of every block."""

from __future__ import annotations

import pytest

from fxlens.analyzer.plan.estimate import estimate
from fxlens.analyzer.plan.strategy import parse
from fxlens.analyzer.plan.unit_share import is_block, phase_s
from fxlens.rules.hardware import device
from tests.analyzer.test_plan import hf_facts

H100 = device("h100")


@pytest.mark.parametrize("name", ["mixtral", "deepseek_v3"])
def test_a_fake_gate_leaves_the_routers_work_out(name: str) -> None:
    facts = hf_facts(name)
    blocks = [u for u in facts.units if is_block(u)]
    routed = [u for u in blocks if u.router_s != (0.0, 0.0)]
    assert routed and all(f > 0 and b > 0 for f, b in (u.router_s for u in routed))
    real, fake = parse("dp=2,ep=2"), parse("dp=2,ep=2,routing=blocks")
    for unit in routed:
        for i, phase in enumerate(("forward", "backward")):
            assert phase_s(fake, unit, phase) == pytest.approx(
                phase_s(real, unit, phase) - unit.router_s[i])
    # under sequence parallelism a router runs on its GPU's share of the tokens
    real_sp, fake_sp = parse("dp=1,tp=2,sp,ep=2"), parse("dp=1,tp=2,sp,ep=2,routing=blocks")
    unit = routed[0]
    assert phase_s(fake_sp, unit, "forward") == pytest.approx(
        phase_s(real_sp, unit, "forward") - unit.router_s[0] / 2)
    gained = estimate(facts, real, H100).time.compute_s - estimate(facts, fake, H100).time.compute_s
    assert gained == pytest.approx(sum(sum(u.router_s) for u in routed), rel=1e-6)
