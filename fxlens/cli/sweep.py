"""``analyze sweep``: one analysis per point of a grid, or per model, in one table.

    analyze sweep hf:llama-3-8b --set num_hidden_layers=16,32,48 --seq-len 1024,4096 --csv s.csv
    analyze sweep models/*.py --workers 2
    analyze sweep hf:gpt2 --batch 1,8 --device h100,a100-80gb --ray auto

Axes are comma lists (``--set`` once per key; ``--strategy`` once per layout, since a layout
has commas of its own). Rows stream to ``OUT/points.jsonl``; ``--resume`` skips the points
that already succeeded there. Pages: ``OUT/sweep.html`` (table and charts against the swept
axis with the most values) and ``OUT/sweep.md``.

A partly invalid grid runs its valid points: the points an ``hf:`` preset cannot run (a
``--seq-len`` past the context length its config sets) are refused before any point runs,
in one line naming them and the limit, and are rows with status ``refused``; the others run,
as a failing point never stops a sweep. A grid with no valid point runs nothing (exit 2).

Exit codes: 0 every point ran, 1 some points failed or were refused (their rows say why),
2 bad input, 3 a bug.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fxlens.cli.args import (
    LORA_BASES,
    LOSS_DTYPES,
    OPTIMIZERS,
    PRECISIONS,
    Parser,
    count,
    key_value,
    layer_names,
    non_negative_float,
    positive_int,
)

DEFAULT_OUT = Path("fxlens-out") / "sweep"


def comma_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers like 1,8,32, got {text!r}"
                                         ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected whole numbers ≥ 1, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="analyze sweep",
                    description="Analyze every point of a grid (or every model) into one "
                                "table, CSV, JSON and page with charts.",
                    epilog="Points past an hf: preset's context length (its "
                           "max_position_embeddings, n_positions, ...) are refused before any "
                           "point runs, in one line naming them and the limit; the other "
                           "points run. Exit codes: 0 every point ran, 1 some failed or were "
                           "refused (their rows say why), 2 bad input or no valid point, "
                           "3 a bug in fxlens.")
    parser.add_argument("targets", nargs="+", metavar="TARGET",
                        help="model files, hf: presets or module:attr, as for analyze")
    grid = parser.add_argument_group("axes (comma lists)")
    grid.add_argument("--set", dest="sets", action="append", type=key_value, default=[],
                      metavar="KEY=V1,V2", help="a config override swept over values")
    grid.add_argument("--batch", type=comma_ints, metavar="N,…")
    grid.add_argument("--seq-len", type=comma_ints, metavar="N,…",
                      help="past an hf: preset's context length: refused up front (see below)")
    grid.add_argument("--device", metavar="NAME,…", help="roofline devices (h100,a100-80gb)")
    grid.add_argument("--strategy", action="append", metavar="TEXT",
                      help="a plan layout (repeat the flag per layout)")
    grid.add_argument("--entry", help="the model file's builder function")
    shared = parser.add_argument_group("options every point shares")
    shared.add_argument("--train", action="store_true")
    shared.add_argument("--precision", choices=PRECISIONS)
    shared.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS)
    shared.add_argument("--loss-dtype", choices=LOSS_DTYPES, default="fp32")
    shared.add_argument("--mtp", type=int, metavar="N", help="MTP depths trained (analyze's)")
    shared.add_argument("--mtp-shared", action="store_true")
    shared.add_argument("--lora", type=positive_int, metavar="R",
                        help="LoRA adapters' rank (analyze's)")
    shared.add_argument("--lora-targets", type=layer_names, metavar="NAMES")
    shared.add_argument("--lora-base", choices=LORA_BASES)
    shared.add_argument("--packed", type=positive_int, metavar="L",
                        help="sequences packed from samples of L tokens (analyze's)")
    shared.add_argument("--checkpoint", action="store_true")
    shared.add_argument("--plan", action="store_true", help="a parallel plan per point")
    shared.add_argument("--gpus", type=positive_int)
    shared.add_argument("--search", action="store_true")
    shared.add_argument("--max-gpus", type=positive_int)
    shared.add_argument("--micro-batches", type=positive_int, default=1)
    shared.add_argument("--tokens", type=count)
    shared.add_argument("--price", type=non_negative_float)
    where = parser.add_argument_group("where and what to write")
    where.add_argument("--workers", type=positive_int, default=1,
                       help="local worker processes (default 1: this process)")
    where.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster (or 'auto')")
    where.add_argument("--resume", action="store_true",
                       help="skip the points OUT/points.jsonl already has results for")
    where.add_argument("--out", type=Path, default=DEFAULT_OUT,
                       help=f"folder for points.jsonl and the pages (default {DEFAULT_OUT})")
    where.add_argument("--csv", type=Path, metavar="PATH")
    where.add_argument("--json", metavar="PATH", help="every row as JSON ('-' for stdout)")
    where.add_argument("--no-pages", action="store_true", help="no sweep.html / sweep.md")
    where.add_argument("--quiet", action="store_true", help="no table or progress")
    where.add_argument("--debug", action="store_true", help="tracebacks and debug logging")
    return parser


def points_and_spec(args: argparse.Namespace) -> tuple[list[Any], Any]:
    """The grid and the shared options, every option checked before any model runs."""
    from fxlens.analyzer.core.errors import LoadError
    from fxlens.pipeline import check_options
    from fxlens.sweep import SweepSpec, grid

    sets: dict[str, list[str]] = {}
    for key, values in args.sets:
        if key in sets:
            raise LoadError(f"--set {key}: give its values once, comma-separated")
        sets[key] = [v for v in values.split(",") if v != ""] or [values]
    devices = [d.strip() for d in args.device.split(",")] if args.device else [None]
    strategies = args.strategy or [None]
    spec = SweepSpec(train=args.train or args.plan, plan=args.plan, gpus=args.gpus,
                     search=args.search, max_gpus=args.max_gpus,
                     micro_batches=args.micro_batches, precision=args.precision,
                     optimizer=args.optimizer, loss_dtype=args.loss_dtype,
                     mtp=args.mtp or 0, mtp_shared=args.mtp_shared,
                     lora=args.lora or 0, lora_targets=args.lora_targets or (),
                     lora_base=args.lora_base, packed=args.packed or 0,
                     checkpoint=args.checkpoint, tokens=args.tokens,
                     price=args.price, entry=args.entry)
    points = grid(args.targets, sets, args.batch or [None], args.seq_len or [None], devices,
                  strategies)
    for point in {(p.device, p.strategy): p for p in points}.values():
        check_options(spec.options(point))   # each device and layout, before any point runs
    return points, spec


def run(args: argparse.Namespace) -> int:
    import json

    from fxlens.analyzer.core.files import check_writable, write_atomic
    from fxlens.cli.console import EXIT_GATE, EXIT_OK, err, out, say, write_raw
    from fxlens.reports.sweep import render_sweep_html, render_sweep_markdown, sweep_view
    from fxlens.reports.terminal import render_view
    from fxlens.sweep import axis_value, run_sweep, swept_axes, write_csv

    points, spec = points_and_spec(args)
    refused = refuse_invalid(points)
    for path in (args.csv, None if args.json in (None, "-") else Path(args.json)):
        if path is not None:
            check_writable(path)
    tables = err if args.json == "-" else out
    progress = _progress(len(points), args.quiet)
    with progress:
        task = progress.add_task("sweep", total=len(points))
        rows = run_sweep(points, spec, args.out, args.workers, args.ray, args.resume,
                         on_row=lambda row: progress.advance(task), refused=refused)
    axes = swept_axes(rows)
    written = [args.out / "points.jsonl"]
    if args.csv is not None:
        write_csv(rows, args.csv)
        written.append(args.csv)
    if args.json == "-":
        write_raw(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    elif args.json is not None:
        write_atomic(Path(args.json), json.dumps(rows, indent=1, sort_keys=True) + "\n")
        written.append(Path(args.json))
    if not args.no_pages:
        for name, text in (("sweep.html", render_sweep_html(rows, axes, axis_value)),
                           ("sweep.md", render_sweep_markdown(rows, axes, axis_value))):
            write_atomic(args.out / name, text)
            written.append(args.out / name)
    if not args.quiet:
        tables.print(render_view(sweep_view(rows, axes, axis_value)))
        for path in written:
            say(f"wrote {path}")
    failed = sum(1 for r in rows if r.get("status") == "error")
    if failed or refused:
        said = [f"{failed} failed"] if failed else []
        said += [f"{len(refused)} refused"] if refused else []
        say(f"{' and '.join(said)} of {len(rows)} points; their rows say why")
        return EXIT_GATE
    return EXIT_OK


def refuse_invalid(points: list[Any]) -> dict[Any, str]:
    """The points known not to run (`fxlens.sweep.past_context`), said in one line before any
    point runs; `LoadError` when no point is left."""
    from fxlens.analyzer.core.errors import LoadError
    from fxlens.cli.console import note
    from fxlens.sweep import past_context

    found = past_context(points)
    if not found:
        return {}
    groups: dict[tuple[str, int, str], set[int]] = {}
    for item in found:
        where = item.point.target + "".join(f" {k}={v}" for k, v in item.point.overrides)
        groups.setdefault((where, item.limit, item.key), set()).add(
            item.point.seq_len or 0)
    why = "; ".join(f"{where}: seq_len {', '.join(map(str, sorted(lengths)))} past its "
                    f"context length {limit} ({key}; raise it with --set {key}=N)"
                    for (where, limit, key), lengths in groups.items())
    line = f"refused {len(found)} of {len(points)} points before running: {why}"
    if len(found) == len(points):
        raise LoadError(line + "; no point is left to run")
    note(line + f"; the other {len(points) - len(found)} run")
    return {item.point: item.reason() for item in found}


def _progress(total: int, quiet: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from fxlens.cli.console import err

    return Progress("[progress.description]{task.description}", BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                    disable=quiet or total < 2, transient=True)
