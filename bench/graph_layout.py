"""Graph layout time of a big preset: graphviz on the collapsed DOT, shared inputs drawn once
against one edge per layer (`fxlens.reports.dot.SHARED_FANOUT`).

    .venv/bin/analyze hf:llama-3-70b --seq-len 2048 --json l70.json --no-pages --quiet
    .venv/bin/python bench/graph_layout.py l70.json
"""

from __future__ import annotations

import sys
import time

from fxlens.analyzer.core.report import load_report
from fxlens.reports import dot


def main(path: str) -> None:
    report = load_report(path)
    for fanout, what in ((10**9, "an edge per layer"), (dot.SHARED_FANOUT, "shared drawn once")):
        dot.SHARED_FANOUT = fanout
        source = dot.render_dot(report)
        start = time.perf_counter()
        try:
            dot.graphviz_render(source, "svg", 120)
            took = f"{time.perf_counter() - start:.2f} s"
        except Exception as error:  # a layout past the budget is the finding, not a crash
            took = f"gave up after {time.perf_counter() - start:.0f} s ({error})"
        print(f"{what}: {source.count('->')} edges, layout {took}")


if __name__ == "__main__":
    main(sys.argv[1])
