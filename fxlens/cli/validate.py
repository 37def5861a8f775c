"""``analyze validate MODEL --on cpu|cuda``: predicted vs measured time and memory.

Loads the model as ``analyze`` does, gives it random weights if it has none, casts it when
``--dtype`` asks, captures it, predicts every node's time with the roofline for the device's
figures (its calibrated profile when there is one, see `fxlens.devices.validation_device`), runs the
captured graph for real (`fxlens.analyzer.time.validate`) and prints both figures per op class,
per module and in total with the error. ``--json`` writes the report with its ``roofline``
and ``validation`` sections, which keep both figures.

``--on`` names where the graph runs; ``--spec`` the registry device (``h100``) predicted
with, as ``analyze --device`` names it everywhere else. ``--device cpu|cuda`` is the old,
deprecated spelling of ``--on`` and still works (one note on stderr).

Exit codes: 0 ok, 2 could not run (no CUDA device for ``--on cuda``, a load error…), 3 a bug.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fxlens.cli.args import Parser, add_loading_options, non_negative_int, positive_int

DTYPE_NAMES = ("float32", "bfloat16", "float16")     # fxlens.devices.DTYPES


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="analyze validate",
        description="Run the captured graph for real; print predicted vs measured time.")
    parser.add_argument("target", help="model.py, pkg.module:function or hf:<preset>")
    add_loading_options(parser)
    parser.add_argument("--on", choices=("cpu", "cuda"), help="where to run (default cpu)")
    parser.add_argument("--device", dest="device_deprecated", choices=("cpu", "cuda"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--spec", help="predict with this registry device (e.g. h100) instead "
                        "of the device's calibrated profile")
    parser.add_argument("--profile", metavar="PATH", help="calibrated profile to predict with")
    parser.add_argument("--devices", metavar="PATH", help="JSON file adding or overriding devices")
    parser.add_argument("--tf32", action="store_true", help="fp32 matmuls may use TF32")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, help="cast weights and inputs")
    parser.add_argument("--warmup", type=non_negative_int, default=2,
                        help="warm-up passes (default 2)")
    parser.add_argument("--repeat", type=positive_int, default=5, help="timed passes (default 5)")
    parser.add_argument("--json", type=Path, help="write the report with both figures here")
    parser.add_argument("--depth", type=non_negative_int, default=2,
                        help="module tree depth (default 2)")
    parser.add_argument("--top", type=non_negative_int, default=10,
                        help="rows in the op class table")
    parser.add_argument("--quiet", action="store_true", help="no tables")
    parser.add_argument("--debug", action="store_true", help="tracebacks and debug logging")
    return parser


def run(args: argparse.Namespace) -> int:
    import torch

    from fxlens.analyzer.core.errors import LoadError
    from fxlens.analyzer.core.files import check_writable
    from fxlens.analyzer.core.report import write_report
    from fxlens.analyzer.time.validate import RunSettings
    from fxlens.api import load
    from fxlens.cli.console import EXIT_OK, err, note, out, say
    from fxlens.devices import DTYPES, validate, validation_device
    from fxlens.reports.terminal import render_view
    from fxlens.reports.view import Detail
    from fxlens.reports.views.time import validation_view

    if args.device_deprecated:
        note("validate --device is deprecated (analyze --device names a registry device); "
             "use --on cpu|cuda to say where to run, --spec NAME for the figures")
    on = args.on or args.device_deprecated or "cpu"
    if on == "cuda" and not torch.cuda.is_available():
        raise LoadError("--on cuda: no CUDA device is available here")
    if args.json:
        check_writable(args.json)
    sizes = {"batch": args.batch, "seq_len": args.seq_len, "image_size": args.image_size}
    overrides = dict(args.overrides)
    settings = RunSettings(on, args.warmup, args.repeat)
    spec = validation_device(on, args.spec, args.profile, args.devices)
    with err.status("loading…") as status:
        loaded = load(args.target, args.entry, overrides, sizes)
        status.update(f"capturing, then running every node {settings.repeat}× on {on}…")
        report = validate(loaded, spec, settings, DTYPES.get(args.dtype or ""), args.tf32)
    if not args.quiet:
        view = validation_view(report, Detail(args.depth, args.top, full=True))
        assert view is not None, "validate always writes a validation section"
        out.print(render_view(view))
    if args.json:
        write_report(report, args.json)
        if not args.quiet:
            say(f"wrote {args.json}")
    return EXIT_OK
