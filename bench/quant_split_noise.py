"""How often can a calibration split find the held-out worst layer at all? (issue 16)

`bench/quant_ranking.py` counts, on one calibration / held-out split per model and seed, the
rows whose calibrated pick is the held-out worst layer. Both splits are samples, so that count
is itself noisy. Here every weight matrix is quantized alone at each format and its damage
(the distortion: KL per logit row, or a regression's relative error power per row) measured
on the calibration and the held-out rows alike (`ranking_models.true_damage`); the rows are
pooled and re-split `--splits` times at the bench's sizes (an LM's windows are kept whole).
On each split, the layer the calibration rows put worst is compared with the held-out worst,
ranked two ways:

- mean: the plain mean of the calibration rows' damage;
- capped: fxlens's measured KL, `fxlens.analyzer.quant.calibrated.tail_capped_mean` (a
  regression's output SQNR is a plain mean in fxlens, so its rows count alike in both).

Each cell: expected rows whose pick is the worst (mean over the re-splits) · on the bench's own
split. The calibrated score of `quant_ranking.py` is the capped column's ranking wherever every
layer is measured (layers × formats ≤ 128: all five models here).

    .venv/bin/python bench/quant_split_noise.py                  # 3 seeds, every model
    .venv/bin/python bench/quant_split_noise.py --seeds 3 4 5 6 7 --splits 200
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fxlens.analyzer.quant.calibrated import tail_capped_mean  # noqa: E402
from fxlens.rules.quant import knowledge  # noqa: E402
from tests.analyzer import ranking_models as rm  # noqa: E402

Ranker = Callable[[torch.Tensor], int]      # layers × rows → the layer ranked worst


def _mean_pick(rows: torch.Tensor) -> int:
    return int(rows.mean(1).argmax())


def _capped_pick(rows: torch.Tensor) -> int:
    return max(range(len(rows)), key=lambda i: tail_capped_mean(rows[i]))


def _found(calibration: torch.Tensor, held_out: torch.Tensor, rank: Ranker) -> bool:
    truth = held_out.mean(1)
    return bool(truth[rank(calibration)] >= truth.max())


def format_rows(calibration: torch.Tensor, held_out: torch.Tensor, per_unit: int,
                rankers: dict[str, Ranker], splits: int, g: torch.Generator
                ) -> dict[str, tuple[float, bool]]:
    """ranker → (share of re-splits whose pick is the held-out worst, found on this split).
    `calibration`, `held_out`: layers × rows; `per_unit` rows stay together (a window)."""
    pooled = torch.cat([calibration, held_out], 1)
    units = pooled.reshape(len(pooled), -1, per_unit)
    n_cal = calibration.shape[1] // per_unit
    hits = dict.fromkeys(rankers, 0)
    for _ in range(splits):
        order = torch.randperm(units.shape[1], generator=g)
        cal = units[:, order[:n_cal]].reshape(len(pooled), -1)
        held = units[:, order[n_cal:]].reshape(len(pooled), -1)
        for name, rank in rankers.items():
            hits[name] += _found(cal, held, rank)
    return {name: (hits[name] / splits, _found(calibration, held_out, rank))
            for name, rank in rankers.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--models", nargs="+", default=list(rm.CASES), choices=list(rm.CASES))
    parser.add_argument("--splits", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    formats = list(knowledge().formats)
    g = torch.Generator().manual_seed(0)
    lines = ["| model | rows | mean: expected · this split | capped: expected · this split |",
             "|---|---|---|---|"]
    totals: dict[str, list[float]] = {"mean": [0.0, 0.0], "capped": [0.0, 0.0]}
    count = 0
    for name in args.models:
        found: dict[str, list[float]] = {"mean": [0.0, 0.0], "capped": [0.0, 0.0]}
        rows = 0
        for seed in args.seeds:
            case = rm.CASES[name](seed)
            rankers: dict[str, Ranker] = {
                "mean": _mean_pick,
                "capped": _capped_pick if case.task == "classify" else _mean_pick}
            held = rm.true_damage(case, formats, ["distortion"])
            cal = rm.true_damage(rm.on_calibration(case), formats, ["distortion"])
            first = next(iter(cal[formats[0], "distortion"].values()))
            per_unit = len(first) // len(case.calibration[0][0])     # rows per example
            for fmt in formats:
                layers = list(held[fmt, "distortion"])
                stack = [torch.stack([d[fmt, "distortion"][n] for n in layers])
                         for d in (cal, held)]
                for kind, (expected, here) in format_rows(*stack, per_unit, rankers,
                                                          args.splits, g).items():
                    found[kind][0] += expected
                    found[kind][1] += here
                rows += 1
            print(f"{case.name} seed {seed} done", file=sys.stderr)
        lines.append(f"| {case.name} | {rows} | " + " | ".join(
            f"{found[k][0]:.1f} · {found[k][1]:.0f}" for k in ("mean", "capped")) + " |")
        for k in totals:
            totals[k][0] += found[k][0]
            totals[k][1] += found[k][1]
        count += rows
    lines.append(f"| **all** | {count} | " + " | ".join(
        f"**{totals[k][0]:.1f} · {totals[k][1]:.0f}**" for k in ("mean", "capped")) + " |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
