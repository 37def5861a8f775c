"""The kernels of a serving step at the shapes where `--serve` leans fast, measured and
predicted (issue 31).

Against published engine runs (`bench/README.md`, "Serving") the estimate is within ±25 % on
18 of 21 one-GPU rows but estimates 19 of 25 multi-GPU rows faster than measured, by a median
23 %: tensor-parallel decode at maximum load (hundreds of tokens a step through GEMMs whose N
is a 1/t shard), and MoE serving with expert parallelism. Which kernel is the cause cannot be
told from the tables. These cases time, on one real GPU, the kernels of those steps, captured
in a CUDA graph as engines replay a decode step (no launch gaps from the host):

- `linear`: a decode step's projections at a batch of tokens (M) — one GPU's shard under TP
  (Llama-2-70B at t = 4: QKV 8192 → 2560, gate+up 8192 → 14336, down 7168 → 8192) and the
  whole layer of one GPU (Llama-3.1-8B) — at M from 1 (memory-bound) through the ridge point
  (a few hundred on Hopper in bf16) to compute-bound: the roofline's max(compute, memory) is
  exact at either end and most optimistic at the ridge; and two of them in FP8
  (``torch._scaled_mm``, e4m3, per-tensor scales), as most published rows ran;
- `experts`: one EP rank's experts at decode (Qwen3-235B over 8 GPUs: 16 local experts, the
  rows a step of ~4,000 tokens routes to each; DeepSeek-V3: 32 local experts) as two
  ``torch._grouped_mm``;
- `decode`: attention of one new token per sequence over its cache: GQA at a TP shard
  (Llama-2-70B t = 4: 16 query heads on 2 KV heads) and MLA's absorbed form (128 heads of 576
  over one latent);
- `chain`: 256 dependent elementwise kernels on a few KiB each, nearly no work: what a kernel
  boundary costs inside a CUDA graph (the device's `graph_launch_s`, 1.3 µs on Hopper from a
  published H100 measurement; a 70B decode step runs some 900 kernels).

Every case but the FP8 ones runs in bf16 (median of `repeat` graph replays of `inner`
calls); the prediction is fxlens's roofline of the same module on fake tensors with a
registry device:

    python -m bench.gpu.serving --measure --out serving.json          # on the GPU, ~1 min
    python -m bench.gpu.serving --predict serving.json --device h100  # anywhere: the table
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ServingCase:
    name: str
    kind: str            # "linear", "fp8", "experts", "decode" or "chain"
    sizes: dict[str, int]


def _linears() -> list[ServingCase]:
    shapes = {"70b tp4 qkv": (8192, 2560), "70b tp4 gate+up": (8192, 14336),
              "70b tp4 down": (7168, 8192), "8b gate+up": (4096, 28672)}
    bf16 = [ServingCase(f"linear {name}, M {m}", "linear", {"m": m, "k": k, "n": n})
            for name, (k, n) in shapes.items() for m in (1, 64, 256, 1024)]
    # FP8 (most published serving rows): e4m3 operands, per-tensor scales, bf16 out; cuBLASLt
    # takes M in multiples of 16
    fp8 = [ServingCase(f"fp8 linear {name}, M {m}", "fp8", {"m": m, "k": k, "n": n})
           for name, (k, n) in list(shapes.items())[:2] for m in (16, 256, 1024)]
    return bf16 + fp8


CASES = (
    *_linears(),
    ServingCase("qwen3-235b ep8 decode experts", "experts",
                {"experts": 16, "rows": 250, "hidden": 4096, "ffn": 1536}),
    ServingCase("deepseek-v3 ep8 decode experts", "experts",
                {"experts": 32, "rows": 32, "hidden": 7168, "ffn": 2048}),
    ServingCase("70b tp4 decode attention, 246 × 1500", "decode",
                {"batch": 246, "heads": 16, "kv_heads": 2, "context": 1500, "qk_dim": 128,
                 "v_dim": 128}),
    ServingCase("deepseek-v3 absorbed MLA decode, 128 × 3000", "decode",
                {"batch": 128, "heads": 128, "kv_heads": 1, "context": 3000, "qk_dim": 576,
                 "v_dim": 576}),
    ServingCase("256 dependent small kernels", "chain", {"kernels": 256, "elements": 2048}),
)


class Linear(nn.Module):
    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, k) * k ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Fp8Linear(nn.Module):
    """A weight GEMM as FP8 engines run it: e4m3 activations and weights, per-tensor
    scales, bf16 out (``torch._scaled_mm``)."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        weight = (torch.randn(n, k) * k ** -0.5).to(torch.float8_e4m3fn)
        self.register_buffer("weight", weight)
        self.register_buffer("scale", torch.ones((), dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(x, self.weight.t(), self.scale, self.scale,
                                out_dtype=torch.bfloat16)


class Experts(nn.Module):
    """`experts` expert MLPs over rows sorted by expert, `rows` each."""

    def __init__(self, experts: int, rows: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.ffn = ffn
        self.gate_up = nn.Parameter(torch.randn(experts, hidden, 2 * ffn) * hidden ** -0.5)
        self.down = nn.Parameter(torch.randn(experts, ffn, hidden) * ffn ** -0.5)
        self.register_buffer("offsets", torch.arange(1, experts + 1, dtype=torch.int32) * rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch._grouped_mm(x, self.gate_up, offs=self.offsets)
        return torch._grouped_mm(F.silu(h[:, :self.ffn]) * h[:, self.ffn:], self.down,
                                 offs=self.offsets)


class Decode(nn.Module):
    """One query token per sequence against its cache (no mask: it sees the whole cache).
    Against one cache head (MQA, MLA's latent) the query heads are the rows of one head, as
    FlashMLA runs them: GQA's expansion would copy the cache once per head (105 GiB for
    DeepSeek-V3's 128 heads over 128 × 3,000 latents, which did not fit on an H200)."""

    def __init__(self, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.gqa = heads != kv_heads
        self.rows = kv_heads == 1 and heads > 1

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None
                ) -> torch.Tensor:
        """`v` None: the keys are the values too (an MLA latent, one buffer)."""
        v = k if v is None else v
        if self.rows:
            return F.scaled_dot_product_attention(q.transpose(1, 2), k, v).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=self.gqa)


class Chain(nn.Module):
    """`kernels` dependent elementwise ops, each its own kernel in eager PyTorch."""

    def __init__(self, kernels: int) -> None:
        super().__init__()
        self.kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.kernels):
            x = torch.add(x, 1.0)
        return x


def build(case: ServingCase, device: torch.device) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The module and its inputs, bf16 on `device` (FP8 operands for an ``fp8`` case)."""
    s = case.sizes
    torch.manual_seed(0)
    with torch.device(device):
        if case.kind == "linear":
            module: nn.Module = Linear(s["k"], s["n"])
            inputs: tuple[torch.Tensor, ...] = (torch.randn(s["m"], s["k"]),)
        elif case.kind == "fp8":
            fp8 = Fp8Linear(s["k"], s["n"])
            return fp8, (torch.randn(s["m"], s["k"]).to(torch.float8_e4m3fn),)
        elif case.kind == "experts":
            module = Experts(s["experts"], s["rows"], s["hidden"], s["ffn"])
            inputs = (torch.randn(s["experts"] * s["rows"], s["hidden"]),)
        elif case.kind == "chain":
            module, inputs = Chain(s["kernels"]), (torch.randn(s["elements"]),)
        else:
            module = Decode(s["heads"], s["kv_heads"])
            b, c = s["batch"], s["context"]
            inputs = (torch.randn(b, s["heads"], 1, s["qk_dim"]),
                      torch.randn(b, s["kv_heads"], c, s["qk_dim"]))
            if not _one_buffer(s):
                inputs += (torch.randn(b, s["kv_heads"], c, s["v_dim"]),)
    return module.to(torch.bfloat16), tuple(x.to(torch.bfloat16) for x in inputs)


def moved_and_flops(case: ServingCase) -> tuple[float, float]:
    """(bytes the kernel must move, its FLOPs) by the closed form, bf16."""
    s = case.sizes
    if case.kind in ("linear", "fp8"):
        m, k, n = s["m"], s["k"], s["n"]
        width = 1.0 if case.kind == "fp8" else 2.0            # operands; the output is bf16
        return width * (m * k + k * n) + 2.0 * m * n, 2.0 * m * k * n
    if case.kind == "experts":
        e, r, h, f = s["experts"], s["rows"], s["hidden"], s["ffn"]
        return 2.0 * e * (3 * h * f + r * (2 * h + 4 * f)), 2.0 * e * r * h * 3 * f
    if case.kind == "chain":
        return 2.0 * 2 * s["kernels"] * s["elements"], float(s["kernels"] * s["elements"])
    b, c = s["batch"], s["context"]
    cache = b * s["kv_heads"] * c * (s["qk_dim"] + (0 if _one_buffer(s) else s["v_dim"]))
    return 2.0 * cache, 2.0 * b * s["heads"] * c * (s["qk_dim"] + s["v_dim"])


def _one_buffer(sizes: dict[str, int]) -> bool:
    """An MLA latent: keys and values are the same one-head buffer, read once."""
    return sizes["kv_heads"] == 1 and sizes["qk_dim"] == sizes["v_dim"]


def replayed_s(fn: Any, device: torch.device, inner: int, repeat: int) -> float:
    """Seconds of one call: `inner` calls captured in a CUDA graph, the median of `repeat`
    replays (on a CPU, `inner` calls in a loop)."""
    if device.type != "cuda":
        samples = []
        for _ in range(repeat):
            began = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - began) / inner)
        return statistics.median(samples)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    samples = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(samples)


def measure(device: torch.device, inner: int = 20, repeat: int = 10,
            cases: tuple[ServingCase, ...] | None = None) -> list[dict[str, Any]]:
    """Each case (`CASES` unless given) timed in a CUDA graph (`replayed_s`)."""
    from .measure import each_named_case

    return each_named_case(CASES if cases is None else cases,
                           lambda case: _timed_case(case, device, inner, repeat), device)


def _timed_case(case: ServingCase, device: torch.device, inner: int, repeat: int
                ) -> dict[str, float]:
    module, inputs = build(case, device)
    with torch.no_grad():
        seconds = replayed_s(lambda: module(*inputs), device, inner, repeat)
    moved, flops = moved_and_flops(case)
    return {"seconds": seconds, "bytes_per_s": moved / seconds, "flops_per_s": flops / seconds}


def predict(case: ServingCase, device_name: str) -> float:
    """fxlens's roofline seconds of the same module's kernels, on fake tensors: each kernel at
    max(compute, memory) plus the device's gap at a kernel boundary (`graph_launch_s`), as a
    serving step is timed; without the host's launches (a CUDA graph has none)."""
    from fxlens.analyzer.capture.chain import capture
    from fxlens.analyzer.cost.engine import analyze
    from fxlens.analyzer.time.roofline import dtype_key, node_dtype, node_time
    from fxlens.rules import load_rules
    from fxlens.rules.hardware import device

    module, inputs = build(case, torch.device("meta"))
    registry = load_rules()
    graph = capture(module, inputs, registry)
    spec = device(device_name)
    times = [node_time(n, dtype_key(node_dtype(graph.nodes[n.id], graph), False), spec)
             for n in analyze(graph, registry).nodes]
    work = [max(t.compute_s, t.memory_s) for t in times]
    return float(sum(work) + spec.graph_launch_s * sum(1 for w in work if w > 0))


def table(result: dict[str, Any]) -> str:
    """Measured and predicted seconds of each case, and the rates measured, as Markdown."""
    lines = [f"| case ({result['device']}, bf16) | measured | predicted | error | "
             "GB/s | TFLOP/s |", "|---|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        if "error" in row or "predicted" not in row:
            lines.append(f"| {row['name']} | {row.get('error', 'not predicted')} |||||")
            continue
        measured, predicted = row["seconds"], row["predicted"]
        lines.append(f"| {row['name']} | {measured * 1e6:.1f} µs | {predicted * 1e6:.1f} µs | "
                     f"{predicted / measured - 1:+.0%} | {row['bytes_per_s'] / 1e9:,.0f} | "
                     f"{row['flops_per_s'] / 1e12:,.0f} |")
    return "\n".join(lines)


def predict_row(row: dict[str, Any], device_name: str) -> float:
    """`predict` of a measured row (a case's fields, as `measure` writes them)."""
    return predict(ServingCase(row["name"], row["kind"], row["sizes"]), device_name)


def main() -> None:
    from .measure import measure_and_predict

    measure_and_predict(__doc__ or "", "serving.json", "h100", measure, predict_row, table)


if __name__ == "__main__":
    main()
