"""GEMM shapes swept for the next lent GPU: where one kernel's roofline is most optimistic
(issue 31's multi-GPU serving rows, issue 30's MoE rows).

The serving kernels measured on an H200 (`bench/gpu/serving.py`, bench/README.md) left two
effects with one point each: a TP shard's narrow QKV projection (N = 2,560) at M = 256 ran at
420 TFLOP/s where the roofline expects the GEMM rate (too few output tiles for 132 SMs), and
DeepSeek-V3's decode experts (32 rows each) streamed their weights at 62 % of the bandwidth
where the entry assumes 80 %. A figure needs the shape of each effect, so this sweeps them,
timed and predicted exactly as `serving.py` times and predicts its cases (a CUDA graph of
`inner` calls; fxlens's roofline per kernel without host launches):

- `linear`: bf16 ``x @ W`` at K = 8,192, M from 64 to 1,024 tokens, N from 1,024 (a TP-8
  shard's QKV) to 14,336 (a whole layer's gate+up): output tiles from a few to hundreds;
- `experts`: one rank's grouped expert MLP (hidden 4,096, expert width 1,536) with 8 to 128
  local experts at 8 to 512 rows each: from streaming weights to compute-bound.

    python -m bench.gpu.sweeps --measure --out sweeps.json           # on the GPU, ~1 min
    python -m bench.gpu.sweeps --predict sweeps.json --device h200   # anywhere: the table
"""

from __future__ import annotations

from typing import Any

import torch

from .serving import ServingCase, predict_row, table
from .serving import measure as measure_cases

TOKENS = (64, 128, 256, 512, 1024)
WIDTHS = (1024, 2560, 5120, 8192, 14336)
EXPERTS = (8, 32, 128)
ROWS = (8, 32, 128, 512)

CASES = (
    *(ServingCase(f"linear M {m} N {n}", "linear", {"m": m, "k": 8192, "n": n})
      for m in TOKENS for n in WIDTHS),
    *(ServingCase(f"experts {e} × {r} rows", "experts",
                  {"experts": e, "rows": r, "hidden": 4096, "ffn": 1536})
      for e in EXPERTS for r in ROWS),
)


def measure(device: torch.device) -> list[dict[str, Any]]:
    return measure_cases(device, cases=CASES)


def main() -> None:
    from .measure import measure_and_predict

    measure_and_predict(__doc__ or "", "sweeps.json", "h200", measure, predict_row, table)


if __name__ == "__main__":
    main()
