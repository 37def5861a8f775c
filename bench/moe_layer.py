"""One Megatron-core MoE layer, forward and backward on 8 H100s, against fxlens's plan (issue 30).

NVIDIA's MoE layer performance test (Megatron-LM ``tests/functional_tests/test_cases/common/
moe_perf``) times one ``MoELayer`` — router, token dispatcher, grouped-GEMM experts, shared
expert — at expert parallelism 8 for two proxies (Mixtral's and DeepSeek-V3's shapes), three
dispatchers (all-to-all, DeepEP, HybridEP) and two precisions, and keeps the timings as its
regression baseline (`plan_runs/megatron_moe_layer.json`, with the source). This script plans
the same layer (`plan_runs/megatron_moe_layer.py`) as a user would::

    analyze plan_runs/megatron_moe_layer.py --entry mixtral|deepseek --precision bf16|fp8
        --optimizer sgd --plan --strategy dp=8,ep=8,dispatch=D --micro-batches 1 --device h100

once as captured and once with ``--fused``, and compares per pass: the forward is the plan's
forward compute plus the forward's two all-to-alls (dispatch and combine), the backward its
backward compute plus the other two (the same volumes, reversed). The peak is the plan's per
GPU (plain SGD: no optimizer state, as the test holds none) against the test's
``torch.cuda.max_memory_allocated`` over forward and backward.

    .venv/bin/python bench/moe_layer.py [--out results.json]    # about 8 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CASES = HERE / "plan_runs" / "megatron_moe_layer.json"
MODEL = HERE / "plan_runs" / "megatron_moe_layer.py"
MODES = ("eager", "fused")
GPUS = 8


def command(case: dict[str, Any], out: Path, mode: str) -> list[str]:
    argv = [sys.executable, "-m", "fxlens", str(MODEL), "--entry", case["proxy"],
            "--precision", case["precision"], "--optimizer", "sgd", "--plan",
            "--strategy", f"dp={GPUS},ep={GPUS},dispatch={case['dispatch']}",
            "--micro-batches", "1", "--device", "h100", "--no-pages", "--json", str(out),
            "--out", str(out.parent / "report")]
    return argv + (["--fused"] if mode == "fused" else [])


def predicted(layout: dict[str, Any]) -> dict[str, float]:
    """Forward and backward seconds of the layer, and its peak bytes per GPU."""
    t = layout["time"]
    all_to_all = sum(c["time_s"] for c in layout["collectives"] if c["kind"] == "all-to-all")
    backward = t["compute_s"] - t["forward_s"] - t["recompute_s"]
    return {"forward_s": t["forward_s"] + all_to_all / 2,
            "backward_s": backward + all_to_all / 2,
            "all_to_all_s": all_to_all, "peak_bytes": layout["memory"]["peak_bytes"]}


def predict(case: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"name": case["name"]}
    for mode in MODES:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "report.json"
            done = subprocess.run(command(case, out, mode), capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{case['name']} ({mode}): {done.stderr.strip()[-400:]}")
            layout = json.loads(out.read_text())["plan"]["layouts"][0]
        row[mode] = predicted(layout)
    return row


def error(predicted_s: float, measured_ms: float) -> float:
    return predicted_s * 1e3 / measured_ms - 1


def table(cases: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    by_name = {r["name"]: r for r in rows}
    lines = ["| case | measured fwd / bwd | fxlens fwd / bwd (error) | --fused fwd / bwd (error) "
             "| measured peak | --fused peak |", "|---|---:|---:|---:|---:|---:|"]
    for case in cases:
        row = by_name[case["name"]]
        cells = []
        for mode in MODES:
            m = row[mode]
            cells.append(f"{m['forward_s'] * 1e3:.2f} / {m['backward_s'] * 1e3:.2f} ms "
                         f"({error(m['forward_s'], case['forward_ms']):+.0%} / "
                         f"{error(m['backward_s'], case['backward_ms']):+.0%})")
        lines.append(f"| {case['name']} | {case['forward_ms']:.2f} / {case['backward_ms']:.2f} "
                     f"ms | {cells[0]} | {cells[1]} | "
                     f"{case['max_allocated_bytes'] / 2**30:.2f} GiB | "
                     f"{row['fused']['peak_bytes'] / 2**30:.2f} GiB |")
    for mode in MODES:
        layer = [error(by_name[c["name"]][mode]["forward_s"]
                       + by_name[c["name"]][mode]["backward_s"],
                       c["forward_ms"] + c["backward_ms"]) for c in cases]
        lines.append(f"\n{mode}: forward + backward median absolute error "
                     f"{statistics.median(abs(e) for e in layer):.0%} over {len(layer)} cases "
                     f"({min(layer):+.0%} … {max(layer):+.0%}).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the predictions as JSON")
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    args = parser.parse_args()
    cases = [c for c in json.loads(CASES.read_text())["cases"]
             if not args.only or c["name"] in args.only]
    rows = []
    for case in cases:
        rows.append(predict(case))
        print(f"{case['name']}: done", file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(table(cases, rows))


if __name__ == "__main__":
    main()
