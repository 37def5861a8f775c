"""Quantization sensitivity rankings against the damage measured for real (issue 16).

For each small model trained here (`tests/analyzer/ranking_models.py`: deep MLP, BatchNorm +
depthwise CNN, 3-layer GRU, regression MLP with planted function-preserving outlier channels,
4-block character LM) and each seed: every weight matrix is quantized alone at each of the
section's formats (BatchNorms folded first), and the damage is measured on held-out data two
ways — the distortion of the model's own predictions (KL to the full-precision model; relative
output error power for the regression), the primary metric, and the increase of the task loss.
fxlens's rankings are compared with it by Spearman ρ and by whether the layer fxlens ranks
worst is the truly worst (✓; else the true damage of fxlens's pick ÷ the worst's, after ≈ where
the held-out rows cannot tell the pick from the worst — a paired test over the rows' damages,
`ranking_models.tied` — and after ✗ where they can). The summary counts the rows whose pick is
the worst, then those whose pick is the worst or tied with it, and in parentheses those whose
pick does at least 90 % of the worst's damage:

- calibrated: the section's calibrated score (KL measured on the calibration split for every
  layer when layers × formats ≤ 128, else for the Fisher's top 8 per format);
- fisher: the calibrated Fisher alone;
- data-free: the section's data-free score (Fisher on synthetic inputs shaped like the example
  inputs, distilled from BatchNorm statistics where there are any);
- prior: the weights-only prior (no forward at all);
- combined: calibrated and data-free weighed by their uncertainties (issue 35,
  `fxlens.analyzer.quant.combine`): the score that ranks; `bench/quant_combined.py` compares
  it with its inputs at calibration sizes of 8, 32 and 128 batches.

Targets (issue 16): calibrated median ρ ≥ 0.9 with the worst layer first in ≥ 90 % of rows;
data-free median ρ ≥ 0.6.

    .venv/bin/python bench/quant_ranking.py                    # 3 seeds, every model
    .venv/bin/python bench/quant_ranking.py --seeds 0 --models deep_mlp gru
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.analyzer import ranking_models as rm  # noqa: E402

SCORES = rm.SCORES
NEAR = 0.9      # in the summary's parentheses: rows whose first pick does ≥ 90 % of the worst


def _summary(rows: list[rm.Row], metric: str, label: str = "all") -> list[str]:
    chosen = [r for r in rows if r.metric == metric]
    if not chosen:
        return []
    cells = []
    for kind in SCORES:
        rho = statistics.median(r.rho[kind] for r in chosen)
        first = sum(r.worst_first[kind] for r in chosen)
        close = sum(r.worst_or_tied[kind] for r in chosen)
        near = sum(r.first_ratio[kind] >= NEAR for r in chosen)
        cells.append(f"{rho:.2f} · {first}/{len(chosen)} · {close} ({near})")
    return [f"| **{label}, {metric}** | | {len(chosen)} rows | " + " | ".join(cells) + " |"]


def _pick(row: rm.Row, kind: str) -> str:
    if row.worst_first[kind]:
        return "✓"
    return f"{'≈' if row.worst_or_tied[kind] else '✗'} {row.first_ratio[kind]:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--models", nargs="+", default=list(rm.CASES), choices=list(rm.CASES))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows: list[rm.Row] = []
    lines = ["| model | seed | format · damage | " + " | ".join(
        f"{k} ρ · worst first" for k in SCORES) + " |",
        "|---|---|---|" + "---|" * len(SCORES)]
    for name in args.models:
        for seed in args.seeds:
            start = time.perf_counter()
            case = rm.CASES[name](seed)
            trained = time.perf_counter()
            found = rm.ranking_rows(case)
            print(f"{case.name} seed {seed}: trained in {trained - start:.1f} s, ranked and "
                  f"measured in {time.perf_counter() - trained:.1f} s", file=sys.stderr)
            rows += found
            for r in sorted(found, key=lambda r: (r.metric != "distortion", r.format)):
                cells = [f"{r.rho[k]:+.2f} " + _pick(r, k) for k in SCORES]
                lines.append(f"| {r.model} ({r.layers}) | {seed} | {r.format} · {r.metric} | "
                             + " | ".join(cells) + " |")
    for model in dict.fromkeys(r.model for r in rows):
        lines += _summary([r for r in rows if r.model == model], "distortion", model)
    lines += _summary(rows, "distortion") + _summary(rows, "loss")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
