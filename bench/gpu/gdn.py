"""flash-linear-attention's chunked delta-rule kernels timed on a real GPU, kernel by kernel
(issue 30: Qwen3-Next's step; the latency floor `bench/gdn_kernel.py` found).

Every GPU stack runs Qwen3-Next's and Qwen3.5's gated DeltaNet, and Kimi Linear's delta
attention, through FLA's Triton kernels (``chunk_gated_delta_rule``, ``chunk_kda``); fxlens
prices them as `fxlens_gdn::chunk` (`fxlens/rules/gdn.py`). vLLM's published B200 timings
came out 4–16× slower than that roofline and fit a fixed cost plus a step per chunk that one
program walks in order. These cases time the same kernels on the lent GPU:

- `published`: vLLM PR #38981's shapes (fp16 forward, q/k normalised in the kernel; several
  sequences as ``cu_seqlens``), to set this device beside the B200's table;
- `length`: one sequence of 1k … 32k tokens at the same heads: the time per chunk walked;
- `training`: one rank of Qwen3-Next-80B-A3B (16 q/k heads, 32 value heads, 4 × 4,096 tokens
  and 1 × 4,096) and of Kimi Linear (32 heads, per-channel decay), bf16, forward and
  forward + backward.

Each row holds the median seconds of `repeat` calls after `warmup` (the first compiles and
autotunes) and, on a GPU, every kernel's time per call from the profiler. FLA is not one of
our dependencies: carry its wheel (``fla-core``) to the GPU machine.

    python -m bench.gpu.gdn --measure --out gdn.json          # on the GPU, with fla-core
    python -m bench.gpu.gdn --predict gdn.json --device h200  # anywhere: the table
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

HEAD_DIM = 128
KERNELS_KEPT = 25


@dataclass(frozen=True)
class GDNCase:
    name: str
    kind: str            # "gdn" (a decay per head) or "kda" (a decay per key channel)
    sequences: int
    tokens: int          # per sequence
    k_heads: int
    heads: int           # value heads (GVA when more than k_heads)
    dtype: str = "float16"
    backward: bool = False
    varlen: bool = False  # the sequences packed into one row with cu_seqlens, as vLLM ran them


CASES = (
    GDNCase("vllm tp8 1×8192", "gdn", 1, 8192, 2, 8),
    GDNCase("vllm tp8 1×4096", "gdn", 1, 4096, 2, 8),
    GDNCase("vllm tp8 1×2048", "gdn", 1, 2048, 2, 8),
    GDNCase("vllm tp8 8×1024", "gdn", 8, 1024, 2, 8, varlen=True),
    GDNCase("vllm tp8 4×2048", "gdn", 4, 2048, 2, 8, varlen=True),
    GDNCase("vllm tp4 1×8192", "gdn", 1, 8192, 4, 16),
    GDNCase("length 1×1024", "gdn", 1, 1024, 2, 8),
    GDNCase("length 1×16384", "gdn", 1, 16384, 2, 8),
    GDNCase("length 1×32768", "gdn", 1, 32768, 2, 8),
    GDNCase("qwen3-next rank 1×4096", "gdn", 1, 4096, 16, 32, "bfloat16", backward=True),
    GDNCase("qwen3-next rank 4×4096", "gdn", 4, 4096, 16, 32, "bfloat16", backward=True),
    GDNCase("kimi-linear rank 1×4096", "kda", 1, 4096, 32, 32, "bfloat16", backward=True),
)


def inputs(case: GDNCase, device: torch.device) -> dict[str, Any]:
    """q, k, v, g (log decay), beta and the packing of `case`, requiring grad where trained."""
    dtype = getattr(torch, case.dtype)
    rows, length = (1, case.sequences * case.tokens) if case.varlen else (case.sequences,
                                                                          case.tokens)
    generator = torch.Generator(device).manual_seed(0)

    def randn(*shape: int, kind: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device, dtype=kind)

    decay = (rows, length, case.heads) + ((HEAD_DIM,) if case.kind == "kda" else ())
    tensors = {"q": randn(rows, length, case.k_heads, HEAD_DIM),
               "k": randn(rows, length, case.k_heads, HEAD_DIM),
               "v": randn(rows, length, case.heads, HEAD_DIM),
               "g": F.logsigmoid(randn(*decay, kind=torch.float32)),
               "beta": randn(rows, length, case.heads).sigmoid()}
    if case.backward:
        for tensor in tensors.values():
            tensor.requires_grad_()
    if case.varlen:
        tensors["cu_seqlens"] = torch.arange(0, length + 1, case.tokens, device=device)
    return tensors


def kernel(case: GDNCase) -> Any:
    import fla.ops.common.chunk_o as chunk_o

    # FLA refuses the gated backward on Hopper with Triton 3.4–3.7.0 (wrong dq/dk/dw values,
    # its issue #640); the kernels and their timing are the same, and only time is read here
    chunk_o.TRITON_ABOVE_3_7_1 = True
    if case.kind == "kda":
        from fla.ops.kda import chunk_kda
        return chunk_kda
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    return chunk_gated_delta_rule


def measure(device: torch.device, warmup: int = 3, repeat: int = 10) -> list[dict[str, Any]]:
    from .measure import each_named_case

    return each_named_case(CASES, lambda case: _timed_case(case, device, warmup, repeat),
                           device)


def _timed_case(case: GDNCase, device: torch.device, warmup: int, repeat: int
                ) -> dict[str, Any]:
    from .measure import kernel_table, timed

    call, tensors = kernel(case), inputs(case, device)

    def forward() -> Any:
        return call(**tensors, use_qk_l2norm_in_kernel=True)[0]

    def no_grad_forward() -> None:
        with torch.no_grad():
            forward()

    grad = torch.ones_like(tensors["v"])   # the output's shape: no loss kernels in the step
    leaves = [t for t in tensors.values() if t.requires_grad]

    def step() -> None:   # the gradients returned, not summed into .grad (no add kernels)
        torch.autograd.grad(forward(), leaves, grad)

    result: dict[str, Any] = {"forward_s": timed(no_grad_forward, device, warmup, repeat)}
    if case.backward:
        result["backward_s"] = timed(step, device, warmup, repeat) - result["forward_s"]
    if device.type == "cuda":
        result["forward_kernels"] = kernel_table(no_grad_forward, device, 3)[:KERNELS_KEPT]
        if case.backward:
            result["step_kernels"] = kernel_table(step, device, 3)[:KERNELS_KEPT]
    return result


def predict(row: dict[str, Any], device_name: str) -> dict[str, float]:
    """fxlens's roofline of the same call (`fxlens_gdn::chunk` and its backward)."""
    from bench.gdn_kernel import predicted_s

    case = GDNCase(**{key: row[key] for key in GDNCase.__dataclass_fields__})
    forward, backward = predicted_s(case.sequences, case.tokens, case.k_heads, case.heads,
                                    device_name, case.dtype, per_channel=case.kind == "kda")
    return {"forward_s": forward[0], "backward_s": backward[0] if case.backward else math.nan}


def library_s(kernels: list[dict[str, Any]]) -> float:
    """Seconds per call of FLA's own (Triton) kernels in a kernel table: PyTorch's kernels
    (the wrapper's sums over grouped heads, a harness's) and copies left out."""
    return 1e-6 * sum(row["us_per_step"] for row in kernels
                      if not row["kernel"].startswith(("void ", "Memcpy", "Memset")))


def kernel_seconds(row: dict[str, Any]) -> dict[str, float]:
    """FLA's kernel seconds of a measured row, forward and backward (the step's less the
    forward's); NaN where the profiler did not run."""
    forward = library_s(row["forward_kernels"]) if "forward_kernels" in row else math.nan
    step = library_s(row["step_kernels"]) if "step_kernels" in row else math.nan
    return {"forward_s": forward, "backward_s": step - forward}


def table(result: dict[str, Any]) -> str:
    """Per case: the wall time of a call, FLA's kernels' time (the profiler's) and fxlens's
    roofline, forward and backward, in milliseconds, as Markdown."""
    lines = [f"| case ({result['device']}) | forward: call | FLA kernels | fxlens | kernels ÷ "
             "fxlens | backward: call | FLA kernels | fxlens | kernels ÷ fxlens |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        if "error" in row or "predicted" not in row:
            lines.append(f"| {row['name']} | {row.get('error', 'not predicted')[:80]} "
                         "||||||||")
            continue
        kernels, cells = kernel_seconds(row), []
        for phase in ("forward_s", "backward_s"):
            predicted = row["predicted"][phase]
            if math.isnan(predicted):
                cells += ["–"] * 4
                continue
            cells += [f"{row[phase] * 1e3:.3f}", f"{kernels[phase] * 1e3:.3f}",
                      f"{predicted * 1e3:.3f}", f"{kernels[phase] / predicted:.1f}×"]
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    from .measure import measure_and_predict

    measure_and_predict(__doc__ or "", "gdn.json", "h200", measure, predict, table)


if __name__ == "__main__":
    main()
