"""Kernel-level figures behind the per-model misses: GEMM alignment, attention kernel classes,
host cost per eager op, convolutions with and without TF32. Torch only (no fxlens).

- `gemm_alignment`: bf16 GEMMs whose dims are and are not multiples of 8 (16 bytes), at the
  shapes the model checks hit (GPT-2's 50,257-token vocabulary) and square ones: FLOP/s each.
- `attention_classes`: ``scaled_dot_product_attention`` with ``is_causal=True``, an explicit
  boolean causal mask, an additive float mask and no mask, at the model checks' shapes: time
  and FLOP/s counted on the dense (4·B·H·T²·d) and the causal (half) work.
- `host_costs`: µs per call of tiny eager ops issued from Python (an aten overload, ``torch.add``,
  a view, a transpose, an ``nn.Linear`` module), synchronised once at the end of each burst:
  the host's side of a launch-bound run.
- `convolutions`: the conv net's largest conv in fp32 with cuDNN's TF32 on (PyTorch's default
  for convolutions) and off, and the allocator bytes one call adds beyond its output
  (the cuDNN workspace).

Legend: ``B`` batch, ``H`` heads, ``T`` tokens, ``d`` head dim; GEMM ``(M, K) @ (K, N)``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .measure import reset_peak, sync, timed

GEMMS_GPU = ((32768, 768, 50257), (32768, 768, 50304), (32768, 768, 50264),
             (8192, 8192, 8192), (8192, 8192, 8191), (8192, 8191, 8192), (8191, 8192, 8192))
GEMMS_CPU = ((512, 256, 2051), (512, 256, 2048), (512, 512, 512), (512, 512, 511))
ATTENTION_GPU = ((8, 32, 4096, 128), (8, 12, 4096, 64), (1, 32, 1024, 128), (8, 12, 1024, 64))
ATTENTION_CPU = ((1, 4, 256, 64), (2, 4, 128, 32))
HOST_CALLS = 2000


def gemm_alignment(device: torch.device, warmup: int, repeat: int) -> list[dict[str, Any]]:
    rows = []
    dtype = torch.bfloat16
    for m, k, n in GEMMS_GPU if device.type == "cuda" else GEMMS_CPU:
        a = torch.randn(m, k, device=device, dtype=dtype)
        w = torch.randn(n, k, device=device, dtype=dtype)     # an nn.Linear weight: (N, K)
        seconds = timed(lambda a=a, w=w: F.linear(a, w), device, warmup, repeat)
        rows.append({"m": m, "k": k, "n": n, "s": seconds, "flops_per_s": 2 * m * k * n / seconds,
                     "aligned": all(d % 8 == 0 for d in (m, k, n))})
        del a, w
    return rows


def attention_classes(device: torch.device, warmup: int, repeat: int) -> list[dict[str, Any]]:
    rows = []
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    for b, h, t, d in ATTENTION_GPU if device.type == "cuda" else ATTENTION_CPU:
        q, k, v = (torch.randn(b, h, t, d, device=device, dtype=dtype) for _ in range(3))
        causal = torch.ones(t, t, device=device, dtype=torch.bool).tril()
        additive = torch.zeros(t, t, device=device, dtype=dtype).masked_fill(~causal, -1e4)
        masks = {"is_causal": None, "bool mask": causal, "float mask": additive, "no mask": None}
        dense = 4 * b * h * t * t * d
        for name, mask in masks.items():
            def fn(q: Any = q, k: Any = k, v: Any = v, mask: Any = mask,
                   name: str = name) -> Any:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                      is_causal=name == "is_causal")
            seconds = timed(fn, device, warmup, repeat)
            rows.append({"shape": [b, h, t, d], "variant": name, "s": seconds,
                         "dense_flops_per_s": dense / seconds,
                         "causal_flops_per_s": dense / 2 / seconds})
        del q, k, v, causal, additive
    return rows


def host_costs(device: torch.device) -> dict[str, float]:
    """µs per call of tiny eager ops, `HOST_CALLS` in a row."""
    x = torch.ones(4, 4, device=device)
    linear = torch.nn.Linear(4, 4, device=device)
    aten_add = torch.ops.aten.add.Tensor
    ops: dict[str, Callable[[], Any]] = {
        "aten overload add": lambda: aten_add(x, x),
        "torch.add": lambda: torch.add(x, x),
        "view": lambda: x.view(16),
        "transpose": lambda: x.transpose(0, 1),
        "nn.Linear module": lambda: linear(x),
    }
    result = {}
    for name, fn in ops.items():
        def burst(fn: Callable[[], Any] = fn) -> None:
            for _ in range(HOST_CALLS):
                fn()
        samples = []
        for _ in range(5):
            sync(device)
            start = time.perf_counter()
            burst()
            sync(device)
            samples.append(time.perf_counter() - start)
        result[name] = statistics.median(samples) / HOST_CALLS * 1e6
    return result


def convolutions(device: torch.device, warmup: int, repeat: int) -> list[dict[str, Any]]:
    batch, size = (64, 224) if device.type == "cuda" else (2, 32)
    rows = []
    for channels, groups in ((64, 1), (128, 4)):
        conv = torch.nn.Conv2d(channels // 2 if groups == 1 else channels, channels, 3,
                               padding=1, groups=groups, device=device)
        x = torch.randn(batch, conv.in_channels, size, size, device=device)
        flops = 2 * batch * channels * size * size * conv.in_channels // groups * 9
        before = torch.backends.cudnn.allow_tf32
        for tf32 in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            with torch.no_grad():
                seconds = timed(lambda conv=conv, x=x: conv(x), device, warmup, repeat)
                resident = reset_peak(device)
                out = conv(x)
                extra = (torch.cuda.max_memory_allocated(device) - resident - out.nbytes
                         if device.type == "cuda" else None)
            rows.append({"in": conv.in_channels, "out": channels, "groups": groups,
                         "batch": batch, "size": size, "tf32": tf32, "s": seconds,
                         "flops_per_s": flops / seconds, "workspace_bytes": extra})
            del out
        torch.backends.cudnn.allow_tf32 = before
    return rows


def kernels(device: torch.device, warmup: int, repeat: int) -> dict[str, Any]:
    return {"gemm": gemm_alignment(device, warmup, repeat),
            "attention": attention_classes(device, warmup, repeat),
            "host_us": host_costs(device),
            "conv": convolutions(device, warmup, repeat)}
