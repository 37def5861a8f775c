"""Devices from files: a user's devices file (``--devices``), a calibrated profile written by
`analyze calibrate` (``--profile``, or cached per device), and the lookup that picks between
them and the registry (`device_spec`); the registry entry a driver's GPU name stands for.

A devices file is ``{"devices": {name: {DeviceSpec field: value}}}`` in base units: a known
name overrides the fields it lists (``peak_flops`` merged key by key; a ``memory_bytes`` is the
budget as given, unless ``reported_bytes``/``context_bytes`` say otherwise), a new name adds a
device. Every figure is checked: finite, non-negative, shares in (0, 1].
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from fxlens.analyzer.core.files import read_json
from fxlens.rules.hardware import (
    ALIASES,
    DEVICES,
    DTYPE_KEYS,
    KERNEL_CLASSES,
    DeviceSpec,
    device,
    host_cpu,
)

_NUMBERS = ("memory_bytes", "bandwidth_bytes_per_s", "compute_efficiency", "bandwidth_efficiency",
            "launch_s", "graph_launch_s", "gpus_per_node", "intra_node_bytes_per_s",
            "inter_node_bytes_per_s", "host_free_s", "host_module_s", "collective_base_s",
            "intra_node_hop_s", "inter_node_hop_s", "reported_bytes", "context_bytes",
            "multiprocessors", "collective_sms", "framework_launch_s", "recurrence_step_s")


def spec_from_json(data: Mapping[str, Any], base: DeviceSpec | None = None) -> DeviceSpec:
    """A device from a JSON object with `DeviceSpec`'s field names (base units); fields left
    out come from `base` (an override) — `peak_flops` is merged key by key."""
    if "name" not in data and base is None:
        raise ValueError("a device needs a name")
    unknown = set(data) - {f.name for f in fields(DeviceSpec)}
    if unknown:
        raise ValueError(f"unknown device field(s) {sorted(unknown)}; "
                         f"known: {[f.name for f in fields(DeviceSpec)]}")
    peaks = dict(data.get("peak_flops", {}))
    bad = set(peaks) - set(DTYPE_KEYS)
    if bad:
        raise ValueError(f"unknown dtype key(s) {sorted(bad)} in peak_flops; known: {DTYPE_KEYS}")
    values: dict[str, Any] = {k: _number(k, data[k]) for k in _NUMBERS if k in data}
    if "kernel_efficiency" in data:
        values["kernel_efficiency"] = _kernel_shares(data["kernel_efficiency"])
    if "flash2_efficiency" in data:     # --attention-kernel flash2's shares
        values["flash2_efficiency"] = _kernel_shares(data["flash2_efficiency"])
    if "dtype_efficiency" in data:
        values["dtype_efficiency"] = _dtype_shares(data["dtype_efficiency"])
    for whole in ("memory_bytes", "gpus_per_node", "reported_bytes", "context_bytes",
                  "multiprocessors", "collective_sms"):
        if whole in values:
            values[whole] = int(values[whole])
    values.update({k: _typed(k, data[k]) for k in ("name", "source", "kind", "calibrated",
                                                   "link_source", "link_kind") if k in data})
    if base is None:
        full_peaks = {k: _number(f"peak_flops.{k}", peaks.get(k, 0.0)) for k in DTYPE_KEYS}
        values.setdefault("memory_bytes", 0)
        values.setdefault("source", "user device file")
        return _usable(DeviceSpec(peak_flops=full_peaks, **values))
    merged = {**base.peak_flops, **{k: _number(f"peak_flops.{k}", v) for k, v in peaks.items()}}
    if "memory_bytes" in values:       # the user's capacity replaces the sourced one
        values.setdefault("reported_bytes", 0)
        values.setdefault("context_bytes", 0)
    return _usable(replace(base, peak_flops=merged, **values))


def _kernel_shares(data: Any) -> dict[str, float]:
    if not isinstance(data, Mapping):
        raise ValueError("kernel_efficiency must be an object of kernel class → share")
    bad = set(data) - set(KERNEL_CLASSES)
    if bad:
        raise ValueError(f"unknown kernel class(es) {sorted(bad)}; known: {KERNEL_CLASSES}")
    return {k: _number(f"kernel_efficiency.{k}", v) for k, v in data.items()}


def _dtype_shares(data: Any) -> dict[str, float]:
    if not isinstance(data, Mapping):
        raise ValueError("dtype_efficiency must be an object of dtype key → share")
    bad = set(data) - set(DTYPE_KEYS)
    if bad:
        raise ValueError(f"unknown dtype key(s) {sorted(bad)} in dtype_efficiency; "
                         f"known: {DTYPE_KEYS}")
    return {k: _number(f"dtype_efficiency.{k}", v) for k, v in data.items()}


def _number(name: str, value: Any) -> float:
    """A finite, non-negative figure (a NaN peak would make every time NaN, a negative one
    negative throughput); efficiencies are shares, at most 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite number ≥ 0, got {number:g}")
    if "_efficiency" in name and not 0 < number <= 1:
        raise ValueError(f"{name} is a share of the peak: it must be in (0, 1], got {number:g}")
    return number


def _typed(name: str, value: Any) -> Any:
    expected = bool if name == "calibrated" else str
    if not isinstance(value, expected):
        raise ValueError(f"{name} must be a {expected.__name__}, got {type(value).__name__}")
    if name == "kind" and value not in ("gpu", "cpu"):
        raise ValueError(f"kind must be 'gpu' or 'cpu', got {value!r}")
    return value


def _usable(spec: DeviceSpec) -> DeviceSpec:
    """A roofline divides by the bandwidth and by some peak: both must be there."""
    if spec.bandwidth_bytes_per_s <= 0:
        raise ValueError(f"device {spec.name!r}: bandwidth_bytes_per_s must be > 0")
    if not any(v > 0 for v in spec.peak_flops.values()):
        raise ValueError(f"device {spec.name!r}: peak_flops needs at least one figure > 0")
    if spec.gpus_per_node < 1:
        raise ValueError(f"device {spec.name!r}: gpus_per_node must be ≥ 1")
    return spec


def load_devices(path: Path) -> dict[str, DeviceSpec]:
    """Devices from a user JSON file ``{"devices": {name: {field: value}}}``: a known name
    overrides the listed fields of that device, a new name adds a device."""
    try:
        data = read_json(path, "devices file")
        if not isinstance(data, dict):
            raise TypeError("expected an object {\"devices\": {name: fields}}")
        entries = data["devices"]
        if not isinstance(entries, dict):
            raise TypeError("'devices' must be an object of name → fields")
        loaded: dict[str, DeviceSpec] = {}
        for raw_name, entry in entries.items():
            if not isinstance(entry, dict):
                raise TypeError(f"device {raw_name!r} must be an object of fields")
            name = ALIASES.get(raw_name.lower(), raw_name.lower())
            base = _known(name)
            spec = spec_from_json({**entry, "name": name}, base)
            loaded[name] = spec if base is not None else replace(
                spec, source=entry.get("source", f"user device file {path}"))
        return loaded
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"cannot read devices from {path}: {error}") from error


def _known(name: str) -> DeviceSpec | None:
    if name == "cpu":
        return host_cpu()
    return DEVICES.get(name)


def profile_dir() -> Path:
    """Where calibrated profiles are cached: ``$XDG_CACHE_HOME/fxlens/profiles`` (default
    ``~/.cache/fxlens/profiles``)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fxlens" / "profiles"


def load_profile(path: Path) -> DeviceSpec:
    """A calibrated profile written by `analyze calibrate`: ``{"device": {...}, "measured":
    {...}}``; the device entry has every `DeviceSpec` field."""
    try:
        data = read_json(path, "profile")
        if not isinstance(data, dict) or not isinstance(data.get("device"), dict):
            raise TypeError("expected an object with a \"device\" object")
        return spec_from_json(data["device"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"cannot read profile {path}: {error}") from error


def cached_profile(name: str) -> DeviceSpec | None:
    """The cached calibrated profile of device `name`, if `analyze calibrate` wrote one."""
    path = profile_dir() / f"{name}.json"
    return load_profile(path) if path.is_file() else None


def device_spec(name: str, devices_file: str | None = None, profile: str | None = None
                ) -> DeviceSpec:
    """The device to estimate for: a calibrated `profile` when given; else `name` from the
    user's `devices_file` or the registry; ``cpu`` and ``cuda`` use their cached calibrated
    profile (`analyze calibrate`) when one exists. ValueError says what is wrong."""
    if profile is not None:
        return load_profile(Path(profile))
    extra = load_devices(Path(devices_file)) if devices_file else {}
    key = name.strip().lower()
    cached = cached_profile(key) if key in ("cpu", "cuda") and key not in extra else None
    if cached is not None:
        return cached
    if key == "cuda" and "cuda" not in extra:
        raise ValueError("no calibrated profile for 'cuda'; run `analyze calibrate "
                         "--device cuda` or name the GPU (--device h100)")
    return device(name, extra)


GPU_NAMES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gb200", ("gb200",)), ("gb300", ("gb300",)), ("b200", ("b200",)), ("b300", ("b300",)),
    ("h200", ("h200",)), ("h100-pcie", ("h100", "pcie")), ("h100", ("h100",)),
    ("a100-40gb", ("a100", "40gb")), ("a100-80gb", ("a100",)), ("l4", ("l4",)),
    ("a10g", ("a10",)), ("t4", ("t4",)), ("rtx4090", ("4090",)), ("mi300x", ("mi300",)),
)


def registry_name(gpu_name: str) -> str | None:
    """The registry entry of a GPU as the driver names it (``NVIDIA H100 80GB HBM3`` →
    ``h100``), or None."""
    lowered = gpu_name.lower()
    return next((key for key, words in GPU_NAMES if all(w in lowered for w in words)), None)
