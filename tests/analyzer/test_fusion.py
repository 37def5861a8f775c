"""The fusion engine: the fused-graph model (kernel groups, bytes after fusion), ranking,
seconds saved on a device, the report sections and the fused roofline view; and, marked slow,
the predicted kernel count against Inductor's on part of the zoo (bench/inductor_kernels.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxlens.analyzer.capture.training import capture_training
from fxlens.analyzer.core.codec import encode
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.fusion import kernels
from fxlens.analyzer.fusion.kernels import (
    FusionAnalysis,
    Policy,
    analyze_fusion,
    effective_kinds,
    fused_report,
    plan_kernels,
)
from fxlens.analyzer.fusion.types import FusionGraph
from fxlens.api import AnalysisOptions, analyze_loaded, capture
from fxlens.rules import load_rules
from fxlens.rules.fusion import FUSION_RULES, kinds_of
from tests.models import mlp, tiny_gpt
from tests.rules.test_fusion import Chain, LinearRelu

F32 = 4


def fusion_of(module: nn.Module, *inputs: torch.Tensor, bandwidth: float | None = None
              ) -> tuple[FusionAnalysis, Report]:
    registry = load_rules()
    graph = capture(module, inputs, registry)
    report = analyze(graph, registry, strict=True)
    return analyze_fusion(report, graph, kinds_of(list(graph.nodes), registry), FUSION_RULES,
                          registry.lookup, bandwidth), report


def test_pointwise_chain_is_one_kernel_reading_and_writing_once() -> None:
    n = 8 * 32 * F32
    fusion, _ = fusion_of(Chain().eval(), torch.randn(8, 32))
    section = encode(fusion.section)
    assert (section["kernels_unfused"], section["kernels_fused"]) == (3, 1)
    assert section["bytes_unfused"] == 3 * (n + n)
    assert section["bytes_fused"] == n + n


def test_gemm_stays_a_library_call_unless_epilogues_fuse() -> None:
    fusion, _ = fusion_of(LinearRelu().eval(), torch.randn(4, 32))
    assert encode(fusion.section)["kernels_fused"] == 2    # addmm, then relu·0.5 in one kernel
    assert encode(fusion.section)["kernels_fused_with_epilogues"] == 1


class Around(nn.Module):
    """relu and add both touch `a`, but the linear sits between them: no single kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(x)
        return a + self.fc(a)


def test_no_fusion_across_a_kernel_in_between() -> None:
    fusion, _ = fusion_of(Around().eval(), torch.randn(4, 16))
    assert encode(fusion.section)["kernels_fused"] == 3


def test_the_search_skip_keeps_the_kernels_of_the_full_search(monkeypatch) -> None:
    """The cycle check skips only nodes that reach no member of the other group
    (`_descendants`): on tiny_gpt's training step, where backward ops read forward tensors,
    both policies give the kernels of the search without the skip."""
    registry = load_rules()
    module, inputs = tiny_gpt.build()
    graph = capture_training(module, inputs, registry).graph
    report = analyze(graph, registry)
    fg = FusionGraph(graph, effective_kinds(report, kinds_of(list(graph.nodes), registry)))
    costs = {n.id: n for n in report.nodes}
    policies = (Policy(), Policy(gemm_epilogues=True))
    plans = [plan_kernels(fg, costs, policy) for policy in policies]
    monkeypatch.setattr(kernels, "_descendants", lambda users, calls: None)
    assert plans == [plan_kernels(fg, costs, policy) for policy in policies]
    assert len(plans[0].kernels) > len(plans[1].kernels) > 20


def test_no_kernel_spans_two_phases_of_a_training_step() -> None:
    """AOTAutograd compiles a step's forward and backward as separate graphs: the loss's last
    forward ops and its gradient's first backward ops, which read each other's tensors, never
    share a kernel."""
    registry = load_rules()
    module, inputs = tiny_gpt.build()
    graph = capture_training(module, inputs, registry).graph
    report = analyze(graph, registry)
    fg = FusionGraph(graph, effective_kinds(report, kinds_of(list(graph.nodes), registry)))
    for policy in (Policy(), Policy(gemm_epilogues=True)):
        plan = plan_kernels(fg, {n.id: n for n in report.nodes}, policy)
        phases = [{graph.nodes[i].phase for i in k.nodes} for k in plan.kernels]
        assert all(len(p) == 1 for p in phases)
        assert {"forward", "backward"} <= set().union(*phases)


@pytest.mark.parametrize("search", [False, True], ids=["descendant bitmasks", "search"])
def test_a_cycle_is_a_path_through_an_outside_kernel_only(search: bool) -> None:
    """Node 0 feeds 1 and 2, and 1 feeds 2. With 1 and 2 in one kernel, adding 0 to it
    leaves no kernel in between (1 reaches 2, but inside the kernel); with 1 alone, 0 → 1 → 2
    runs through kernel {1}. The same answers with and without the descendant bitmasks."""
    users = [[1, 2], [2], []]
    reach = None if search else kernels._descendants(users, [0, 1, 2])
    for grouped, cycle in ((True, False), (False, True)):
        groups = kernels._Groups()
        for node in range(3):
            groups.add(node, False, kernels._bits(users[node]))
        if grouped:
            groups.union(1, 2)
        assert kernels._creates_cycle(users, groups, 0, 2, reach) is cycle


def test_findings_ranked_by_saved_bytes_with_seconds_on_a_device() -> None:
    bandwidth = 1e9
    fusion, _ = fusion_of(LinearRelu().eval(), torch.randn(4, 32), bandwidth=bandwidth)
    saved = [f.saved_bytes for f in fusion.findings]
    assert saved == sorted(saved, reverse=True)
    assert fusion.findings[0].saved_s == pytest.approx(fusion.findings[0].saved_bytes / bandwidth)
    fusion, _ = fusion_of(LinearRelu().eval(), torch.randn(4, 32))
    assert fusion.findings[0].saved_s is None


def test_sections_on_inference_reports_and_the_fused_roofline() -> None:
    module, inputs = mlp.build()
    loaded = LoadedModel(module, inputs, "mlp", "tests/models/mlp.py")
    report = analyze_loaded(loaded, AnalysisOptions(strict=True, device="h100"))
    findings = report.to_dict()["findings"]
    assert findings and set(findings[0]) == {"code", "nodes", "modules", "saved_bytes",
                                             "saved_s", "message", "fix", "saved_flops"}
    assert findings[0]["saved_s"] is not None
    fusion = report.to_dict()["fusion"]
    assert fusion["by_module"][""]["kernels_fused"] == fusion["kernels_fused"]
    assert fusion["by_module"][""]["bytes_unfused"] == fusion["bytes_unfused"]
    fused = analyze_loaded(loaded, AnalysisOptions(strict=True, device="h100", fused=True))
    assert len(fused.to_dict()["roofline"]["nodes"]) == fusion["kernels_fused"]


def test_fused_report_keeps_flops_and_moves_fused_bytes() -> None:
    fusion, report = fusion_of(Chain().eval(), torch.randn(8, 32))
    fused = fused_report(report, fusion.plan)
    assert sum(n.flops for n in fused.nodes) == report.totals.flops
    assert sum(n.bytes_read + n.bytes_written for n in fused.nodes) == fusion.plan.bytes_fused


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "dict_io", "tiny_gpt"])
def test_predicted_kernels_within_20_percent_of_inductor(name: str) -> None:
    from bench.inductor_kernels import compare

    row = compare(name)
    assert row.inductor > 0 and row.ok, row
