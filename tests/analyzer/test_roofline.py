"""The roofline section (fxlens/analyzer/roofline.py) with hand-derived times on a toy device
of round figures, then throughput, MFU and the training step on the zoo."""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import pytest

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.core.codec import encode
from fxlens.analyzer.core.graph import Graph
from fxlens.analyzer.core.report import Report, report_from_dict
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.time.roofline import dtype_key, roofline_section, throughput_basis
from fxlens.api import AnalysisOptions, analyze_target
from fxlens.reports.views.time import roofline_summary
from fxlens.rules import load_rules
from fxlens.rules.hardware import DTYPE_KEYS, DeviceSpec, device
from tests.helpers import T, op_call
from tests.models import tiny_gpt

PEAKS = {"fp32": 1e12, "tf32": 4e12, "bf16": 8e12, "fp16": 8e12, "fp8": 0.0, "int8": 16e12}
TOY = DeviceSpec("toy", 2**30, "round figures for tests", PEAKS, 1e11,
                 compute_efficiency=0.5, bandwidth_efficiency=0.5, launch_s=1e-5,
                 host_free_s=0.0, host_module_s=0.0)   # one op: its wait is its launch
COMPUTE, BANDWIDTH, LAUNCH = 0.5e12, 0.5e11, 1e-5      # achievable fp32 FLOP/s, B/s; s


def single_op(target: str, *args: Any) -> tuple[Report, Graph]:
    call = op_call(target, *args)
    graph = call._graph
    return analyze(graph, load_rules(), strict=True), graph


def section(target: str, *args: Any, tf32: bool = False) -> dict[str, Any]:
    report, graph = single_op(target, *args)
    return encode(roofline_section(report, graph, TOY, tf32=tf32))


def test_a_large_gemm_is_compute_bound() -> None:
    n = 1024
    node = section("aten.mm.default", T(n, n), T(n, n))["nodes"][0]
    flops, moved = 2 * n**3, 3 * n * n * 4
    assert node["bound"] == "compute"
    assert node["time_s"] == pytest.approx(flops / COMPUTE + LAUNCH)
    assert node["intensity"] == pytest.approx(flops / moved)
    assert flops / COMPUTE > moved / BANDWIDTH


def test_tf32_only_when_allowed_and_bf16_at_its_own_peak() -> None:
    n = 1024
    flops = 2 * n**3
    tf32 = section("aten.mm.default", T(n, n), T(n, n), tf32=True)
    assert tf32["nodes"][0]["dtype"] == "tf32"
    assert tf32["nodes"][0]["time_s"] == pytest.approx(flops / (0.5 * 4e12) + LAUNCH)
    assert tf32["settings"]["tf32"] is True
    bf16 = section("aten.mm.default", T(n, n, dtype="bfloat16"), T(n, n, dtype="bfloat16"))
    assert bf16["nodes"][0]["time_s"] == pytest.approx(flops / (0.5 * 8e12) + LAUNCH)
    # the rule in words names the dtype the FLOPs ran at; float32 only where some op is
    assert "most FLOPs at bf16" in bf16["settings"]["dtype_rule"]
    assert "float32" not in bf16["settings"]["dtype_rule"]
    assert "float32 at TF32" in tf32["settings"]["dtype_rule"]
    fp32 = section("aten.mm.default", T(n, n), T(n, n))["settings"]["dtype_rule"]
    assert "float32 at FP32 (--tf32 allows TF32)" in fp32


def test_a_misaligned_gemm_runs_at_its_kernel_class_share() -> None:
    """A bf16 product whose output rows are 2 × 1023 bytes is rated at the device's
    ``gemm-misaligned`` share of the peak, the aligned one at its compute efficiency."""
    toy = dataclasses.replace(TOY, kernel_efficiency={"gemm-misaligned": 0.1})
    n = 1024
    for cols, share in ((n, 0.5), (n - 1, 0.1)):
        report, graph = single_op("aten.mm.default", T(n, n, dtype="bfloat16"),
                                  T(n, cols, dtype="bfloat16"))
        node = encode(roofline_section(report, graph, toy))["nodes"][0]
        assert node["time_s"] == pytest.approx(2 * n * n * cols / (share * 8e12) + LAUNCH)


def test_a_recurrence_adds_its_serial_steps_per_wave_of_programs() -> None:
    """A gated delta rule over 128 tokens (two 64-token chunks) of 2 sequences × 4 value heads
    × 64 value channels: 16 programs of the state kernel, three waves over 6 multiprocessors,
    each wave two dependent steps on top of the roofline; none on a device whose step is
    unmeasured."""
    import fxlens.analyzer.capture.hf_gdn  # noqa: F401  (registers fxlens_gdn::chunk)

    qk, v = T(2, 128, 2, 16, dtype="bfloat16"), T(2, 128, 4, 64, dtype="bfloat16")
    report, graph = single_op("fxlens_gdn.chunk.default", qk, qk, v, T(2, 128, 4),
                              T(2, 128, 4, dtype="bfloat16"), 64, True)
    flat = encode(roofline_section(report, graph, TOY))["nodes"][0]["time_s"]
    stepped = dataclasses.replace(TOY, recurrence_step_s=1e-3, multiprocessors=6)
    section = roofline_section(report, graph, stepped)
    node = encode(section)["nodes"][0]
    assert node["time_s"] == pytest.approx(flat + 2 * 3 * 1e-3)
    # the steps outweigh the work: latency-bound, a line of its own in the summary
    assert node["bound"] == "latency"
    assert section.totals.latency_bound_s == pytest.approx(node["time_s"])
    summary = roofline_summary(section)
    assert any(row[0].text.strip() == "latency-bound" for row in summary.rows)
    assert encode(roofline_section(report, graph, TOY))["totals"].get("latency_bound_s") is None
    assert not any("latency" in row[0].text for row in roofline_summary(
        roofline_section(report, graph, TOY)).rows)
    # a report's JSON keeps the recurrence (and only where there is one)
    again = report_from_dict(json.loads(report.to_json()))
    assert again.nodes[0].recurrence == report.nodes[0].recurrence is not None
    assert encode(roofline_section(again, graph, stepped))["nodes"][0] == node
    assert all("recurrence" not in n for n in json.loads(single_op(
        "aten.add.Tensor", T(4), T(4))[0].to_json())["nodes"])


def test_an_elementwise_op_is_memory_bound() -> None:
    n = 2**20
    node = section("aten.add.Tensor", T(n), T(n))["nodes"][0]
    moved = 3 * n * 4                                  # two inputs read, one output written
    assert node["bound"] == "memory"
    assert node["time_s"] == pytest.approx(moved / BANDWIDTH + LAUNCH)
    assert node["intensity"] == pytest.approx(n / moved)


def test_a_tiny_op_is_launch_bound_and_a_view_is_free() -> None:
    assert section("aten.add.Tensor", T(4), T(4))["nodes"][0]["bound"] == "launch"
    view = section("aten.t.default", T(64, 32))
    assert view["nodes"][0] == {"id": 1, "time_s": 0.0, "bound": "free", "intensity": 0.0,
                                "dtype": "fp32"}
    assert view["totals"]["time_s"] == 0.0 and view["totals"]["launch_s"] == 0.0


def test_a_launch_bound_model_is_slower_behind_a_grace_host() -> None:
    """tiny_gpt's kernels are microseconds of work: its eager time is the host's, which on a
    GB200 (Grace) is 37.08 / 13.48 of a B200's (x86) per call."""
    report, graph = gpt()
    x86, grace = (encode(roofline_section(report, graph, device(name)))["totals"]["time_s"]
                  for name in ("b200", "gb200"))
    assert 2.5 < grace / x86 <= 37.08 / 13.48 + 1e-9


def test_missing_fp8_path_falls_back_to_bf16() -> None:
    assert TOY.peak("fp8") == (8e12, "bf16")
    assert dtype_key("float8_e4m3fn") == "fp8" and dtype_key("int8") == "int8"
    assert dtype_key("float32") == "fp32" and dtype_key("float32", tf32=True) == "tf32"
    assert dtype_key("int64") == "fp32" and dtype_key("float64") == "fp32"


@functools.cache
def gpt() -> tuple[Report, Graph]:
    model, inputs = tiny_gpt.build()
    registry = load_rules()
    graph = capture(model, inputs, registry)
    return analyze(graph, registry, strict=True), graph


def test_totals_modules_and_hotspots_add_up_on_tiny_gpt() -> None:
    report, graph = gpt()
    result = encode(roofline_section(report, graph, TOY))
    times = [n["time_s"] for n in result["nodes"]]
    assert len(times) == len(report.nodes)
    total = result["totals"]["time_s"]
    assert total == pytest.approx(sum(times))
    assert total == pytest.approx(result["totals"]["compute_bound_s"]
                                  + result["totals"]["memory_bound_s"]
                                  + result["totals"]["launch_bound_s"])
    root = next(m for m in result["modules"] if m["path"] == "")
    assert root["time_s"] == pytest.approx(total) and root["share"] == pytest.approx(1.0)
    blocks = [m for m in result["modules"] if m["path"] in ("blocks.0", "blocks.1")]
    # Identical blocks, the same work; on the GPU timeline the first may wait a little longer
    # for the host (less of the host's work was hidden behind earlier kernels).
    assert blocks[0]["time_s"] == pytest.approx(blocks[1]["time_s"], rel=0.01)
    cpu = encode(roofline_section(report, graph, dataclasses.replace(TOY, kind="cpu")))
    cpu_blocks = [m["time_s"] for m in cpu["modules"] if m["path"] in ("blocks.0", "blocks.1")]
    assert cpu_blocks[0] == pytest.approx(cpu_blocks[1])
    hot = result["hotspots"]
    assert hot["by_flops"][0]["target"] == "aten.linear.default"
    assert sum(r["time_share"] for r in hot["by_time"]) <= 1.0 + 1e-9
    assert [r["time_s"] for r in hot["by_time"]] == sorted(
        (r["time_s"] for r in hot["by_time"]), reverse=True)


def test_tokens_per_second_and_mfu_on_tiny_gpt() -> None:
    report, graph = gpt()
    result = encode(roofline_section(report, graph, TOY))
    time_s = result["totals"]["time_s"]
    rate = result["throughput"]
    assert throughput_basis(graph).tokens == 2 * 16           # (B, T) token ids
    assert rate["batch"] == 2 and rate["tokens"] == 32
    assert rate["tokens_per_s"] == pytest.approx(32 / time_s)
    assert rate["samples_per_s"] == pytest.approx(2 / time_s)
    assert result["mfu_dtype"] == "fp32"
    assert result["mfu"] == pytest.approx(report.totals.flops / time_s / PEAKS["fp32"])
    assert 0 < result["mfu"] <= TOY.compute_efficiency
    assert rate["tokens_per_s_bound"] == pytest.approx(PEAKS["fp32"] / (report.totals.flops / 32))


def test_an_image_model_reports_samples_not_tokens() -> None:
    report, graph = single_op("aten.relu.default", T(8, 3, 4, 4))
    rate = encode(roofline_section(report, graph, TOY))["throughput"]
    assert rate["batch"] == 8 and rate["tokens"] == 0 and "tokens_per_s" not in rate


def test_training_step_time_adds_forward_backward_and_optimizer() -> None:
    report = analyze_target("tests/models/mlp.py", AnalysisOptions(train=True, device="h100"))
    totals = report.to_dict()["roofline"]["totals"]
    phases = totals["by_phase"]
    assert set(phases) == {"forward", "backward"} and phases["backward"] > phases["forward"]
    assert totals["optimizer_s"] > 0
    assert totals["step_time_s"] == pytest.approx(
        phases["forward"] + phases["backward"] + totals["optimizer_s"])
    rate = report.to_dict()["roofline"]["throughput"]
    assert rate["samples_per_s"] == pytest.approx(4 / totals["step_time_s"])


def test_inference_has_no_step_time_and_no_device_means_no_section() -> None:
    report = analyze_target("tests/models/mlp.py", AnalysisOptions(device="a100"))
    assert "step_time_s" not in report.to_dict()["roofline"]["totals"]
    assert report.to_dict()["roofline"]["device"]["name"] == "a100-80gb"
    assert "roofline" not in analyze_target("tests/models/mlp.py").to_dict()


def test_every_device_gives_positive_times() -> None:
    report, graph = gpt()
    for name in ("h100", "t4", "mi300x", "cpu"):
        result = encode(roofline_section(report, graph, device(name)))
        assert result["totals"]["time_s"] > 0
        assert set(result["device"]["peak_flops"]) == set(DTYPE_KEYS)
