"""Work on a real device: calibrate a profile of this machine, validate predictions by running.

Like `fxlens.pipeline`, this joins the engine (`fxlens.analyzer.time`) with the hardware
knowledge (`fxlens.rules.hardware`), so the CLI reaches neither directly.

- `calibrate_profile(device, path)`: measure GEMM FLOP/s per dtype, copy bandwidth and launch
  cost, and write the profile JSON ``{"device": {DeviceSpec fields}, "measured": {...}}``
  (default: the cache, ``~/.cache/fxlens/profiles/<device>.json``, which ``analyze --device
  cpu|cuda`` then uses).
- `validation_device(...)`: the device figures a validation predicts with.
- `validate(loaded, spec, settings)`: the report with its ``roofline`` and ``validation``
  sections, the captured graph run for real node by node (`fxlens.analyzer.time.validate`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from fxlens.analyzer.capture.chain import METHODS
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.core.files import write_atomic
from fxlens.analyzer.core.graph import Graph
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.time.device_calibration import Calibration, allow_tf32, calibrate
from fxlens.analyzer.time.validate import RunSettings, prepare, run_graph, validation_section
from fxlens.pipeline import AnalysisOptions, Context, resolve_device, run_context
from fxlens.rules.device_files import profile_dir, registry_name
from fxlens.rules.hardware import CONTEXT_BYTES, DTYPE_KEYS, MISALIGNED_GEMM, DeviceSpec, host_cpu

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Profile:
    spec: DeviceSpec
    measured: Calibration
    path: Path


def calibrate_profile(device: str, path: Path | None = None) -> Profile:
    """Measure `device` ("cpu" or "cuda") and write its profile to `path` (default: cache)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise LoadError("--device cuda: no CUDA device is available here")
    measured = calibrate(device)
    spec = profile_spec(measured)
    path = path or profile_dir() / f"{device}.json"
    profile = {"device": spec.to_json(),
               "measured": {"device_name": measured.device_name, "gemm_n": measured.sizes,
                            "skipped": measured.skipped, **measured.details}}
    write_atomic(path, json.dumps(profile, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return Profile(spec, measured, path)


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
        context_bytes=CONTEXT_BYTES if measured.device == "cuda" else 0,
        compute_efficiency=1.0, bandwidth_efficiency=1.0,
        launch_s=measured.launch_s, calibrated=True,
        kernel_efficiency=({MISALIGNED_GEMM: measured.misaligned_gemm_share}
                           if measured.misaligned_gemm_share else {}),
        host_free_s=measured.host_free_s or 0.0, host_module_s=measured.host_module_s or 0.0,
    )


def validation_device(device: str, spec: str | None = None, profile: str | None = None,
                      devices_file: str | None = None) -> DeviceSpec:
    """What a validation on `device` predicts with: a named `spec` or `profile` when given;
    else the device's calibrated profile; for a GPU without one, its registry entry."""
    if profile or spec:
        return resolve_device(spec or device, devices_file, profile)
    if device != "cuda":
        return resolve_device("cpu", devices_file)
    try:
        return resolve_device("cuda", devices_file)
    except LoadError:
        name = torch.cuda.get_device_name()
        key = registry_name(name)
        if key is None:
            raise LoadError(f"no registry entry for {name!r}: run `analyze calibrate --device "
                            "cuda` or pass --spec / --profile") from None
        return resolve_device(key, devices_file)


def predict(loaded: LoadedModel, spec: DeviceSpec, tf32: bool = False,
            methods: tuple[str, ...] = METHODS) -> tuple[Report, Graph]:
    """The (real) loaded model through the analysis pipeline (costs, memory, roofline) and
    the graph it captured."""
    options = AnalysisOptions(device=spec.name, tf32=tf32, methods=methods, fusion=False)
    context = Context(loaded, options, lambda _: None, device=spec)
    return run_context(context), context.forward()


def validate(loaded: LoadedModel, spec: DeviceSpec, settings: RunSettings,
             dtype: torch.dtype | None = None, tf32: bool = False) -> Report:
    """The report of `loaded` with ``roofline`` and ``validation`` sections."""
    module, inputs = prepare(loaded.module, loaded.inputs, settings.device, dtype)
    real = dataclasses.replace(loaded, module=module, inputs=inputs)
    report, graph = predict(real, spec, tf32)
    with allow_tf32(tf32):
        run = run_graph(graph, module, inputs, settings)
    return report.with_(validation_section(report, run, settings))
