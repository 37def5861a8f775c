"""``analyze TARGET``: capture a model, run the analysis passes, print and write the report.

    analyze TARGET [options]          TARGET: model.py, pkg.module:function or hf:<preset>

Every option is checked before the model's code runs (`_check_before`: gates, baseline
report, output paths, then `fxlens.pipeline.check_options` for sizes, devices, profiles,
memory sizes and budgets), so a typo costs a second, not an analysis. ``--json -`` writes the
report JSON to stdout and nothing else goes there (tables go to stderr); ``--quiet`` prints
nothing but errors and what was asked (the gate table under ``--fail-on``); ``--no-pages``
writes the JSON only.

Building the parser imports neither torch nor the engine (`fxlens.cli.args` holds the
choices), so ``analyze --help`` and a bad option answer at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fxlens.cli.analyze_options import CHECKPOINT_MODES, add_option_groups
from fxlens.cli.args import (
    METHODS,
    VIEWS,
    Parser,
    add_loading_options,
    non_negative_int,
)
from fxlens.cli.console import EXIT_OK, err, note, out, say, write_raw

STDOUT = "-"
SUBCOMMAND_HELP = """subcommands:
  analyze diff OLD NEW          compare two versions of a model (reports, models, git refs)
  analyze validate TARGET       run the captured graph for real: predicted vs measured time
  analyze calibrate             measure this machine; save a profile for --device cpu|cuda
  analyze explain [CODE]        what a rule (FUS002, QNT001) or an op's cost rule says
  analyze sweep TARGET…         a grid of analyses (--set k=a,b --seq-len …) in one table

exit codes: 0 ok, 1 a gate tripped (--fail-on) or a sweep point failed, 2 bad input,
3 internal error (a bug)"""


class _Parser(Parser):
    """`Parser` where a bare ``--checkpoint`` never takes the next word (the target) as its
    mode: ``analyze --train --checkpoint model.py`` still checkpoints every block."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        words = list(sys.argv[1:] if args is None else args)
        words = [("--checkpoint=blocks" if word == "--checkpoint" and (
                    i + 1 == len(words) or words[i + 1] not in CHECKPOINT_MODES) else word)
                 for i, word in enumerate(words)]
        return super().parse_known_args(words, namespace)


def build_parser() -> argparse.ArgumentParser:
    from fxlens import __version__

    parser = _Parser(
        prog="analyze",
        description="Static cost analysis of a PyTorch model: FLOPs, bytes, per module.",
        epilog=SUBCOMMAND_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"fxlens {__version__}")
    parser.add_argument("target", help="model.py, pkg.module:function or hf:<preset>")
    add_loading_options(parser, batch_list=True)
    parser.add_argument("--allow-large", action="store_true",
                        help="analyze a model however long its estimated capture (default: "
                             "refuse one estimated at over ~20 minutes)")
    parser.add_argument("--out", type=Path, help="report folder (default: fxlens-out/<model>)")
    parser.add_argument("--json", metavar="PATH|-",
                        help="write the JSON report here; - for stdout (then nothing else goes "
                             "to stdout)")
    parser.add_argument("--depth", type=non_negative_int, default=2,
                        help="module tree depth (default 2)")
    parser.add_argument("--top", type=non_negative_int, default=10,
                        help="rows in the top-ops table")
    parser.add_argument("--full", action="store_true", help="every table: per-module "
                        "training memory and time, fix texts (default: the first screen)")
    parser.add_argument("--show", choices=VIEWS, action="append", metavar="NAME",
                        help="print this section instead of the first screen's (repeatable): "
                             + ", ".join(VIEWS))
    parser.add_argument("--method", choices=METHODS, action="append",
                        help="capture method(s) to try, in order (default: all)")
    parser.add_argument("--strict", action="store_true", help="a failing cost rule is fatal")
    add_option_groups(parser)
    parser.add_argument("--quiet", action="store_true",
                        help="print nothing but errors and what was asked; files as usual")
    parser.add_argument("--debug", action="store_true", help="tracebacks and debug logging")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.calibrate_deprecated:
        note("--calibrate is deprecated (it reads like the `analyze calibrate` subcommand); "
             "use --quant-calibrate")
    settings = dict(
        entry=args.entry, overrides=dict(args.overrides),
        sizes={"batch": args.batch[0] if args.batch else None, "seq_len": args.seq_len,
               "image_size": args.image_size},
        methods=tuple(args.method or METHODS), strict=args.strict,
        train=args.train, precision=args.precision, optimizer=args.optimizer,
        loss_dtype=args.loss_dtype, mtp=args.mtp or 0, mtp_shared=args.mtp_shared,
        lora=args.lora or 0, lora_targets=args.lora_targets or (), lora_base=args.lora_base,
        packed=args.packed or 0,
        device_memory=args.device_mem, checkpoint=args.checkpoint == "blocks",
        checkpoint_auto=args.checkpoint == "auto", checkpoint_budget=args.checkpoint_budget,
        checkpoint_granularity=args.checkpoint_granularity,
        kv_cache=args.kv_cache, context=args.context,
        device=args.device, devices_file=args.devices, profile=args.profile, tf32=args.tf32,
        attention_kernel=args.attention_kernel,
        fused=args.fused, quant=args.quant,
        calibrate=args.quant_calibrate or args.calibrate_deprecated,
        activations=args.activations, calibrate_metric=args.calibrate_metric,
        quant_plan=args.quant_plan, budget=args.budget,
        group_size=args.group_size, quant_tolerance=args.quant_tolerance,
        allow_large=args.allow_large,
        plan=args.plan, strategy=args.strategy, gpus=args.gpus, search=args.search,
        max_gpus=args.max_gpus, micro_batches=args.micro_batches,
        global_batch=args.global_batch, tokens=args.tokens, price=args.price,
        prune=args.prune, prune_target=args.prune_target, prune_save=args.prune_save,
        serve=args.serve, input_len=args.input_len, output_len=args.output_len,
        serve_batches=tuple(args.batch or ()) if args.serve else (), kv_dtype=args.kv_dtype,
        tpot_slo_s=args.tpot_slo, tp=args.tp, max_num_tokens=args.max_num_tokens,
        max_num_seqs=args.max_num_seqs, attention_dp=args.attention_dp,
    )
    if args.batch and len(args.batch) > 1 and not args.serve:
        from fxlens.analyzer.core.errors import LoadError

        raise LoadError("--batch takes one size; a list (1,8,32) is for --serve's curve")
    if args.plan:
        settings["train"] = True
    review = _check_before(args, settings)
    from fxlens.analyzer.core.heap import collector_off_until_loaded, settled_heap

    with collector_off_until_loaded():   # imports and loading make no garbage worth a walk
        from fxlens.api import AnalysisOptions, analyze_target

        options = AnalysisOptions(**settings)
        layouts: dict[str, Any] = {}     # graph layouts started once the ops are costed
        try:
            with settled_heap() as settle:   # the analysis's own nests in it: frozen while writing
                report = _analyze(args, options, analyze_target, _layouts_starter(args, layouts))
                settle()
                written = _write_files(report, args, layouts)
                return _finish(args, options, report, written, review)
        finally:
            if layouts:
                from fxlens.reports.write import close_layouts

                close_layouts(layouts)


def _finish(args: argparse.Namespace, options: Any, report: Any, written: list[Path],
            review: Any) -> int:
    """The tables and what was written, then the baseline's gates if any."""
    from fxlens.reports.terminal import render_terminal

    tables = err if args.json == STDOUT else out
    if not args.quiet:
        tables.print(render_terminal(report, depth=args.depth, top=args.top, full=args.full,
                                     show=tuple(args.show or ())))
        for path in written:
            say(f"wrote {path}")
    if review is not None:
        from fxlens.cli.diff import against_baseline

        return against_baseline(report, review, options, args.quiet, tables)
    return EXIT_OK


def _layouts_starter(args: argparse.Namespace, layouts: dict[str, Any]) -> Any:
    """What the pipeline calls with the costed report: the pages' graph layouts started
    then, so that graphviz works while the passes run (None without pages)."""
    if args.no_pages:
        return None
    from fxlens.reports.write import start_layouts

    def start(report: Any) -> None:
        folder = _folder(args, report.model.name)
        layouts.update(start_layouts(report, _page_options_of(args, folder)))
    return start


def _check_before(args: argparse.Namespace, settings: dict[str, Any]) -> Any:
    """Everything checkable before torch is imported and the model's code runs (gates, the
    baseline report, output paths, every option's value); the baseline review to do after."""
    from types import SimpleNamespace

    from fxlens.analyzer.capture.target import check_target
    from fxlens.analyzer.core.errors import LoadError
    from fxlens.analyzer.core.files import check_writable
    from fxlens.checks import check_options

    review = None
    if args.baseline is not None or args.fail_on is not None:
        from fxlens.cli.diff import prepare_review

        review = prepare_review(args.baseline, args.fail_on, device=args.device)
    if args.color == "time" and args.device is None and not args.no_pages:
        raise LoadError("--color time colours the graph by the roofline's estimated time, "
                        "which needs --device (e.g. --device h100)")
    for path in _output_paths(args, "model"):
        check_writable(path)
    check_options(SimpleNamespace(**settings))
    check_target(args.target, settings["overrides"])   # a missing file: before torch loads
    return review


def _analyze(args: argparse.Namespace, options: Any, analyze_target: Any, on_costed: Any
             ) -> Any:
    if args.quiet:
        return analyze_target(args.target, options, on_costed=on_costed)
    from fxlens.reports.escape import terminal_escape

    with err.status("loading…") as status:      # steps name the target: user text
        return analyze_target(args.target, options,
                              on_step=lambda step: status.update(f"{terminal_escape(step)}…"),
                              on_costed=on_costed)


def _output_paths(args: argparse.Namespace, name: str) -> list[Path]:
    """Every file this run promises to write, for a model called `name`."""
    folder = _folder(args, name)
    paths = [] if args.json == STDOUT else [Path(args.json) if args.json else
                                             folder / "report.json"]
    if not args.no_pages:
        from fxlens.reports.write import page_paths

        paths += page_paths(_page_options_of(args, folder))
    return paths


def _page_options_of(args: argparse.Namespace, folder: Path) -> Any:
    from fxlens.reports.write import PageOptions

    return PageOptions(folder=folder, dot=args.dot, svg=args.svg, png=args.png, html=args.html,
                       md=args.md, color=args.color, expand=args.expand)


def _write_files(report: Any, args: argparse.Namespace, layouts: dict[str, Any]
                 ) -> list[Path]:
    """Write the report JSON (or print it) and the pages; a promised file that is not there
    afterwards is an internal error, never a silent success. Where the process may fork
    (`fxlens.analyzer.core.beside`), the pages are written by a child while this process
    writes the JSON; if the child fails, they are written here, without the `layouts`
    started early (the child may have read part of their output)."""
    import functools

    from fxlens.analyzer.core.beside import beside, result_or_none
    from fxlens.analyzer.core.report import write_report

    folder = _folder(args, report.model.name)
    written: list[Path] = []
    write_pages = None
    if not args.no_pages:
        from fxlens.reports.dot import DOT_TIMEOUT_S
        from fxlens.reports.write import write_pages as write

        write_pages = functools.partial(write, report, _page_options_of(args, folder))
    in_child = None if write_pages is None else functools.partial(write_pages, started=layouts)
    with beside(in_child) as pages_beside:
        if args.json == STDOUT:
            write_raw(report.to_json())
        else:
            json_path = Path(args.json) if args.json else folder / "report.json"
            write_report(report, json_path)
            written.append(json_path)
        if write_pages is not None:
            # the child may use graphviz's budgets (SVG, then PNG) and a minute more
            pages = (result_or_none(pages_beside, "the pages", 2 * DOT_TIMEOUT_S + 60)
                     or write_pages(started=layouts if pages_beside is None else None))
            for text in pages.notes:    # something asked for was not made: said even if --quiet
                note(text)
            written += pages.paths
    if args.no_pages and args.json != STDOUT:
        _remove_stale_pages(folder)
    missing = [p for p in written if not p.is_file()]
    if missing:   # the CLI handler turns this into exit 3
        raise RuntimeError(f"{missing[0]} was promised but is not there after writing")
    return written


def _remove_stale_pages(folder: Path) -> None:
    """``--no-pages`` writes the JSON only: the pages an earlier run left beside it would
    describe another model or run, so they go, and the user is told."""
    from fxlens.reports.write import stale_pages

    stale = stale_pages(folder)
    for path in stale:
        path.unlink(missing_ok=True)
    if stale:
        note(f"removed the pages of an earlier run in {folder}: "
             f"{', '.join(p.name for p in stale)}")


def _folder(args: argparse.Namespace, name: str) -> Path:
    """The report folder: --out, else fxlens-out/<the model's name, made safe>."""
    return args.out or Path("fxlens-out") / _safe_name(name)


def _safe_name(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return safe if safe.strip(".") else "_"     # never "" or "..": stay inside fxlens-out/
