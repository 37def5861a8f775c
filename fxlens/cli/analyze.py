"""``analyze TARGET``: capture a model, run the analysis passes, print and write the report.

    analyze TARGET [options]          TARGET: model.py, pkg.module:function or hf:<preset>
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fxlens.analyzer.capture.chain import METHODS
from fxlens.analyzer.core.report import Report, write_report
from fxlens.cli.args import key_value
from fxlens.cli.console import EXIT_OK, err, out
from fxlens.pipeline import OPTIMIZERS, PRECISIONS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="analyze",
        description="Static cost analysis of a PyTorch model: FLOPs, bytes, per module.",
    )
    parser.add_argument("target", help="model.py, pkg.module:function or hf:<preset>")
    parser.add_argument("--entry", help="factory function in the model file (default: build)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], type=key_value,
                        metavar="KEY=VALUE", help="override a config field of an hf: preset")
    parser.add_argument("--batch", type=int, help="batch size of the example inputs")
    parser.add_argument("--seq-len", type=int, help="sequence length of the example inputs")
    parser.add_argument("--image-size", type=int, help="image side of the example inputs")
    parser.add_argument("--out", type=Path, help="report folder (default: fxlens-out/<model>)")
    parser.add_argument("--json", type=Path, help="write the JSON report here")
    parser.add_argument("--depth", type=int, default=2, help="module tree depth (default 2)")
    parser.add_argument("--top", type=int, default=10, help="rows in the top-ops table")
    parser.add_argument("--full", action="store_true", help="every table: per-module "
                        "training memory and time, fix texts (default: the first screen)")
    parser.add_argument("--method", choices=METHODS, action="append",
                        help="capture method(s) to try, in order (default: all)")
    parser.add_argument("--strict", action="store_true", help="a failing cost rule is fatal")
    training = parser.add_argument_group("training step")
    training.add_argument("--train", action="store_true",
                          help="capture the joint forward+backward graph of one training step")
    training.add_argument("--precision", choices=PRECISIONS,
                          help="training precision policy (default: fp32 for fp32 weights, "
                               "amp-bf16 / amp-fp16 for 16-bit weights)")
    training.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS,
                          help="optimizer whose state is accounted (default adamw)")
    training.add_argument("--checkpoint", action="store_true",
                          help="what-if: activation checkpointing of every repeated block")
    inference = parser.add_argument_group("inference memory")
    inference.add_argument("--kv-cache", action="store_true",
                           help="KV cache bytes per layer and the memory of one decode step")
    inference.add_argument("--context", type=int,
                           help="KV cache context in tokens (default: the sequence length)")
    training.add_argument("--device-mem", metavar="SIZE|GPU",
                          help="device memory for a fits verdict: 80GiB, 24GB or a GPU name")
    roofline = parser.add_argument_group("roofline time estimate")
    roofline.add_argument("--device", help="estimate time on this device: h100, a100-80gb, "
                          "cpu… (see fxlens/rules/hardware.py)")
    roofline.add_argument("--devices", metavar="PATH",
                          help="JSON file adding or overriding devices")
    roofline.add_argument("--profile", metavar="PATH",
                          help="calibrated profile (analyze calibrate) instead of the datasheet")
    roofline.add_argument("--tf32", action="store_true", help="fp32 matmuls may use TF32")
    roofline.add_argument("--fused", action="store_true",
                          help="estimate over the predicted fused kernels (the fusion section)")
    quant = parser.add_argument_group("quantization sensitivity")
    quant.add_argument("--quant", action="store_true",
                       help="data-free per-layer quantization scores from the weights")
    quant.add_argument("--calibrate", action="store_true", help="run real forwards (example "
                       "inputs or the model file's calibration()): output SQNR per layer")
    quant.add_argument("--activations", action="store_true",
                       help="with --calibrate, also fake-quantize each layer's inputs")
    quant.add_argument("--calibrate-metric", choices=("auto", "sqnr", "kl", "agreement"),
                       default="auto", help="what ranks layers under --calibrate: output SQNR, "
                       "KL of the softmax or top-1 agreement; auto (default): KL when the model "
                       "returns a linear head's output (logits), else SQNR")
    quant.add_argument("--quant-plan", choices=("w8a8", "w4a16", "auto"),
                       help="per-layer precision plan keeping sensitive layers higher")
    quant.add_argument("--budget", metavar="SIZE", help="weight memory budget of the plan: 4GiB")
    quant.add_argument("--group-size", type=int, default=128, help="int4 group size (128)")
    review = parser.add_argument_group("pre-merge review (see analyze diff)")
    review.add_argument("--baseline", metavar="REPORT|TARGET",
                        help="compare with this report .json, model or git:REF:path")
    review.add_argument("--fail-on", metavar="GATES",
                        help='exit 1 when a metric grows past a threshold against --baseline: '
                             '"flops:+2%%,peak_memory:+5%%,params:+0"')
    pages = parser.add_argument_group("graph and pages (default: graph.dot, graph.svg, "
                                      "report.html, summary.md in the report folder)")
    pages.add_argument("--dot", type=Path, metavar="PATH", help="write the graphviz graph here")
    pages.add_argument("--svg", type=Path, metavar="PATH",
                       help="write the graph as SVG here (needs graphviz's dot)")
    pages.add_argument("--png", action="store_true", help="also a PNG next to the SVG")
    pages.add_argument("--color", default="flops", choices=("flops", "bytes", "time", "memory"),
                       help="colour graph nodes by this metric (default flops)")
    pages.add_argument("--expand", action="store_true",
                       help="draw every op of repeated blocks instead of one node per block")
    pages.add_argument("--html", type=Path, metavar="PATH", help="write the HTML page here")
    pages.add_argument("--md", type=Path, metavar="PATH", help="write the Markdown summary here")
    parser.add_argument("--quiet", action="store_true", help="no tables, files only")
    parser.add_argument("--debug", action="store_true", help="tracebacks and debug logging")
    return parser


def run(args: argparse.Namespace) -> int:
    from fxlens.api import AnalysisOptions, analyze_target
    from fxlens.reports.terminal import render_terminal

    overrides = dict(args.overrides)
    sizes = {"batch": args.batch, "seq_len": args.seq_len, "image_size": args.image_size}
    options = AnalysisOptions(
        entry=args.entry, overrides=overrides, sizes=sizes,
        methods=tuple(args.method) if args.method else METHODS, strict=args.strict,
        train=args.train, precision=args.precision, optimizer=args.optimizer,
        device_memory=args.device_mem, checkpoint=args.checkpoint,
        kv_cache=args.kv_cache, context=args.context,
        device=args.device, devices_file=args.devices, profile=args.profile, tf32=args.tf32,
        fused=args.fused, quant=args.quant, calibrate=args.calibrate,
        activations=args.activations, calibrate_metric=args.calibrate_metric,
        quant_plan=args.quant_plan, budget=args.budget,
        group_size=args.group_size,
    )
    with err.status("loading…") as status:
        report = analyze_target(args.target, options,
                                on_step=lambda step: status.update(f"{step}…"))
    written = _write_files(report, args)
    if not args.quiet:
        out.print(render_terminal(report, depth=args.depth, top=args.top, full=args.full))
    for path in written:
        err.print(f"wrote {path}")
    if args.baseline or args.fail_on:
        from fxlens.cli.diff import against_baseline

        return against_baseline(report, args.baseline, args.fail_on, options, args.quiet)
    return EXIT_OK


def _write_files(report: Report, args: argparse.Namespace) -> list[Path]:
    folder = args.out or Path("fxlens-out") / _safe_name(report.model.name)
    json_path = args.json or folder / "report.json"
    write_report(report, json_path)
    from fxlens.reports.write import PageOptions, write_pages

    pages = write_pages(report, PageOptions(
        folder=folder, dot=args.dot, svg=args.svg, png=args.png, html=args.html, md=args.md,
        color=args.color, expand=args.expand))
    for note in pages.notes:
        err.print(f"[yellow]note:[/] {note}", markup=True, highlight=False)
    return [json_path, *pages.paths]


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
