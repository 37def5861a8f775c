"""``analyze diff OLD NEW``: compare two versions of a model and gate a merge on the deltas.

    analyze diff old_model.py new_model.py
    analyze diff main.report.json pr.report.json --md comment.md --fail-on "flops:+2%"
    analyze diff git:main:models/net.py models/net.py

Each side is a report JSON (``*.json``, never executed), a model target (``model.py``,
``pkg.module:function``, ``hf:<preset>``) analyzed on the fly with the given options, or
``git:REF:path`` (a model file, or a report JSON, as it was at REF; see
`fxlens.analyzer.review.git_source` for what is taken from the ref). `against_baseline` is the same
review for ``analyze my_model.py --baseline main.report.json --fail-on ...``.

Exit codes: 0 no gate tripped, 1 a gate tripped, 2 could not run.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from fxlens.analyzer.capture.chain import METHODS
from fxlens.analyzer.core.errors import ReportError
from fxlens.analyzer.core.report import Report, load_report
from fxlens.analyzer.review.diff import ReportDiff, compare, diff_to_json
from fxlens.analyzer.review.gates import Gate, GateResult, check_gates, parse_gates
from fxlens.analyzer.review.git_source import PREFIX, git_checkout, parse_git_target
from fxlens.api import AnalysisOptions, analyze_target
from fxlens.cli.console import EXIT_GATE, EXIT_OK, err, out

GATE_HELP = ('fail (exit 1) when a metric grows past a threshold: "flops:+2%%,peak_memory:+5%%,'
             'params:+0"; metrics: flops, macs, params, param_bytes, bytes_read, '
             'bytes_written, peak_memory, step_peak, time')


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="analyze diff",
        description="Compare two versions of a model: per-module deltas, totals, gates. "
                    "OLD and NEW: a report .json, a model target (model.py, pkg.module:fn, "
                    "hf:<preset>) or git:REF:path/to/model.py.",
    )
    parser.add_argument("old", help="baseline: report .json, model target or git:REF:path")
    parser.add_argument("new", help="candidate: report .json, model target or git:REF:path")
    parser.add_argument("--fail-on", metavar="GATES", help=GATE_HELP)
    parser.add_argument("--md", type=Path, help="write a Markdown PR comment here")
    parser.add_argument("--html", type=Path, help="write a self-contained HTML diff page here")
    parser.add_argument("--json", type=Path, help="write the diff as JSON here")
    parser.add_argument("--top", type=int, default=20, help="module rows in the terminal table")
    model = parser.add_argument_group("when a side is a model, analyze it with")
    model.add_argument("--entry", help="factory function in the model file (default: build)")
    model.add_argument("--batch", type=int, help="batch size of the example inputs")
    model.add_argument("--seq-len", type=int, help="sequence length of the example inputs")
    model.add_argument("--image-size", type=int, help="image side of the example inputs")
    model.add_argument("--train", action="store_true", help="one training step")
    model.add_argument("--strict", action="store_true", help="a failing cost rule is fatal")
    parser.add_argument("--quiet", action="store_true", help="no tables, files and gates only")
    parser.add_argument("--debug", action="store_true", help="tracebacks and debug logging")
    return parser


def run(args: argparse.Namespace) -> int:
    gates = parse_gates(args.fail_on) if args.fail_on else ()
    options = AnalysisOptions(
        entry=args.entry, methods=METHODS, strict=args.strict, train=args.train,
        sizes={"batch": args.batch, "seq_len": args.seq_len, "image_size": args.image_size},
    )
    old = load_side(args.old, options)
    new = load_side(args.new, options)
    return review(compare(old, new), gates, args)


def against_baseline(report: Report, baseline: str | None, fail_on: str | None,
                     options: AnalysisOptions, quiet: bool = False) -> int:
    """``analyze TARGET --baseline B --fail-on G``: compare `report` with B and apply G."""
    if baseline is None:
        raise ReportError("--fail-on needs --baseline (a report .json, a model or "
                          "git:REF:path) to compare against")
    gates = parse_gates(fail_on) if fail_on else ()
    diff = compare(load_side(baseline, options), report)
    settings = argparse.Namespace(quiet=quiet, top=20, md=None, html=None, json=None)
    return review(diff, gates, settings)


def load_side(spec: str, options: AnalysisOptions) -> Report:
    """A report JSON, a model target analyzed now, or ``git:REF:path`` (either of those)."""
    if spec.startswith(PREFIX):
        target = parse_git_target(spec)
        with git_checkout(target) as path:
            report = _load_local(str(path), options)
        return dataclasses.replace(report, model=dataclasses.replace(report.model, source=spec))
    return _load_local(spec, options)


def _load_local(spec: str, options: AnalysisOptions) -> Report:
    if spec.endswith(".json"):
        return load_report(Path(spec))
    with err.status(f"analyzing {spec}…") as status:
        return analyze_target(spec, options, on_step=lambda step: status.update(f"{step}…"))


def review(diff: ReportDiff, gates: Sequence[Gate], args: argparse.Namespace) -> int:
    """Evaluate gates, print the tables, write the requested files; the exit code."""
    from fxlens.reports.diff_terminal import gates_table, render_diff_terminal

    results = check_gates(diff, gates)
    if not args.quiet:
        out.print(render_diff_terminal(diff, results, top=args.top))
    elif results:
        out.print(gates_table(results))
    for path in _write_files(diff, results, args):
        err.print(f"wrote {path}")
    tripped = [r for r in results if r.tripped]
    if tripped:
        err.print(f"{len(tripped)} gate(s) tripped: " + ", ".join(r.gate.text for r in tripped),
                  markup=False, highlight=False)
        return EXIT_GATE
    return EXIT_OK


def _write_files(diff: ReportDiff, results: Sequence[GateResult],
                 args: argparse.Namespace) -> list[Path]:
    from fxlens.reports.diff_html import render_diff_html
    from fxlens.reports.diff_markdown import render_diff_markdown

    renderers = (
        (args.md, lambda: render_diff_markdown(diff, results)),
        (args.html, lambda: render_diff_html(diff, results)),
        (args.json, lambda: diff_to_json(diff, (r.to_dict() for r in results))),
    )
    written = []
    for path, render in renderers:
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(render(), encoding="utf-8")
            written.append(Path(path))
    return written
