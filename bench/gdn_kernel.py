"""The gated delta rule's forward kernel against published flash-linear-attention timings.

vLLM's PR #38981 ("[Perf][GDN] Align TMA usage with upstream FLA", merged; the description's
table) timed ``fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule_fwd`` on an NVIDIA B200,
fp16, head dim 128, at Qwen3.5-397B's and -122B's linear-attention heads per GPU under
tensor parallelism 8 and 4, for one sequence and for several sequences of the same total
(varlen ``cu_seqlens``; priced here as a batch of equal sequences, the same chunks). This
script prices the same calls with `fxlens.rules.gdn` on the ``b200`` entry (roofline: the
larger of FLOPs at the fp16 share and bytes at the bandwidth share) and prints both::

    .venv/bin/python bench/gdn_kernel.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fxlens.analyzer.capture.hf_gdn  # noqa: E402,F401  (registers fxlens_gdn::chunk)
from fxlens.rules.hardware import device  # noqa: E402
from tests.helpers import T, cost_of  # noqa: E402

SOURCE = "https://github.com/vllm-project/vllm/pull/38981"
HEAD_DIM = 128
# (heads per GPU, sequences × tokens, q/k heads, value heads, FLA's milliseconds)
PUBLISHED = (
    ("397B/122B TP8", 1, 8192, 2, 8, 0.362),
    ("397B/122B TP8", 1, 4096, 2, 8, 0.263),
    ("397B/122B TP8", 1, 2048, 2, 8, 0.204),
    ("397B/122B TP8", 8, 1024, 2, 8, 0.229),
    ("397B/122B TP8", 4, 2048, 2, 8, 0.230),
    ("397B/122B TP4", 1, 8192, 4, 16, 0.412),
)


def predicted_ms(sequences: int, tokens: int, k_heads: int, heads: int) -> tuple[float, ...]:
    """(time, compute time, memory time) of one forward call, in milliseconds."""
    b200 = device("b200")
    qk = T(sequences, tokens, k_heads, HEAD_DIM, dtype="float16")
    v = T(sequences, tokens, heads, HEAD_DIM, dtype="float16")
    cost = cost_of("fxlens_gdn.chunk.default", qk, qk, v, T(sequences, tokens, heads),
                   T(sequences, tokens, heads, dtype="float16"), 64, True)
    compute = cost.flops / b200.achievable_flops("fp16")
    memory = (cost.bytes_read + cost.bytes_written) / b200.achievable_bandwidth
    return 1e3 * max(compute, memory), 1e3 * compute, 1e3 * memory


def main() -> None:
    print(f"source: {SOURCE} (B200, fp16, head dim {HEAD_DIM})\n")
    print("| heads | sequences × tokens | q/k, v heads | FLA measured | fxlens (compute, "
          "memory) | measured ÷ fxlens |")
    print("|---|---|---|---:|---:|---:|")
    for name, sequences, tokens, k_heads, heads, measured in PUBLISHED:
        time, compute, memory = predicted_ms(sequences, tokens, k_heads, heads)
        print(f"| {name} | {sequences} × {tokens:,} | {k_heads}, {heads} | {measured:.3f} ms | "
              f"{time:.3f} ms ({compute:.3f}, {memory:.3f}) | {measured / time:.1f}× |")


if __name__ == "__main__":
    main()
