"""Fusion pattern rules on small models made to contain exactly one pattern, and on models
that must not trigger it. Expected saved bytes are derived by hand: Σ (bytes written + bytes
read) of the intermediates a fused kernel no longer materialises (fp32: 4 B per element)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.fusion.kernels import Finding, analyze_fusion
from fxlens.api import capture
from fxlens.rules import load_rules
from fxlens.rules.fusion import FUSION_RULES, kinds_of

F32 = 4


def findings(module: nn.Module, *inputs: torch.Tensor) -> list[Finding]:
    registry = load_rules()
    graph = capture(module, inputs, registry)
    report = analyze(graph, registry, strict=True)
    return list(analyze_fusion(report, graph, kinds_of(list(graph.nodes), registry),
                               FUSION_RULES, registry.lookup).findings)


def codes(found: list[Finding]) -> list[str]:
    return [f.code for f in found]


class Chain(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * 2 + 1)          # mul → add → tanh: two intermediates


class UsedTwice(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x * 2                              # read by two ops: must be written anyway
        return a + 1, a - 1


def test_elementwise_chain_saves_both_intermediates() -> None:
    n = 8 * 32
    found = findings(Chain().eval(), torch.randn(8, 32))
    assert codes(found) == ["FUS001"]
    assert found[0].saved_bytes == 2 * (n * F32 + n * F32)   # 2 intermediates, write + read


def test_intermediate_used_twice_is_not_fused_away() -> None:
    assert "FUS001" not in codes(findings(UsedTwice().eval(), torch.randn(8, 32)))


class LinearRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) * 0.5    # epilogue: activation and scaling


def test_gemm_epilogue() -> None:
    m, n = 4, 64
    found = findings(LinearRelu().eval(), torch.randn(m, 32))
    assert codes(found) == ["FUS002"]
    assert found[0].saved_bytes == 2 * (2 * m * n * F32)    # linear out and relu out
    assert found[0].modules == ("fc", "")


class ConvBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


def test_eval_batch_norm_after_conv_is_foldable() -> None:
    found = findings(ConvBn().eval(), torch.randn(2, 3, 16, 16))
    assert codes(found) == ["FUS003"]
    assert found[0].saved_bytes == 2 * (2 * 8 * 16 * 16 * F32)  # conv output written + read
    assert "fuse_modules" in found[0].fix


def test_training_batch_norm_is_not_folded() -> None:
    assert "FUS003" not in codes(findings(ConvBn().train(), torch.randn(2, 3, 16, 16)))


class HandAttention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-2, -1) / 4.0            # (B, H, T, T)
        return F.softmax(scores, dim=-1) @ v


def test_hand_written_attention_counts_the_score_matrix() -> None:
    b, h, t, d = 2, 4, 16, 16
    q, k, v = (torch.randn(b, h, t, d) for _ in range(3))
    found = findings(HandAttention().eval(), q, k, v)
    assert codes(found)[0] == "FUS004"
    scores = b * h * t * t * F32
    assert found[0].saved_bytes == 3 * 2 * scores   # matmul, div, softmax outputs: write + read
    assert "scaled_dot_product_attention" in found[0].fix


class Qkv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(32, 32) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x) + self.k(x) + self.v(x)


def test_projections_of_one_input() -> None:
    found = [f for f in findings(Qkv().eval(), torch.randn(4, 32)) if f.code == "FUS005"]
    assert len(found) == 1
    assert found[0].saved_bytes == 2 * 4 * 32 * F32           # x read twice fewer
    assert set(found[0].modules) == {"q", "k", "v"}


class RmsNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def test_rms_norm_by_hand() -> None:
    rows, c = 8, 32
    found = findings(RmsNorm().eval(), torch.randn(rows, c))
    assert codes(found)[0] == "FUS006"
    full, row = rows * c * F32, rows * F32
    # pow (full), mean, add, rsqrt (per row), x * r (full): each written once and read once
    assert found[0].saved_bytes == 2 * (2 * full + 3 * row)


class LayerNormByHand(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xc = x - x.mean(-1, keepdim=True)
        return xc / torch.sqrt((xc * xc).mean(-1, keepdim=True) + 1e-5)


def test_layer_norm_by_hand() -> None:
    found = findings(LayerNormByHand().eval(), torch.randn(8, 32))
    assert codes(found)[0] == "FUS006"
    assert "LayerNorm" in found[0].message


class AddNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + y                                 # the residual stream, used again
        return self.ln(h), h


def test_residual_add_then_norm() -> None:
    found = findings(AddNorm().eval(), torch.randn(8, 32), torch.randn(8, 32))
    assert codes(found) == ["FUS007"]
    assert found[0].saved_bytes == 8 * 32 * F32             # the norm's read of the sum


class MaskedSum(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (x * mask).sum(dim=1)


def test_reduction_fed_by_elementwise() -> None:
    found = findings(MaskedSum().eval(), torch.randn(3, 7, 16), torch.ones(3, 7, 16))
    assert codes(found) == ["FUS008"]
    assert found[0].saved_bytes == 2 * 3 * 7 * 16 * F32


def test_no_findings_on_a_single_gemm() -> None:
    assert findings(nn.Linear(8, 8).eval(), torch.randn(2, 8)) == []
