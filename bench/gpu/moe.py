"""One GPU's share of a MoE training step, measured and predicted (issue 30, the MoE rows).

The published MoE runs in `bench/plan_runs/` miss by +52…+107 %, and the plan's compute part
alone is larger than some whole measured steps. These cases time, on one real GPU, what
one rank of those layouts runs, so the miss can be split between the device model (the
kernels below) and the schedule (all-to-all overlap, which one GPU cannot show):

- `experts`: the expert MLP of one rank (gate and up fused, SiLU·mul, down) as two
  ``torch._grouped_mm`` calls, at the per-rank sizes of the published layouts: the experts a
  rank holds and the rows the EP group routes to each (balanced routing, as the runs force).
- `block`: a whole dropless MoE block on one GPU (router, top-k, sort by expert, gather,
  grouped GEMMs, weighted scatter back) with every expert local: the memory-bound permutation
  beside the GEMMs; on a GPU, each kernel's time in a training step (the profiler's).
- `attention`: causal flash attention of one rank of the same layouts (GQA with
  ``enable_gqa``; DeepSeek-V3's MLA, whose values are narrower than q/k).

Each case is timed forward and forward+backward in bf16 (median of `repeat`); the backward is
their difference. The predictions are fxlens's roofline of the same module on fake tensors,
with a registry device (`predict`), on any machine:

    python -m bench.gpu.moe --measure --out moe-h200.json      # on the GPU, ~1 min
    python -m bench.gpu.moe --predict moe-h200.json --device h200   # + the Markdown table
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

KERNELS_KEPT = 30   # a block's kernels recorded per training step, the longest first


@dataclass(frozen=True)
class MoECase:
    name: str
    kind: str            # "experts", "block" or "attention"
    sizes: dict[str, int]


CASES = (
    # one rank of Qwen3-235B-A22B at tp2 (sequence parallel) ep32: 2,048 tokens × top-8 over
    # 4 local experts
    MoECase("qwen3-235b ep32 rank experts", "experts",
            {"experts": 4, "rows": 4096, "hidden": 4096, "ffn": 1536}),
    # DeepSeek-V3 at tp2 ep64 (Megatron-Bridge), same routing arithmetic
    MoECase("deepseek-v3 ep64 rank experts", "experts",
            {"experts": 4, "rows": 4096, "hidden": 7168, "ffn": 2048}),
    # Qwen3-30B-A3B ep8, one 4,096-token micro-batch: 16 local experts, 2,048 rows each
    MoECase("qwen3-30b ep8 rank experts", "experts",
            {"experts": 16, "rows": 2048, "hidden": 2048, "ffn": 768}),
    MoECase("qwen3-30b ep8 rank experts, 512 rows", "experts",
            {"experts": 16, "rows": 512, "hidden": 2048, "ffn": 768}),
    MoECase("qwen3-30b block, 128 experts local", "block",
            {"experts": 128, "top_k": 8, "tokens": 4096, "hidden": 2048, "ffn": 768}),
    # Qwen3-Next-80B-A3B, one 4 × 4,096-token micro-batch with all 512 experts local: the
    # routing ops (top-10 over 512) beside experts of width 512
    MoECase("qwen3-next block, 512 experts local", "block",
            {"experts": 512, "top_k": 10, "tokens": 16384, "hidden": 2048, "ffn": 512}),
    MoECase("qwen3-235b attention tp2", "attention",
            {"heads": 32, "kv_heads": 2, "tokens": 4096, "qk_dim": 128, "v_dim": 128}),
    MoECase("deepseek-v3 MLA attention tp2", "attention",
            {"heads": 64, "kv_heads": 64, "tokens": 4096, "qk_dim": 192, "v_dim": 128}),
)


class Experts(nn.Module):
    """`experts` expert MLPs over rows already sorted by expert, `rows` each."""

    def __init__(self, experts: int, rows: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.ffn = ffn
        self.gate_up = nn.Parameter(torch.randn(experts, hidden, 2 * ffn) * hidden ** -0.5)
        self.down = nn.Parameter(torch.randn(experts, ffn, hidden) * ffn ** -0.5)
        self.register_buffer("offsets", torch.arange(1, experts + 1, dtype=torch.int32) * rows)

    def experts(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        h = torch._grouped_mm(x, self.gate_up, offs=offsets)
        return torch._grouped_mm(F.silu(h[:, :self.ffn]) * h[:, self.ffn:], self.down,
                                 offs=offsets)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.offsets).float().square().mean()


class Block(Experts):
    """A dropless MoE block with every expert local: route, permute, experts, un-permute."""

    def __init__(self, experts: int, top_k: int, tokens: int, hidden: int, ffn: int) -> None:
        super().__init__(experts, 0, hidden, ffn)
        self.top_k = top_k
        self.router = nn.Linear(hidden, experts, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = torch.topk(self.router(x).softmax(-1), self.top_k, dim=-1)
        order = chosen.flatten().argsort()
        rows = order // self.top_k
        counts = F.one_hot(chosen.flatten(), self.gate_up.shape[0]).sum(0)
        out = self.experts(x[rows], counts.cumsum(0).to(torch.int32))
        out = out * weights.flatten()[order, None].to(out.dtype)
        return torch.zeros_like(x).index_add(0, rows, out).float().square().mean()


class Attention(nn.Module):
    def __init__(self, heads: int, kv_heads: int, tokens: int, qk_dim: int, v_dim: int) -> None:
        super().__init__()
        self.gqa = heads != kv_heads
        self.scale = nn.Parameter(torch.ones(()))   # something to train, so there is a backward

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = F.scaled_dot_product_attention(q * self.scale, k, v, is_causal=True,
                                             enable_gqa=self.gqa)
        return out.float().square().mean()


def build(case: MoECase, device: torch.device) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The module (bf16 on `device`) and its inputs, which require grad."""
    s = case.sizes
    torch.manual_seed(0)
    with torch.device(device):
        if case.kind == "experts":
            module: nn.Module = Experts(s["experts"], s["rows"], s["hidden"], s["ffn"])
            inputs = (torch.randn(s["experts"] * s["rows"], s["hidden"]),)
        elif case.kind == "block":
            module = Block(s["experts"], s["top_k"], s["tokens"], s["hidden"], s["ffn"])
            inputs = (torch.randn(s["tokens"], s["hidden"]),)
        else:
            module = Attention(**s)
            t = s["tokens"]
            inputs = (torch.randn(1, s["heads"], t, s["qk_dim"]),
                      torch.randn(1, s["kv_heads"], t, s["qk_dim"]),
                      torch.randn(1, s["kv_heads"], t, s["v_dim"]))
    module = module.to(torch.bfloat16)
    return module, tuple(x.to(torch.bfloat16).requires_grad_() for x in inputs)


def flops(case: MoECase) -> dict[str, float]:
    """The forward's FLOPs by the closed form (GEMMs and attention only), for the rate."""
    s = case.sizes
    if case.kind == "experts":
        return {"forward": 2 * s["experts"] * s["rows"] * s["hidden"] * 3 * s["ffn"]}
    if case.kind == "block":
        rows = s["tokens"] * s["top_k"]
        return {"forward": 2 * rows * s["hidden"] * 3 * s["ffn"]
                + 2 * s["tokens"] * s["hidden"] * s["experts"]}
    t = s["tokens"]
    return {"forward": 2 * s["heads"] * t * t * (s["qk_dim"] + s["v_dim"]) / 2}


def measure(device: torch.device, warmup: int = 3, repeat: int = 10) -> list[dict[str, Any]]:
    from .measure import each_named_case

    return each_named_case(CASES, lambda case: _timed_case(case, device, warmup, repeat),
                           device)


def _timed_case(case: MoECase, device: torch.device, warmup: int, repeat: int
                ) -> dict[str, float]:
    from .measure import kernel_table, timed

    module, inputs = build(case, device)

    def forward() -> None:
        with torch.no_grad():
            module(*inputs)

    def step() -> None:
        module(*inputs).backward()

    forward_s = timed(forward, device, warmup, repeat)
    step_s = timed(step, device, warmup, repeat)
    result: dict[str, Any] = {"forward_s": forward_s, "backward_s": step_s - forward_s,
                              "forward_flops_per_s": flops(case)["forward"] / forward_s}
    if case.kind == "block" and device.type == "cuda":   # where the routing ops' time goes
        result["step_kernels"] = kernel_table(step, device, 3)[:KERNELS_KEPT]
    return result


def predict(case: MoECase, device_name: str) -> dict[str, float]:
    """fxlens's roofline of the same module, forward and backward phases, on fake tensors."""
    from fxlens.analyzer.core.loaded import LoadedModel
    from fxlens.analyzer.core.sections import Roofline
    from fxlens.api import analyze_loaded
    from fxlens.pipeline import AnalysisOptions

    with torch.device("meta"):
        module, inputs = build(case, torch.device("meta"))
    loaded = LoadedModel(module, tuple(x.detach() for x in inputs), case.name, "bench/gpu/moe")
    options = AnalysisOptions(device=device_name, fusion=False, train=True, optimizer="sgd")
    phases = analyze_loaded(loaded, options).require(Roofline).totals.by_phase
    return {"forward_s": phases.get("forward", math.nan),
            "backward_s": phases.get("backward", math.nan)}


def table(result: dict[str, Any]) -> str:
    """The measured and predicted seconds of each case as Markdown."""
    lines = [f"| case ({result['device']}, bf16) | forward measured | predicted | error | "
             "backward measured | predicted | error |", "|---|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        if "error" in row or "predicted" not in row:
            lines.append(f"| {row['name']} | {row.get('error', 'not predicted')} ||||||")
            continue
        cells = []
        for phase in ("forward_s", "backward_s"):
            measured, predicted = row[phase], row["predicted"][phase]
            cells += [f"{measured * 1e3:.2f} ms", f"{predicted * 1e3:.2f} ms",
                      f"{predicted / measured - 1:+.0%}"]
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    from .measure import measure_and_predict

    measure_and_predict(
        __doc__ or "", "moe.json", "h200", measure,
        lambda row, device: predict(MoECase(row["name"], row["kind"], row["sizes"]), device),
        table)


if __name__ == "__main__":
    main()
