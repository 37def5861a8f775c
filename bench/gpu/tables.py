"""The Markdown of a `bench/gpu_check.py` run: one table per part, error = predicted / measured − 1.

Tolerances from issue 37: a model's total time ±25 %, large GEMMs (``mm``, ``addmm``, ``bmm``
op classes) ±15 %, memory ±10 %; a figure outside its tolerance is marked **miss**.
"""

from __future__ import annotations

from typing import Any

TIME_TOLERANCE = 0.25
GEMM_TOLERANCE = 0.15
MEMORY_TOLERANCE = 0.10
GEMM_CLASSES = ("aten.mm", "aten.addmm", "aten.bmm", "aten.matmul", "aten.linear")


def error(predicted: float | None, measured: float | None) -> float | None:
    if not predicted or not measured:   # 0 predicted: no such path (a fallback)
        return None
    return predicted / measured - 1


def verdict(err: float | None, tolerance: float) -> str:
    if err is None:
        return "-"
    return f"{err:+.0%}" + ("" if abs(err) <= tolerance else " **miss**")


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def gib(size: float | None) -> str:
    if size is None:
        return "-"
    return f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / 2**20:.2f} MiB"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def environment(data: dict[str, Any]) -> list[str]:
    env = data.get("env", {})
    keys = ("gpu", "driver", "cuda", "torch", "transformers", "python", "threads", "date")
    facts = ", ".join(f"{k} {env[k]}" for k in keys if env.get(k) is not None)
    return [f"Device {data.get('device')}: {facts}; the run took {data.get('elapsed_s')} s."]


def _part(data: dict[str, Any], key: str, title: str) -> tuple[Any, list[str]]:
    """A one-off part's value, or the lines to show instead (nothing when it did not run)."""
    result = data.get(key)
    if result is None:
        return None, []
    if "error" in result:
        return None, [f"### {title}", "", f"failed: {result['error']}"]
    return result["value"], []


def calibration(data: dict[str, Any]) -> list[str]:
    measured, instead = _part(data, "calibrate", "Calibration")
    if measured is None:
        return instead
    sheet = data.get("specs", {}).get("datasheet")
    rows = []
    for key, value in measured["peak_flops"].items():
        assumed = sheet["peak_flops"].get(key, 0) * sheet["compute_efficiency"] if sheet else None
        rows.append((f"{key} GEMM", _rate(value, "FLOP/s"), _rate(assumed, "FLOP/s"),
                     verdict(error(assumed, value), GEMM_TOLERANCE)))
    bandwidth = measured["bandwidth_bytes_per_s"]
    assumed_bw = sheet["bandwidth_bytes_per_s"] * sheet["bandwidth_efficiency"] if sheet else None
    rows.append(("copy bandwidth", _rate(bandwidth, "B/s"), _rate(assumed_bw, "B/s"),
                 verdict(error(assumed_bw, bandwidth), GEMM_TOLERANCE)))
    rows.append(("launch", ms(measured["launch_s"]), ms(sheet["launch_s"]) if sheet else "-",
                 verdict(error(sheet["launch_s"] if sheet else None, measured["launch_s"]),
                         TIME_TOLERANCE)))
    head = ("figure", "measured", "datasheet × factor", "assumed vs measured")
    return ["### Calibration", "", *_table(head, rows)]


def _rate(value: float | None, unit: str) -> str:
    if not value:
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G")):
        if value >= scale:
            return f"{value / scale:.1f} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def validation(data: dict[str, Any]) -> list[str]:
    rows, classes = [], []
    for row in data.get("validate", []):
        name = row["case"]["name"]
        if "value" not in row:
            rows.append((name, "-", "-", "-", "-", "-", "-",
                         row.get("error") or row.get("skipped", "")))
            continue
        for label, figures in row["value"].items():
            total, memory = figures["total"], figures["memory"]
            rows.append((name, label, ms(total["predicted_s"]), ms(total["eager_s"]),
                         verdict(error(total["predicted_s"], total["eager_s"]), TIME_TOLERANCE),
                         ms(total["measured_s"]), verdict(total["error"], TIME_TOLERANCE),
                         f"{gib(memory['predicted_peak_bytes'])} / "
                         f"{gib(memory['measured_peak_bytes'])} "
                         f"{verdict(memory['error'], MEMORY_TOLERANCE)}"))
            for op in figures["op_classes"]:
                tolerance = GEMM_TOLERANCE if op["op"] in GEMM_CLASSES else TIME_TOLERANCE
                classes.append((name, label, op["op"], str(op["calls"]), ms(op["predicted_s"]),
                                ms(op["measured_s"]), verdict(op["error"], tolerance)))
    if not rows:
        return []
    head = ("case", "spec", "predicted", "eager forward", "error", "Σ nodes, interpreted",
            "error", "peak pred / meas")
    op_head = ("case", "spec", "op class", "calls", "predicted", "measured", "error")
    return ["### `analyze validate`", "",
            "The eager forward is the module's own run; Σ nodes is the captured graph run node "
            "by node by fxlens's interpreter, each node timed alone (CUDA events), which adds "
            "the interpreter's per-node host time where the GPU is not the bottleneck.", "",
            *_table(head, rows), "", "Op classes by measured time (Σ nodes):", "",
            *_table(op_head, classes)]


# part → (title, [(figure label, key, kind)]): kind "time" or "memory".
FIGURES = {
    "forward": ("Inference forward", [("forward time", "forward_s", "time"),
                                      ("peak allocated", "peak_bytes", "memory")]),
    "train": ("AdamW step, autocast bf16 (--precision autocast-bf16)",
              [("first step peak", "first_step_peak_bytes", "memory"),
               ("steady step peak", "step_peak_bytes", "memory"),
               ("step time", "step_s", "time")]),
    "decode": ("Decode step (StaticCache)", [("KV cache bytes", "kv_cache_bytes", "memory"),
                                             ("step peak", "step_peak_bytes", "memory"),
                                             ("step time (eager)", "static_step_s", "time")]),
}


def measured_part(data: dict[str, Any], part: str) -> list[str]:
    title, figures = FIGURES[part]
    rows = []
    for row in data.get(part, []):
        name = row["case"]["name"]
        measured = row.get("measured", {})
        if "value" not in measured:
            rows.append((name, "-", "-", "-", "-", measured.get("error") or row.get("skipped", "")))
            continue
        for variant, values in _variants(part, measured["value"]):
            for label, key, kind in figures:
                for spec, predicted in row.get("predicted", {}).items():
                    guess = _predicted(part, variant, predicted).get(key)
                    shown = ms if kind == "time" else gib
                    tolerance = TIME_TOLERANCE if kind == "time" else MEMORY_TOLERANCE
                    rows.append((name + variant, label, spec, shown(guess), shown(values.get(key)),
                                 verdict(error(guess, values.get(key)), tolerance)
                                 if "value" in predicted else predicted.get("error", "")[:120]))
    if not rows:
        return []
    head = ("case", "figure", "spec", "predicted", "measured", "error")
    lines = [f"### {title}", "", *_table(head, rows)]
    if part == "decode":
        lines += ["", *decode_extras(data)]
    return lines


def _variants(part: str, value: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    if part == "train":
        return [(f" · loss {k}", v) for k, v in value.items()]
    return [("", value)]


def _predicted(part: str, variant: str, predicted: dict[str, Any]) -> dict[str, Any]:
    """The prediction a measured variant is compared with (a training step's, per loss)."""
    value = predicted.get("value", {})
    return value.get(variant.rpartition(" ")[2], {}) if part == "train" else value


def decode_extras(data: dict[str, Any]) -> list[str]:
    rows = []
    for row in data.get("decode", []):
        value = row.get("measured", {}).get("value")
        if value:
            rows.append((row["case"]["name"], ms(value.get("prefill_s")),
                         ms(value.get("static_step_s")), ms(value.get("kernel_step_s")),
                         ms(value.get("dynamic_step_s")), value.get("kernel_note") or ""))
    head = ("case", "prefill (C tokens)", "step, StaticCache", "step, GPU kernels only",
            "step, DynamicCache", "note")
    return ["Measured decode variants:", "", *_table(head, rows)]


def kernel_figures(data: dict[str, Any]) -> list[str]:
    k, instead = _part(data, "kernels", "Kernels")
    if k is None:
        return instead
    gemms = [(f"({g['m']}, {g['k']}) @ ({g['k']}, {g['n']})", "yes" if g["aligned"] else "no",
              ms(g["s"]), _rate(g["flops_per_s"], "FLOP/s")) for g in k["gemm"]]
    attention = [("×".join(map(str, a["shape"])), a["variant"], ms(a["s"]),
                  _rate(a["dense_flops_per_s"], "FLOP/s")) for a in k["attention"]]
    host = [(name, f"{us:.1f} µs") for name, us in k["host_us"].items()]
    convs = [(f"{c['in']}→{c['out']} g{c['groups']} b{c['batch']} {c['size']}²",
              "on" if c["tf32"] else "off", ms(c["s"]), _rate(c["flops_per_s"], "FLOP/s"),
              gib(c["workspace_bytes"])) for c in k["conv"]]
    return ["### Kernels", "", "bf16 GEMMs (`F.linear`), every dim a multiple of 8 or not:", "",
            *_table(("GEMM", "aligned", "time", "rate"), gemms), "",
            "Attention kernels (rate on the dense 4·B·H·T²·d work):", "",
            *_table(("B×H×T×d", "variant", "time", "dense rate"), attention), "",
            "Host cost per eager call:", "", *_table(("call", "per call"), host), "",
            "fp32 convolutions, cuDNN TF32 on and off:", "",
            *_table(("conv", "TF32", "time", "rate", "workspace"), convs)]


def markdown(data: dict[str, Any]) -> str:
    lines = [f"## GPU check: predictions against {data.get('env', {}).get('gpu') or 'the CPU'}",
             "", *environment(data), ""]
    for section in (calibration(data), kernel_figures(data), validation(data),
                    *(measured_part(data, p) for p in FIGURES)):
        if section:
            lines += [*section, ""]
    return "\n".join(lines)
