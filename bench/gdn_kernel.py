"""The gated delta rule's forward kernel against published flash-linear-attention timings.

vLLM's PR #38981 ("[Perf][GDN] Align TMA usage with upstream FLA", merged; the description's
table) timed ``fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule_fwd`` on an NVIDIA B200,
fp16, head dim 128, at Qwen3.5-397B's and -122B's linear-attention heads per GPU under
tensor parallelism 8 and 4, for one sequence and for several sequences of the same total
(varlen ``cu_seqlens``; priced here as a batch of equal sequences, the same chunks). This
script prices the same calls with `fxlens.rules.gdn` on the ``b200`` entry (roofline: the
larger of FLOPs at the fp16 share and bytes at the bandwidth share, plus the state kernel's
serial steps, whose per-step figure for Blackwell is read from this same table) and prints
both::

    .venv/bin/python bench/gdn_kernel.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fxlens.analyzer.capture.hf_gdn  # noqa: E402,F401  (registers fxlens_gdn::chunk)
from fxlens.analyzer.core.costs import Cost  # noqa: E402
from fxlens.analyzer.time.roofline import dtype_key, serial_seconds  # noqa: E402
from fxlens.rules.hardware import device  # noqa: E402
from tests.helpers import T, cost_of  # noqa: E402

SOURCE = "https://github.com/vllm-project/vllm/pull/38981"
HEAD_DIM = 128
CHUNK = 64
# (heads per GPU, sequences × tokens, q/k heads, value heads, FLA's milliseconds)
PUBLISHED = (
    ("397B/122B TP8", 1, 8192, 2, 8, 0.362),
    ("397B/122B TP8", 1, 4096, 2, 8, 0.263),
    ("397B/122B TP8", 1, 2048, 2, 8, 0.204),
    ("397B/122B TP8", 8, 1024, 2, 8, 0.229),
    ("397B/122B TP8", 4, 2048, 2, 8, 0.230),
    ("397B/122B TP4", 1, 8192, 4, 16, 0.412),
)


def predicted_s(sequences: int, tokens: int, k_heads: int, heads: int, device_name: str,
                dtype: str = "float16", per_channel: bool = False
                ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(time, compute time, memory time, serial steps' time) in seconds of one call's forward
    and of its backward (``fxlens_gdn::chunk`` and ``chunk_backward``, q/k normalised in the
    kernel) on the registry device `device_name`: the larger of FLOPs at the dtype's share of
    the peak and bytes at the bandwidth's share, plus the state kernels' serial steps where
    the device's step is measured, as the roofline prices one kernel op."""
    gpu = device(device_name)
    qk = T(sequences, tokens, k_heads, HEAD_DIM, dtype=dtype)
    v = T(sequences, tokens, heads, HEAD_DIM, dtype=dtype)
    g = T(sequences, tokens, heads, *((HEAD_DIM,) if per_channel else ()))
    beta = T(sequences, tokens, heads, dtype=dtype)
    forward = cost_of("fxlens_gdn.chunk.default", qk, qk, v, g, beta, CHUNK, True)
    solved = T(sequences, tokens, heads, (2 if per_channel else 1) * CHUNK, dtype=dtype)
    backward = cost_of("fxlens_gdn.chunk_backward.default", v, qk, qk, v, g, beta, solved,
                       CHUNK, True)

    def roofline(cost: Cost) -> tuple[float, ...]:
        compute = cost.flops / gpu.achievable_flops(dtype_key(dtype))
        memory = (cost.bytes_read + cost.bytes_written) / gpu.achievable_bandwidth
        serial = serial_seconds(cost.recurrence, gpu)
        return max(compute, memory) + serial, compute, memory, serial

    return roofline(forward), roofline(backward)


def predicted_ms(sequences: int, tokens: int, k_heads: int, heads: int) -> tuple[float, ...]:
    """(time, compute, memory, serial steps) of one forward call on the B200, in ms."""
    forward, _ = predicted_s(sequences, tokens, k_heads, heads, "b200")
    return tuple(1e3 * seconds for seconds in forward)


def fitted_step_s() -> tuple[float, float]:
    """(step, fixed part) in seconds: the least-squares line through the single-sequence rows
    of one head count (their measured time less fxlens's roofline, against the chunks one
    program walks), where the Blackwell entries' `recurrence_step_s` comes from."""
    def roofline_s(tokens: int, k_heads: int, heads: int) -> float:
        _, compute, memory, _ = predicted_s(1, tokens, k_heads, heads, "b200")[0]
        return max(compute, memory)

    rows = [(math.ceil(tokens / CHUNK), measured * 1e-3 - roofline_s(tokens, k_heads, heads))
            for name, sequences, tokens, k_heads, heads, measured in PUBLISHED
            if sequences == 1 and name == PUBLISHED[0][0]]
    mean_x = sum(x for x, _ in rows) / len(rows)
    mean_y = sum(y for _, y in rows) / len(rows)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in rows)
             / sum((x - mean_x) ** 2 for x, _ in rows))
    return slope, mean_y - slope * mean_x


def main() -> None:
    print(f"source: {SOURCE} (B200, fp16, head dim {HEAD_DIM})\n")
    print("| heads | sequences × tokens | q/k, v heads | FLA measured | fxlens (compute, "
          "memory, serial steps) | measured − fxlens | measured ÷ fxlens |")
    print("|---|---|---|---:|---:|---:|---:|")
    for name, sequences, tokens, k_heads, heads, measured in PUBLISHED:
        time, compute, memory, serial = predicted_ms(sequences, tokens, k_heads, heads)
        print(f"| {name} | {sequences} × {tokens:,} | {k_heads}, {heads} | {measured:.3f} ms | "
              f"{time:.3f} ms ({compute:.3f}, {memory:.3f}, {serial:.3f}) | "
              f"{measured - time:.3f} ms | {measured / time:.1f}× |")


if __name__ == "__main__":
    main()
