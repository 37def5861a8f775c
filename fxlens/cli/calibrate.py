"""``analyze calibrate --device cpu|cuda``: measure this machine and save a profile.

Runs `fxlens.devices.calibrate_profile` (large GEMMs per dtype, copy bandwidth, per-op
launch cost), which writes a profile JSON to ``--out`` or the cache
(``~/.cache/fxlens/profiles/<device>.json``). ``analyze --device cpu`` (and ``cuda``) then use the
cached profile automatically; ``--profile PATH`` uses any profile.

Exit codes: 0 ok, 2 could not run (no CUDA device for ``--device cuda``), 3 a bug.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fxlens.cli.args import Parser


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="analyze calibrate",
        description="Measure GEMM FLOP/s per dtype, copy bandwidth and launch cost; save a "
                    "profile the roofline uses instead of datasheet figures.")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="what to measure (default cpu)")
    parser.add_argument("--out", type=Path,
                        help="profile path (default ~/.cache/fxlens/profiles/<device>.json)")
    parser.add_argument("--quiet", action="store_true", help="no table")
    parser.add_argument("--debug", action="store_true", help="tracebacks and debug logging")
    return parser


def run(args: argparse.Namespace) -> int:
    from fxlens.analyzer.core.files import check_writable
    from fxlens.cli.console import EXIT_OK, err, out, say
    from fxlens.devices import calibrate_profile
    from fxlens.reports.terminal import render_table

    if args.out is not None:
        check_writable(args.out)
    with err.status(f"calibrating {args.device}: GEMMs per dtype, copy, launch…"):
        profile = calibrate_profile(args.device, args.out)
    if not args.quiet:
        out.print(render_table(calibration_table(profile)))
        say(f"wrote {profile.path}")
    return EXIT_OK


def calibration_table(profile: Any) -> Any:
    """The measured figures of a `fxlens.devices.Profile` as a view table."""
    from fxlens.reports.units import seconds, si
    from fxlens.reports.view import Column, Table

    spec, measured = profile.spec, profile.measured
    rows = []
    for key, value in spec.peak_flops.items():
        how = (f"({measured.sizes[key]})² GEMM" if key in measured.sizes
               else measured.skipped.get(key, ""))
        rows.append((f"{key} FLOP/s", si(value, "FLOP/s") if value else "-", how))
    for kernel, share in sorted(spec.kernel_efficiency.items()):
        rows.append((kernel, f"{share:.0%} of peak", "bf16 (n, n) @ (n, n−1) over (n, n)²"))
    rows.append(("copy bandwidth", si(spec.bandwidth_bytes_per_s, "B/s"), "read + written"))
    rows.append(("launch", seconds(spec.launch_s), "per tiny op"))
    rows.append(("host per view", seconds(spec.host_free_s), "a free op: no kernel"))
    rows.append(("host per module", seconds(spec.host_module_s), "nn.Linear less F.linear"))
    return Table.of(f"calibrated · {measured.device_name}",
                    (Column("figure"), Column("measured", right=True), Column("how")), rows)
