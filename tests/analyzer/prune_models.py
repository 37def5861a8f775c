"""The pruning checks' models and helpers: every model the plan is checked on (our zoo, the
`transformers` zoo, `tests.models.hf_vision`), a plan made through the API, and the FLOPs
FlopCounterMode counts on an eager run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.prune.calibrated import CalibrationData
from fxlens.analyzer.prune.module import run
from fxlens.analyzer.prune.plan import parse_target
from fxlens.analyzer.prune.section import PruneResult, prune
from fxlens.analyzer.prune.shrink import Shrunk
from fxlens.rules import load_rules
from fxlens.rules.prune import knowledge
from tests.models import branchy, convnet, hf_vision, hf_zoo, lstm, mlp, tiny_gpt

# the rule modules whose FLOPs FlopCounterMode also counts (GEMMs and convolutions); it counts
# 0 for the CPU flash-attention kernel and for every elementwise op (tests/README: known
# divergences), so the plan's prediction is compared on these
GEMM_RULES = ("fxlens.rules.matmul", "fxlens.rules.conv")


class Concat(nn.Module):
    """Two conv branches concatenated on channels, then a depthwise conv with batch norm."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 16, 1)
        self.dw = nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.bn = nn.BatchNorm2d(24)
        self.head = nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, C, H, W)
        y = torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x))], dim=1)
        y = torch.relu(self.bn(self.dw(y)))
        return self.head(y.mean((2, 3)))


def concat() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = Concat().eval()
    model.bn.weight.data.uniform_(0.1, 1.0)
    return model, (torch.randn(2, 3, 8, 8),)


MODELS: dict[str, Callable[[], Any]] = {
    "mlp": mlp.build, "convnet": convnet.build, "tiny_gpt": tiny_gpt.build, "concat": concat,
    "llama": hf_zoo.build_llama, "bert": hf_zoo.build_bert, "gpt2": hf_zoo.build_gpt2,
    "qwen2": hf_zoo.build_qwen2, "distilbert": hf_zoo.build_distilbert,
    "resnet": hf_zoo.build_resnet, "mobilenet_v2": hf_zoo.build_mobilenet_v2,
    "vit": hf_zoo.build_vit, "convnext": hf_zoo.build_convnext, **hf_vision.ZOO,
}
OTHERS = {"branchy": branchy.build, "lstm": lstm.build}


def planned(build: Callable[[], Any], target: str | None = "30%",
            calibration: CalibrationData | None = None) -> tuple[Any, Any, PruneResult]:
    module, inputs = build()
    registry = load_rules()
    graph = capture(module, inputs, registry)
    report = analyze(graph, registry)
    return module, inputs, prune(module, inputs, graph, report, knowledge(), registry,
                                 parse_target(target) if target else None,
                                 calibration=calibration)


def eager_gemm_flops(module: nn.Module, inputs: Any) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        run(module, inputs)
    return counter.get_total_flops()


def predicted_gemm_flops(shrunk: Shrunk) -> int:
    """The planned graph's FLOPs in the ops FlopCounterMode counts too (`GEMM_RULES`)."""
    registry = load_rules()
    return sum(costed.flops for node, costed in zip(shrunk.graph.calls(), shrunk.report.nodes,
                                                     strict=True)
               if getattr(registry.lookup(node), "__module__", "") in GEMM_RULES)
