"""A 48-point sweep's wall time on one worker and on two (``analyze sweep --workers``).

The grid: hf:gpt2 with 1–4 layers × sequence 32, 64, 128 × batch 1, 2, 4, 8 (forward
analysis, no pages). Each run is the whole command in its own process, into a fresh folder.

    .venv/bin/python bench/sweep_workers.py          # prints a Markdown table
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRID = ["hf:gpt2", "--set", "n_layer=1,2,3,4", "--seq-len", "32,64,128", "--batch", "1,2,4,8"]


def wall_s(workers: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fxlens", "sweep", *GRID, "--workers",
                        str(workers), "--out", folder, "--no-pages", "--quiet"],
                       check=True, cwd=ROOT)
        return time.perf_counter() - started


def main() -> None:
    one, two = wall_s(1), wall_s(2)
    print(f"{os.cpu_count()} cores")
    print("| points | 1 worker | 2 workers | speed-up |")
    print("|---|---|---|---|")
    print(f"| 48 | {one:.1f} s | {two:.1f} s | {one / two:.2f}× |")


if __name__ == "__main__":
    main()
