"""The training step recorded under torch.autocast (fxlens/analyzer/capture/autocast.py).

The dtypes expected are torch.autocast's (CUDA's lists unless the analysis targets a CPU):
linears in bf16, layer_norm in fp32, a bf16 output added to an fp32 tensor promoted to fp32,
every parameter's gradient in the parameter's fp32. The same models recorded as amp-bf16 (every
weight cast to bf16) stay bf16 throughout.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from fxlens.analyzer.capture.hf import load_preset
from fxlens.analyzer.capture.training import capture_training
from fxlens.analyzer.capture.types import Autocast
from fxlens.analyzer.core.graph import Graph, Node
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Training
from fxlens.api import AnalysisOptions, analyze_loaded
from fxlens.rules import load_rules
from fxlens.rules.autocast import cpu_autocast, cuda_autocast
from fxlens.rules.training import Precision

C = 16


class Residual(nn.Module):
    """x + fc(ln(x)): a pre-norm residual block."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(C)
        self.fc = nn.Linear(C, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.ln(x))


class NormAfterLinear(nn.Module):
    """ln(fc(x)): layer_norm fed a bf16 tensor, where CPU's and CUDA's lists differ."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(C, C)
        self.ln = nn.LayerNorm(C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(self.fc(x))


def record(module: nn.Module, autocast: Autocast | None) -> Graph:
    dtype = "float32" if autocast is not None else "bfloat16"   # autocast-bf16 / amp-bf16
    return capture_training(module, (torch.randn(4, C),), load_rules(), dtype,
                            autocast=autocast).graph


def forward_dtypes(graph: Graph, packet: str) -> list[str]:
    return [n.outputs[0].dtype for n in graph.calls()
            if n.phase == "forward" and n.packet == packet]


def the_add(graph: Graph) -> Node:
    (node,) = [n for n in graph.calls() if n.phase == "forward" and n.packet == "aten.add"]
    return node


def gradient_dtypes(graph: Graph) -> set[str]:
    specs = [graph.spec(ref) for ref, role in graph.roles.items() if role == "gradient"]
    return {spec.dtype for spec in specs if spec is not None}


def test_autocast_casts_the_linear_and_keeps_the_residual_stream_fp32() -> None:
    graph = record(Residual(), cuda_autocast("bfloat16"))
    assert forward_dtypes(graph, "aten.addmm") == ["bfloat16"]
    assert forward_dtypes(graph, "aten.native_layer_norm") == ["float32"]
    assert the_add(graph).outputs[0].dtype == "float32"       # fp32 x + bf16 fc(…)
    assert gradient_dtypes(graph) == {"float32"}
    assert len([r for r, role in graph.roles.items() if role == "gradient"]) == 4
    casts = {phase: sorted(n.outputs[0].dtype for n in graph.calls()
                           if n.packet == "aten._to_copy" and n.phase == phase)
             for phase in ("forward", "backward")}
    assert casts["forward"] == ["bfloat16"] * 3     # the linear's input, weight and bias
    # their gradients back to fp32; the add's fp32 gradient down to fc's bf16 output
    assert casts["backward"] == ["bfloat16"] + ["float32"] * 3


def test_amp_records_everything_in_bf16() -> None:
    graph = record(Residual(), None)
    assert forward_dtypes(graph, "aten.addmm") == ["bfloat16"]
    assert forward_dtypes(graph, "aten.native_layer_norm") == ["bfloat16"]
    assert the_add(graph).outputs[0].dtype == "bfloat16"
    assert gradient_dtypes(graph) == {"bfloat16"}
    assert not [n for n in graph.calls() if n.packet == "aten._to_copy"]


def test_layer_norm_of_a_bf16_tensor_follows_cuda_unless_the_target_is_a_cpu() -> None:
    cuda = record(NormAfterLinear(), cuda_autocast("bfloat16"))
    cpu = record(NormAfterLinear(), cpu_autocast("bfloat16"))
    assert forward_dtypes(cuda, "aten.native_layer_norm") == ["float32"]
    assert forward_dtypes(cpu, "aten.native_layer_norm") == ["bfloat16"]
    assert gradient_dtypes(cuda) == gradient_dtypes(cpu) == {"float32"}


def test_autocast_fp16_records_in_half() -> None:
    graph = record(Residual(), cuda_autocast("float16"))
    assert forward_dtypes(graph, "aten.addmm") == ["float16"]
    assert gradient_dtypes(graph) == {"float32"}


def test_the_cuda_casts_are_gone_after_the_recording() -> None:
    record(NormAfterLinear(), cuda_autocast("bfloat16"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = F.layer_norm(torch.randn(2, C, dtype=torch.bfloat16), (C,))
    assert out.dtype == torch.bfloat16                          # CPU autocast's own again


def analysed(module: nn.Module, device: str | None = None) -> Report:
    loaded = LoadedModel(module, (torch.randn(4, C),), "norm_after_linear", "test")
    return analyze_loaded(loaded, AnalysisOptions(train=True, precision="autocast-bf16",
                                                  optimizer="adam", fusion=False,
                                                  device=device, strict=True))


def test_the_pipeline_records_cuda_lists_by_default_and_cpu_lists_for_a_cpu() -> None:
    gpu, cpu = analysed(NormAfterLinear()), analysed(NormAfterLinear(), "cpu")
    assert any("CUDA autocast" in note for note in gpu.model.capture_notes)
    assert any("CPU autocast" in note for note in cpu.model.capture_notes)


def test_the_gradients_recorded_are_the_policys() -> None:
    """The step's gradients (liveness) and the policy's (the states) agree: fp32."""
    report = analysed(Residual())
    training = report.require(Training)
    params = sum(p.numel() for p in Residual().parameters())
    assert training.states.grad_bytes == 4 * params
    assert training.states.master_bytes == 0
    assert training.states.weights_bytes == 4 * params
    assert report.to_dict()["memory"]["peak_by_category"]["gradient"] == 4 * params


GPT2 = {"n_layer": "2", "n_embd": "64", "n_head": "4", "vocab_size": "512",
        "n_positions": "128"}


@functools.cache
def gpt2_step(precision: str) -> Report:
    loaded = load_preset("gpt2", GPT2, 16, 128, dtype="float32")   # activations dominate
    return analyze_loaded(loaded, AnalysisOptions(train=True, precision=precision,
                                                  optimizer="adamw", fusion=False,
                                                  strict=True))


def test_gpt2_under_autocast_is_fully_costed_and_peaks_above_amp() -> None:
    autocast, amp = gpt2_step("autocast-bf16"), gpt2_step("amp-bf16")
    coverage = autocast.coverage
    assert not coverage.unsupported and not coverage.failed
    assert coverage.costed > amp.coverage.costed          # the casts and their backward
    ours, theirs = autocast.require(Training), amp.require(Training)
    assert ours.precision == Precision.AUTOCAST_BF16.value
    assert ours.peak_breakdown.fwd_bwd_peak_bytes > theirs.peak_breakdown.fwd_bwd_peak_bytes
    assert ours.step_peak_bytes > theirs.step_peak_bytes
    assert ours.first_step_peak_bytes > theirs.first_step_peak_bytes
