"""``analyze diff OLD NEW``: compare two versions of a model and gate a merge on the deltas.

    analyze diff old_model.py new_model.py
    analyze diff main.report.json pr.report.json --md comment.md --fail-on "flops:+2%"
    analyze diff git:main:models/net.py models/net.py

Each side is a report JSON (``*.json``, never executed, validated on load: see
`fxlens.analyzer.core.report.load_report`), a model target (``model.py``,
``pkg.module:function``, ``hf:<preset>``) analyzed on the fly with the given options, or
``git:REF:path`` (a model file, or a report JSON, as it was at REF; see
`fxlens.analyzer.review.git_source` for what is taken from the ref). `against_baseline` is the
same review for ``analyze my_model.py --baseline main.report.json --fail-on ...``.

Gates, output paths and report sides are checked before any model side is analyzed: a gate
spec that does not parse, an empty one (``--fail-on ""``), a ``time`` gate with a side that
cannot have a time estimate, or a malformed report is one line and exit 2, never a pass.

Exit codes: 0 no gate tripped, 1 a gate tripped (and nothing else), 2 could not run, 3 a bug.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from fxlens.cli.args import Parser, add_loading_options, positive_int
from fxlens.cli.console import EXIT_GATE, EXIT_OK, err, out, say

GATE_HELP = ('fail (exit 1) when a metric grows past a threshold: "flops:+2%%,peak_memory:+5%%,'
             'params:+0"; metrics: flops, macs, params, param_bytes, bytes_read, '
             'bytes_written, peak_memory, step_peak, time')


@dataclasses.dataclass(frozen=True)
class Review:
    """A baseline to compare with and the gates to apply, checked before the analysis."""

    baseline: str
    gates: tuple[Any, ...]
    report: Any = None          # the baseline, already loaded when it is a report JSON


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    parser.add_argument("--top", type=positive_int, default=20,
                        help="module rows in the terminal table")
    model = parser.add_argument_group("when a side is a model, analyze it with")
    add_loading_options(model, overrides=False)
    model.add_argument("--train", action="store_true", help="one training step")
    model.add_argument("--strict", action="store_true", help="a failing cost rule is fatal")
    model.add_argument("--allow-large", action="store_true",
                       help="analyze a model however long its estimated capture")
    parser.add_argument("--quiet", action="store_true", help="no tables, files and gates only")
    parser.add_argument("--debug", action="store_true", help="tracebacks and debug logging")
    return parser


def run(args: argparse.Namespace) -> int:
    from fxlens.analyzer.core.files import check_writable
    from fxlens.analyzer.review.diff import compare
    from fxlens.api import AnalysisOptions
    from fxlens.pipeline import check_options

    gates = _gates(args.fail_on)
    _time_gate_needs_reports(gates, [args.old, args.new], "analyze diff analyzes a model side "
                             "without a device; compare report .json files written with "
                             "--device instead")
    for path in (args.md, args.html, args.json):
        if path is not None:
            check_writable(path)
    options = AnalysisOptions(
        entry=args.entry, strict=args.strict, train=args.train, allow_large=args.allow_large,
        sizes={"batch": args.batch, "seq_len": args.seq_len, "image_size": args.image_size},
    )
    check_options(options)
    # Report sides first: a malformed report fails in a second, before any model is analyzed.
    early = {spec: _load_report(spec) for spec in (args.old, args.new) if _is_report(spec)}
    old = early.get(args.old) or load_side(args.old, options, args.quiet)
    new = early.get(args.new) or load_side(args.new, options, args.quiet)
    return review(compare(old, new), gates, args)


def prepare_review(baseline: str | None, fail_on: str | None, device: str | None) -> Review:
    """``--baseline`` / ``--fail-on`` of the main command, checked before its analysis."""
    from fxlens.analyzer.core.errors import ReportError

    if baseline is None:
        raise ReportError("--fail-on needs --baseline (a report .json, a model or "
                          "git:REF:path) to compare against")
    gates = _gates(fail_on)
    if device is None and any(g.metric == "time" for g in gates):
        raise ReportError("--fail-on time needs an estimated time, hence --device (e.g. "
                          "--device h100); without one the new report has no time figure")
    _time_gate_needs_reports(gates, [baseline], "a model baseline is analyzed without a "
                             "device; use a report .json written with --device")
    return Review(baseline, gates, _load_report(baseline) if _is_report(baseline) else None)


def against_baseline(report: Any, review_of: Review, options: Any, quiet: bool = False,
                     tables: Console = out) -> int:
    """``analyze TARGET --baseline B --fail-on G``: compare `report` with B and apply G."""
    from fxlens.analyzer.review.diff import compare

    baseline = review_of.report or load_side(review_of.baseline, options, quiet)
    diff = compare(baseline, report)
    settings = argparse.Namespace(quiet=quiet, top=20, md=None, html=None, json=None)
    return review(diff, review_of.gates, settings, tables)


def _gates(fail_on: str | None) -> tuple[Any, ...]:
    """The parsed gates; ``--fail-on ""`` is an error (it would gate nothing), not a pass."""
    from fxlens.analyzer.review.gates import parse_gates

    return () if fail_on is None else parse_gates(fail_on)


def _time_gate_needs_reports(gates: Sequence[Any], sides: Sequence[str], why: str) -> None:
    from fxlens.analyzer.core.errors import ReportError

    if any(g.metric == "time" for g in gates) and not all(_is_report(s) for s in sides):
        raise ReportError(f"--fail-on time needs an estimated time on both sides; {why}")


def _is_report(spec: str) -> bool:
    return spec.endswith(".json") and not spec.startswith("git:")


def _load_report(spec: str) -> Any:
    from fxlens.analyzer.core.report import load_report

    return load_report(Path(spec))


def load_side(spec: str, options: Any, quiet: bool = False) -> Any:
    """A report JSON, a model target analyzed now, or ``git:REF:path`` (either of those)."""
    from fxlens.analyzer.review.git_source import PREFIX, git_checkout, parse_git_target

    if spec.startswith(PREFIX):
        target = parse_git_target(spec)
        with git_checkout(target) as path:
            report = _load_local(str(path), options, quiet)
        return dataclasses.replace(report, model=dataclasses.replace(report.model, source=spec))
    return _load_local(spec, options, quiet)


def _load_local(spec: str, options: Any, quiet: bool) -> Any:
    from fxlens.api import analyze_target
    from fxlens.reports.escape import terminal_escape

    if spec.endswith(".json"):
        return _load_report(spec)
    if quiet:
        return analyze_target(spec, options)
    with err.status(f"analyzing {terminal_escape(spec)}…") as status:
        return analyze_target(spec, options,
                              on_step=lambda step: status.update(f"{terminal_escape(step)}…"))


def review(diff: Any, gates: Sequence[Any], args: argparse.Namespace,
           tables: Console = out) -> int:
    """Evaluate gates, print the tables, write the requested files; the exit code."""
    from fxlens.analyzer.review.gates import check_gates
    from fxlens.reports.diff_terminal import gates_table, render_diff_terminal

    results = check_gates(diff, gates)
    if not args.quiet:
        tables.print(render_diff_terminal(diff, results, top=args.top))
    elif results:
        tables.print(gates_table(results))
    for path in _write_files(diff, results, args):
        if not args.quiet:
            say(f"wrote {path}")
    tripped = [r for r in results if r.tripped]
    if tripped:
        say(f"{len(tripped)} gate(s) tripped: " + ", ".join(r.gate.text for r in tripped))
        return EXIT_GATE
    return EXIT_OK


def _write_files(diff: Any, results: Sequence[Any], args: argparse.Namespace) -> list[Path]:
    from fxlens.analyzer.core.files import write_atomic
    from fxlens.analyzer.review.diff import diff_to_json
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
            written.append(write_atomic(path, render()))
    return written
