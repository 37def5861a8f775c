"""Speed of `liveness` on a big real graph (kept out of the test suite: no timed tests).

    .venv/bin/python bench/liveness.py [hf:llama-3-70b] [--seq-len 2048] [--repeat 5]

Captures the preset once, then times `liveness` in both lifetime modes (median of runs).
"""

from __future__ import annotations

import argparse
import statistics
import time

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.capture.load import load
from fxlens.analyzer.memory.liveness import Lifetimes, liveness
from fxlens.rules import load_rules


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", nargs="?", default="hf:llama-3-70b")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    loaded = load(args.target, sizes={"seq_len": args.seq_len})
    registry = load_rules()
    graph = capture(loaded.module, loaded.inputs, registry)
    calls = sum(1 for _ in graph.calls())
    for mode in Lifetimes:
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            liveness(graph, registry, mode)
            times.append(time.perf_counter() - start)
        print(f"{args.target} ({calls} call nodes), {mode.value}: "
              f"median {statistics.median(times):.3f} s over {args.repeat} runs")


if __name__ == "__main__":
    main()
