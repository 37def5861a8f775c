"""fxlens's row of the peer benchmark: load, capture, cost, write the JSON report; no pages.

    .venv/bin/python bench/peers/fxlens_json.py TARGET [--seq-len N] --json PATH

The `analyze` CLI also writes graph.dot/graph.svg (graphviz's ``dot``), report.html and
summary.md by default, and has no switch to skip them; on hf:llama-3-70b ``dot -Tsvg`` alone
ran for over 3 minutes here. The peers only count, so fxlens is timed doing the same: the public
API (`fxlens.api.analyze_target`, the CLI's own path) up to the JSON report, nothing rendered.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `tests.models.*` targets, as -m

from fxlens.analyzer.core.report import write_report  # noqa: E402
from fxlens.api import AnalysisOptions, analyze_target  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("--seq-len", type=int)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    report = analyze_target(args.target, AnalysisOptions(sizes={"seq_len": args.seq_len}))
    write_report(report, args.json)


if __name__ == "__main__":
    main()
