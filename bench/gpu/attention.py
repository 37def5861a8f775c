"""Causal attention's share of the GEMM peak, per kernel backend, at the shapes one GPU of the
published training layouts runs (issue 30: the attention kernel class of `fxlens.rules.hardware`).

Per shape (batch, query heads, key/value heads, tokens, head dim) and per SDPA backend
(``FLASH_ATTENTION``: FlashAttention-2; ``CUDNN_ATTENTION``: cuDNN's fused attention, which
Transformer Engine calls; ``EFFICIENT_ATTENTION``), the forward and the forward + backward are
timed in bf16 (median of `repeat`) and rated on the causal FLOPs: 2·B·H·T²·d forward (QKᵀ and
PV over the lower triangle), 2.5 times that backward.

    python -m bench.gpu.attention --out attention.json       # on the GPU, ~1 min
    python -m bench.gpu.attention --table attention.json      # anywhere
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

SHAPES = (  # (batch, heads, kv heads, tokens, head dim)
    (1, 32, 8, 8192, 128),      # Llama-3 8B, one GPU of cp = 2 holds 8,192 of 16k… as 8k
    (1, 16, 2, 8192, 128),      # Llama-3 70B at tp = 4
    (1, 32, 2, 4096, 128),      # Qwen3-235B at tp = 2
    (4, 32, 4, 4096, 128),      # Qwen3-30B, micro-batch 4
    (8, 32, 32, 4096, 128),     # the issue-37 check's shape
)
BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")


def measure(device: torch.device, warmup: int = 3, repeat: int = 10) -> list[dict[str, Any]]:
    from .measure import each_case

    # a backend that refuses a shape: its row says why
    return each_case([{"shape": list(shape), "backend": backend}
                      for shape in SHAPES for backend in BACKENDS],
                     lambda row: _timed(tuple(row["shape"]), row["backend"], device, warmup,
                                        repeat),
                     device, error_chars=300)


def _timed(shape: tuple[int, ...], backend: str, device: torch.device, warmup: int,
           repeat: int) -> dict[str, float]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .measure import timed

    b, h, kv, t, d = shape
    q = torch.randn(b, h, t, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    if backend != "FLASH_ATTENTION":   # other backends may refuse enable_gqa: K/V repeated
        kv = h
    k, v = (torch.randn(b, kv, t, d, device=device, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))

    def attend() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != h)

    def forward() -> None:
        with torch.no_grad():
            attend()

    def step() -> None:
        attend().sum().backward()

    with sdpa_kernel(getattr(SDPBackend, backend)):
        forward_s = timed(forward, device, warmup, repeat)
        step_s = timed(step, device, warmup, repeat)
    flops = 2 * b * h * t * t * d
    return {"forward_s": forward_s, "backward_s": step_s - forward_s,
            "forward_flops_per_s": flops / forward_s,
            "backward_flops_per_s": 2.5 * flops / (step_s - forward_s)}


def table(result: dict[str, Any], peak_flops: float = 989.5e12) -> str:
    lines = ["| shape (B, H, KV, T, d) | backend | forward | share of peak | backward | "
             "share of peak |", "|---|---|---:|---:|---:|---:|"]
    for row in result["rows"]:
        if "error" in row:
            lines.append(f"| {tuple(row['shape'])} | {row['backend']} | refused ||||")
            continue
        lines.append(f"| {tuple(row['shape'])} | {row['backend']} | "
                     f"{row['forward_flops_per_s'] / 1e12:.0f} TFLOP/s | "
                     f"{row['forward_flops_per_s'] / peak_flops:.2f} | "
                     f"{row['backward_flops_per_s'] / 1e12:.0f} TFLOP/s | "
                     f"{row['backward_flops_per_s'] / peak_flops:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path)
    args = parser.parse_args()
    if args.out:
        device = torch.device("cuda")
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                        "torch": torch.__version__,
                                        "rows": measure(device)}, indent=1))
    if args.table:
        print(table(json.loads(args.table.read_text())))


if __name__ == "__main__":
    main()
