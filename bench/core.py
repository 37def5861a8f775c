"""Core benchmark: wall time and peak RSS of `analyze` on big presets, beside FlopCounterMode.

    .venv/bin/python bench/core.py [--repeat 3] [--out bench/results/core.md]

Each case runs in its own process (so peak RSS is that process's alone, read from wait4);
times are medians over `--repeat` runs. Both tools load the same meta-device model. Targets
(issue 2): llama-2-7b under 15 s and llama-3-70b under 40 s end to end at seq 2048, each
under 1.5 GiB peak RSS; GPT-2 no more than 2× FlopCounterMode's time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CASES = (
    ("hf:gpt2", 1024),
    ("hf:llama-2-7b", 2048),
    ("hf:llama-3-70b", 2048),
)


@dataclass(frozen=True)
class Run:
    seconds: float
    peak_rss_bytes: int
    output: str


def run(command: list[str]) -> Run:
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    out = proc.stdout.read() if proc.stdout else ""
    err = proc.stderr.read() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{err[-2000:]}")
    return Run(seconds, usage.ru_maxrss * 1024, out.strip())


def median_run(command: list[str], repeat: int) -> tuple[float, int, str]:
    runs = [run(command) for _ in range(repeat)]
    return (statistics.median(r.seconds for r in runs),
            max(r.peak_rss_bytes for r in runs), runs[-1].output)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "core.md")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for target, seq_len in CASES:
            report = Path(folder) / "report.json"
            ours = median_run([sys.executable, "-m", "fxlens", target, "--seq-len", str(seq_len),
                               "--quiet", "--json", str(report)], args.repeat)
            ours = (*ours[:2], str(json.loads(report.read_text())["totals"]["flops"]))
            theirs = median_run([sys.executable, str(HERE / "flop_counter_baseline.py"), target,
                                 "--seq-len", str(seq_len)], args.repeat)
            rows.append((target, seq_len, ours, theirs))
            print(f"{target}: fxlens {ours[0]:.1f} s {ours[1] / 2**30:.2f} GiB · "
                  f"FlopCounterMode {theirs[0]:.1f} s {theirs[1] / 2**30:.2f} GiB", file=sys.stderr)
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}; median of {args.repeat} runs, each in its own process.",
        "",
        "| model | seq | fxlens time | fxlens peak RSS | FlopCounterMode time | "
        "FlopCounterMode peak RSS | time ratio | fxlens FLOPs | FlopCounterMode FLOPs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for target, seq_len, ours, theirs in rows:
        lines.append(
            f"| {target} | {seq_len} | {ours[0]:.1f} s | {ours[1] / 2**30:.2f} GiB | "
            f"{theirs[0]:.1f} s | {theirs[1] / 2**30:.2f} GiB | {ours[0] / theirs[0]:.2f}× | "
            f"{float(ours[2]):.3e} | {float(theirs[2]):.3e} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
