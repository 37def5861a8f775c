"""``analyze calibrate --device cpu|cuda``: measure this machine and save a profile.

Runs `fxlens.analyzer.time.device_calibration` (large GEMMs per dtype, copy bandwidth,
per-op launch cost)
and writes a profile JSON, ``{"device": {DeviceSpec fields}, "measured": {...}}``, to
``--out`` or the cache (``~/.cache/fxlens/profiles/<device>.json``, see
`fxlens.rules.hardware.profile_dir`). ``analyze --device cpu`` (and ``cuda``) then use the
cached profile automatically; ``--profile PATH`` uses any profile.

Exit codes: 0 ok, 2 could not run (no CUDA device for ``--device cuda``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from rich.table import Table

from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.time.device_calibration import Calibration, calibrate
from fxlens.reports.units import seconds, si
from fxlens.rules.hardware import DTYPE_KEYS, DeviceSpec, host_cpu, profile_dir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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


def profile_spec(measured: Calibration) -> DeviceSpec:
    """The `DeviceSpec` a calibration stands for (achievable factors 1.0: figures achieved)."""
    if measured.device == "cuda":
        memory = int(torch.cuda.get_device_properties(0).total_memory)
    else:
        memory = host_cpu().memory_bytes
    threads = measured.details.get("threads")
    return DeviceSpec(
        name=measured.device, memory_bytes=memory,
        source=f"calibrated on {measured.device_name} ({threads} threads, torch "
               f"{measured.details.get('torch_version')}) by `analyze calibrate`",
        peak_flops={k: measured.peak_flops.get(k, 0.0) for k in DTYPE_KEYS},
        bandwidth_bytes_per_s=measured.bandwidth_bytes_per_s,
        kind="gpu" if measured.device == "cuda" else "cpu",
        compute_efficiency=1.0, bandwidth_efficiency=1.0,
        launch_s=measured.launch_s, calibrated=True,
    )


def run(args: argparse.Namespace) -> int:
    from fxlens.cli.console import EXIT_OK, err, out

    if args.device == "cuda" and not torch.cuda.is_available():
        raise LoadError("--device cuda: no CUDA device is available here")
    with err.status(f"calibrating {args.device}: GEMMs per dtype, copy, launch…"):
        measured = calibrate(args.device)
    spec = profile_spec(measured)
    path = args.out or profile_dir() / f"{args.device}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    profile = {"device": spec.to_json(),
               "measured": {"device_name": measured.device_name, "gemm_n": measured.sizes,
                            "skipped": measured.skipped, **measured.details}}
    path.write_text(json.dumps(profile, indent=2, sort_keys=True) + "\n")
    if not args.quiet:
        out.print(calibration_table(spec, measured))
    err.print(f"wrote {path}")
    return EXIT_OK


def calibration_table(spec: DeviceSpec, measured: Calibration) -> Table:
    table = Table(title=f"calibrated · {measured.device_name}", title_justify="left")
    for name in ("figure", "measured", "how"):
        table.add_column(name, justify="right" if name == "measured" else "left")
    for key in DTYPE_KEYS:
        value = spec.peak_flops[key]
        how = (f"({measured.sizes[key]})² GEMM" if key in measured.sizes
               else measured.skipped.get(key, ""))
        table.add_row(f"{key} FLOP/s", si(value, "FLOP/s") if value else "-", how)
    table.add_row("copy bandwidth", si(spec.bandwidth_bytes_per_s, "B/s"), "read + written")
    table.add_row("launch", seconds(spec.launch_s), "per tiny op")
    return table
