"""The combined quantization ranking against its two inputs at several calibration sizes (issue 35).

For each model trained here (`tests/analyzer/ranking_sizes.py`: the five of
`bench/quant_ranking.py` and two whose data-free score ranks well), each seed and each
calibration size (batches of `--rows` examples drawn from the model's calibration pool,
never from the held-out data), one `quant_section` run gives three rankings of the weight
matrices at each of its four formats:

- calibrated: the damage measured on the calibration batches;
- data-free: the Fisher on synthetic inputs (no data);
- combined: the two weighed by their uncertainties (`fxlens.analyzer.quant.combine`), the
  score that ranks, gives the verdicts and sizes the plan.

Truth: each matrix quantized alone, the KL of the model's own held-out predictions (the
relative output error power for the regression), as `bench/quant_ranking.py` measures it.
Each cell: median Spearman ρ over the rows (formats × seeds × draws) · rows whose first-ranked
layer is the truly worst · rows whose pick is the worst or tied with it (`ranking_models.tied`).
One calibration set per seed is itself a sample (which two rows it drew decides close pairs);
``--draws K`` ranks K calibration sets drawn from the same pool per model, seed and size.

    .venv/bin/python bench/quant_combined.py                  # 7 models × 3 seeds × 3 sizes
    .venv/bin/python bench/quant_combined.py --draws 4        # 4 calibration sets each
    .venv/bin/python bench/quant_combined.py --seeds 0 --models gru --batches 8
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
from tests.analyzer import ranking_sizes as rs  # noqa: E402

SCORES = ("calibrated", "data-free", "combined")


def _cell(rows: list[rm.Row], kind: str) -> str:
    rho = statistics.median(r.rho[kind] for r in rows)
    first = sum(r.worst_first[kind] for r in rows)
    close = sum(r.worst_or_tied[kind] for r in rows)
    return f"{rho:.2f} · {first}/{len(rows)} · {close}"


def _line(label: str, size: int, rows: list[rm.Row]) -> str:
    return (f"| {label} | {size} | {len(rows)} | "
            + " | ".join(_cell(rows, k) for k in SCORES) + " |")


def _verdicts(found: dict[int, list[rm.Row]], models: list[str]) -> list[str]:
    """Issue 35's two criteria, per size and (at the smallest size) per model."""
    out = []
    for size, rows in found.items():
        rho = {k: statistics.median(r.rho[k] for r in rows) for k in SCORES}
        first = {k: sum(r.worst_first[k] for r in rows) for k in SCORES}
        best_rho = max(rho["calibrated"], rho["data-free"])
        best_first = max(first["calibrated"], first["data-free"])
        out.append(f"{size} batches: combined ρ {rho['combined']:.3f} vs best input "
                   f"{best_rho:.3f} ({'ok' if rho['combined'] >= best_rho else 'BELOW'}); "
                   f"worst first {first['combined']} vs {best_first} "
                   f"({'ok' if first['combined'] >= best_first else 'BELOW'})")
    smallest = min(found)
    for model in models:
        rows = [r for r in found[smallest] if r.model == model]
        if rows:
            combined = statistics.median(r.rho["combined"] for r in rows)
            free = statistics.median(r.rho["data-free"] for r in rows)
            verdict = "ok" if combined >= free - 0.05 else "MORE THAN 0.05 BELOW"
            out.append(f"{smallest} batches, {model}: combined ρ {combined:.3f}, data-free "
                       f"{free:.3f} ({verdict})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--models", nargs="+", default=list(rs.CASES), choices=list(rs.CASES))
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--rows", type=int, default=2, help="examples per calibration batch")
    parser.add_argument("--draws", type=int, default=1,
                        help="calibration sets drawn per model, seed and size (rows × draws)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    found: dict[int, list[rm.Row]] = {size: [] for size in args.batches}
    names: list[str] = []
    for name in args.models:
        for seed in args.seeds:
            start = time.perf_counter()
            case = rs.CASES[name](seed)
            for size, rows in rs.size_rows(name, case, seed, args.batches, args.rows,
                                           args.draws).items():
                found[size] += rows
            names.append(case.name)
            print(f"{case.name} seed {seed}: {time.perf_counter() - start:.1f} s",
                  file=sys.stderr)
    models = list(dict.fromkeys(names))
    lines = ["| model | batches | rows | " + " | ".join(
        f"{k} ρ · worst first · or tied" for k in SCORES) + " |", "|---|---:|---:|---|---|---|"]
    for model in models:
        for size in args.batches:
            lines.append(_line(model, size, [r for r in found[size] if r.model == model]))
    for size in args.batches:
        lines.append(_line("**all**", size, found[size]))
    print("\n".join(lines + [""] + _verdicts(found, models)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
