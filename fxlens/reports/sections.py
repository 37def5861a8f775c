"""Read the optional report sections the renderers show, tolerating their shapes loosely.

`memory` and `training` exist today; `roofline` (issue 4), `findings` (issue 5) and `quant`
(issue 6) are written by other stages whose exact shapes may still move. Every renderer
reads them through these functions only, so a shape change is absorbed in one place: a
section that is absent, or that these readers do not understand, reads as ``None`` / empty and
the renderer leaves its part out rather than failing.

Accepted shapes (the first match wins):
- roofline per-node times: ``roofline.nodes`` (or ``per_node``/``by_node``) as a list of
  ``{"id"|"node": int, "time_s": float, ...}`` or a mapping ``id → {"time_s": …}`` / ``id →
  seconds``; the time key may also be ``estimated_s`` or ``predicted_s``.
- roofline totals and device (as `fxlens.analyzer.time.roofline` writes them): ``totals.time_s``
  (``step_time_s`` for a training step), ``modules`` [{``path``, ``time_s``}], ``device``
  {``name``, ``peak_flops`` {dtype: FLOP/s} or a number, ``bandwidth_bytes_per_s``},
  ``mfu_dtype`` (the dtype whose peak is drawn as the roof).
- findings: a top-level list, or a mapping with ``findings``/``items``; entries carry
  ``code``, ``nodes``, ``modules``, ``saved_bytes``, ``saved_s``, ``message``, ``fix``.
- quant: ``quant.layers`` (list of dicts with ``name``/``layer``, or mapping name → dict),
  and an optional ``quant.plan`` mapping.

Nothing here computes a metric: it only finds numbers the analyzer wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fxlens.analyzer.core.report import Report

_TIME_KEYS = ("time_s", "estimated_s", "predicted_s", "s")
_NODE_LIST_KEYS = ("nodes", "per_node", "by_node")


def first_key(entry: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    """The value of the first of `keys` present in `entry`, or None."""
    for key in keys:
        if key in entry:
            return entry[key]
    return None


def node_times(report: Report) -> dict[int, float] | None:
    """Estimated seconds per node id from the roofline section, or None without one."""
    roofline = report.sections.get("roofline")
    if not isinstance(roofline, Mapping):
        return None
    entries = first_key(roofline, _NODE_LIST_KEYS)
    times: dict[int, float] = {}
    pairs: list[tuple[Any, Any]] = []
    if isinstance(entries, Mapping):
        pairs = list(entries.items())
    elif isinstance(entries, list):
        pairs = [(first_key(e, ("id", "node")), e) for e in entries if isinstance(e, Mapping)]
    for key, value in pairs:
        seconds = first_key(value, _TIME_KEYS) if isinstance(value, Mapping) else value
        if isinstance(seconds, (int, float)) and str(key).lstrip("-").isdigit():
            times[int(key)] = float(seconds)
    return times or None


def roofline_points(report: Report) -> list[dict[str, Any]]:
    """Per-node roofline entries as dicts with ``id`` (list form of `node_times`' source)."""
    roofline = report.sections.get("roofline")
    if not isinstance(roofline, Mapping):
        return []
    entries = first_key(roofline, _NODE_LIST_KEYS)
    if isinstance(entries, Mapping):
        return [dict(v, id=int(k)) for k, v in entries.items()
                if isinstance(v, Mapping) and str(k).isdigit()]
    if isinstance(entries, list):
        return [dict(e, id=first_key(e, ("id", "node"))) for e in entries
                if isinstance(e, Mapping)]
    return []


def roofline_device(report: Report) -> dict[str, Any]:
    """The device entry of the roofline section (peak FLOP/s, bandwidth), or {}."""
    roofline = report.sections.get("roofline")
    if not isinstance(roofline, Mapping):
        return {}
    device = roofline.get("device")
    if isinstance(device, Mapping):
        return dict(device)
    return {"name": device} if isinstance(device, str) else {}


def roofline_total_s(report: Report) -> float | None:
    """Estimated seconds for the whole graph (a training step's when given), or None."""
    roofline = report.sections.get("roofline")
    if not isinstance(roofline, Mapping):
        return None
    totals = roofline.get("totals")
    for where in (totals if isinstance(totals, Mapping) else {}, roofline):
        value = first_key(where, ("step_time_s", "time_s", "total_s", "estimated_s"))
        if isinstance(value, (int, float)):
            return float(value)
    return None


def module_times(report: Report) -> dict[str, float]:
    """Estimated seconds per module path (submodules included), {} without a roofline."""
    roofline = report.sections.get("roofline")
    entries = roofline.get("modules") if isinstance(roofline, Mapping) else None
    if isinstance(entries, Mapping):
        pairs = [(k, first_key(v, _TIME_KEYS) if isinstance(v, Mapping) else v)
                 for k, v in entries.items()]
    elif isinstance(entries, list):
        pairs = [(e.get("path"), first_key(e, _TIME_KEYS)) for e in entries
                 if isinstance(e, Mapping)]
    else:
        return {}
    return {str(k): float(v) for k, v in pairs
            if k is not None and isinstance(v, (int, float))}


def roofline_roof(report: Report) -> tuple[float, float, str] | None:
    """(peak FLOP/s, bandwidth bytes/s, dtype label) of the roof to draw, or None."""
    roofline = report.sections.get("roofline")
    device = roofline_device(report)
    peaks = first_key(device, ("peak_flops", "peak_flops_per_s", "flops_per_s"))
    bandwidth = first_key(device, ("bandwidth_bytes_per_s", "memory_bandwidth", "bandwidth"))
    label = ""
    if isinstance(peaks, Mapping):
        wanted = roofline.get("mfu_dtype") if isinstance(roofline, Mapping) else None
        if wanted not in peaks:
            wanted = max(peaks, key=lambda k: peaks[k]) if peaks else None
        label, peaks = str(wanted), peaks.get(wanted)
    if isinstance(peaks, (int, float)) and isinstance(bandwidth, (int, float)) \
            and peaks > 0 and bandwidth > 0:
        return float(peaks), float(bandwidth), label
    return None


def node_memory(report: Report) -> dict[int, int] | None:
    """Live bytes right after each node (the memory timeline), keyed by node id."""
    memory = report.sections.get("memory")
    timeline = memory.get("timeline") if isinstance(memory, Mapping) else None
    if not isinstance(timeline, list) or len(timeline) != len(report.nodes):
        return None
    return {node.id: int(live) for node, live in zip(report.nodes, timeline, strict=True)}


def findings(report: Report) -> list[dict[str, Any]]:
    """Fusion (and other) findings as a list of dicts; [] when absent."""
    section = report.sections.get("findings")
    if isinstance(section, Mapping):
        section = first_key(section, ("findings", "items"))
    if not isinstance(section, list):
        return []
    return [dict(f) for f in section if isinstance(f, Mapping)]


def quant_layers(report: Report) -> list[dict[str, Any]]:
    """Quantization rows, one dict per layer with a ``layer`` key first; [] when absent."""
    section = report.sections.get("quant")
    layers = section.get("layers") if isinstance(section, Mapping) else None
    if isinstance(layers, Mapping):
        return [{"layer": name, **flatten(v)} for name, v in layers.items()
                if isinstance(v, Mapping)]
    if isinstance(layers, list):
        rows = []
        for entry in layers:
            if isinstance(entry, Mapping):
                flat = flatten(entry)
                name = flat.pop("layer", flat.pop("name", flat.pop("module", "")))
                rows.append({"layer": name, **flat})
        return rows
    return []


def quant_plan(report: Report) -> dict[str, Any]:
    """The precision plan of the quant section, flattened one level; {} when absent."""
    section = report.sections.get("quant")
    plan = section.get("plan") if isinstance(section, Mapping) else None
    return flatten(plan) if isinstance(plan, Mapping) else {}


def flatten(entry: Mapping[str, Any]) -> dict[str, Any]:
    """One level of nesting into dotted keys; lists of scalars joined; deeper values dropped."""
    out: dict[str, Any] = {}
    for key, value in entry.items():
        if isinstance(value, Mapping):
            for sub, inner in value.items():
                if isinstance(inner, (str, int, float, bool)) or inner is None:
                    out[f"{key}.{sub}"] = inner
        elif isinstance(value, list):
            if all(isinstance(v, (str, int, float)) for v in value):
                out[key] = ", ".join(str(v) for v in value)
        else:
            out[key] = value
    return out
