"""`bench/moe_layer.py`: Megatron-LM's MoE layer timings against the plan of the same layer —
the cases name proxies and dispatchers that exist, the proxies have the test's shapes, and a
pass's prediction is its compute plus its half of the all-to-alls."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fxlens.analyzer.plan.strategy import DISPATCHERS

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import moe_layer  # noqa: E402
from plan_runs import megatron_moe_layer as proxies  # noqa: E402

CASES = json.loads(moe_layer.CASES.read_text())["cases"]


def test_every_case_names_a_proxy_a_dispatcher_and_a_precision() -> None:
    assert len(CASES) == 12
    for case in CASES:
        assert callable(getattr(proxies, case["proxy"]))
        assert case["dispatch"] in DISPATCHERS and case["precision"] in ("bf16", "fp8")
        assert case["forward_ms"] > 0 and case["backward_ms"] > 0
        argv = moe_layer.command(case, Path("out.json"), "fused")
        assert argv[argv.index("--strategy") + 1] == f"dp=8,ep=8,dispatch={case['dispatch']}"
        assert "--fused" in argv and argv[argv.index("--optimizer") + 1] == "sgd"


@pytest.mark.parametrize("entry, hidden, ffn, experts, shared", [
    ("mixtral", 4096, 14336, 8, 0), ("deepseek", 7168, 2048, 32, 2048)])
def test_the_proxies_have_the_tests_shapes_without_weights(entry: str, hidden: int, ffn: int,
                                                           experts: int, shared: int) -> None:
    model, (x,) = getattr(proxies, entry)()
    layer = model.layers[0]
    assert tuple(layer.experts.fc1.shape) == (experts, hidden, ffn)     # no gated unit
    assert tuple(layer.experts.fc2.shape) == (experts, ffn, hidden)
    assert tuple(layer.router.weight.shape) == (experts, hidden)
    assert (layer.shared_experts is not None) == bool(shared)
    assert tuple(x.shape) == (4096, 1, hidden) and x.device.type == "meta"
    assert all(p.device.type == "meta" for p in model.parameters())


def test_a_pass_is_its_compute_and_half_the_all_to_alls() -> None:
    layout = {"time": {"compute_s": 10.0, "forward_s": 4.0, "recompute_s": 0.0},
              "collectives": [{"kind": "all-to-all", "time_s": 2.0},
                              {"kind": "all-reduce", "time_s": 5.0}],
              "memory": {"peak_bytes": 7}}
    got = moe_layer.predicted(layout)
    assert got == {"forward_s": 5.0, "backward_s": 7.0, "all_to_all_s": 2.0, "peak_bytes": 7}
