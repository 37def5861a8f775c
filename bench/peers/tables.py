"""Tables of the peer benchmark from bench/results/peers.json (see `bench/peers/run.py`).

    .venv/bin/python bench/peers/tables.py [bench/results/peers.json]   # re-render only

Three tables: a matrix of errors against the ground truth (model × tool), one summary row per
tool, and every (model, tool) pair in full.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

MAC_TOOLS = ("fvcore", "ptflops", "ptflops-aten", "thop", "torchinfo")
RESIDUAL_SHOWN = 0.05
STATUS_MARK = {"crash": "crash", "needs real weights": "needs weights",
               "no FLOP count": "no count", "cannot import": "no import"}


def missed(flops: int, truth: dict[str, Any]) -> str:
    """The truth categories a count of `flops` leaves out: the subset of categories (with or
    without fxlens's count of the other, elementwise work) whose sum is nearest `flops`."""
    categories = truth["categories"]
    names = sorted(categories, key=categories.get, reverse=True)
    best: tuple[int, int, tuple[str, ...], bool] | None = None
    for size in range(len(names), -1, -1):
        for chosen in itertools.combinations(names, size):
            for extra in (False, True):
                value = sum(categories[n] for n in chosen) + (truth["other_ops"] if extra else 0)
                key = (abs(flops - value), -size, chosen, extra)
                if best is None or key[:2] < best[:2]:
                    best = key
    assert best is not None
    gap, _, chosen, extra = best
    left = [n for n in names if n not in chosen]
    text = ", ".join(left) if left else "none"
    if extra:
        text += " (+ counts elementwise)"
    if gap > RESIDUAL_SHOWN * truth["basis"]:
        value = sum(categories[n] for n in chosen) + (truth["other_ops"] if extra else 0)
        text += f"; residual {(flops - value) / truth['basis']:+.0%}"
    return text


def error(result: dict[str, Any], truth: dict[str, Any]) -> float | None:
    if result.get("status") != "ok" or not result.get("flops") or not truth["basis"]:
        return None
    return (result["flops"] - truth["basis"]) / truth["basis"]


def cell(result: dict[str, Any] | None, truth: dict[str, Any]) -> str:
    if result is None:
        return "not run"
    err = error(result, truth)
    if err is None:
        return STATUS_MARK.get(result.get("status", ""), result.get("status", "?"))
    return f"{err:+.1%}" if abs(err) >= 0.0005 else "±0.0%"


def si(value: float | None) -> str:
    if value is None:
        return "—"
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {suffix}"
    return f"{value:.3g}"


def render(data: dict[str, Any]) -> str:
    truth, results = data["truth"], data["results"]
    by = {(r["tool"], r["case"]): r for r in results}
    cases = list(truth)
    tools = list(dict.fromkeys(["fxlens", *(r["tool"] for r in results)]))
    meta = data.get("meta", {})
    lines = [
        f"Measured {meta.get('date', '?')} on {meta.get('machine', '?')}, "
        f"{meta.get('cpus', '?')} shared cores; median of {meta.get('repeat', '?')} runs, each "
        f"in its own process. Versions: "
        + ", ".join(f"{k} {v}" for k, v in sorted(meta.get("versions", {}).items())) + ".",
        "",
        "Error of each tool's total against the ground truth (GEMM + conv + dense attention, "
        "FLOPs = 2 × MACs); fxlens's column is its own total, which also counts elementwise "
        "work, norms, softmax and only the causal half of causal attention:",
        "",
        "| model | basis FLOPs | fxlens total | " + " | ".join(t for t in tools
                                                              if t != "fxlens") + " |",
        "|---|---|---|" + "---|" * (len(tools) - 1),
    ]
    for case in cases:
        t = truth[case]
        fx = by.get(("fxlens", case))
        fx_text = f"{si(fx['flops'])} ({cell(fx, t)})" if fx and fx.get("flops") else cell(fx, t)
        lines.append(f"| {case} | {si(t['basis'])} | {fx_text} | " + " | ".join(
            cell(by.get((tool, case)), t) for tool in tools if tool != "fxlens") + " |")
    lines += ["", "Per tool, over the models above (time: median over models of the tool's "
              "median wall time ÷ fxlens's on the same model; both end to end, one process "
              "per run):", "",
              "| tool | reports | ok | crash | needs real weights | median \\|error\\| | "
              "time vs fxlens | max peak RSS |", "|---|---|---|---|---|---|---|---|"]
    for tool in tools:
        mine = [by[(tool, c)] for c in cases if (tool, c) in by]
        errors = [abs(e) for r in mine if (e := error(r, truth[r["case"]])) is not None]
        ratios = [r["wall_s"] / by[("fxlens", r["case"])]["wall_s"] for r in mine
                  if ("fxlens", r["case"]) in by]
        unit = "MACs" if tool in MAC_TOOLS else ("nothing" if tool == "torchview" else "FLOPs")
        count = {s: sum(r.get("status") == s for r in mine)
                 for s in ("ok", "crash", "needs real weights")}
        lines.append(
            f"| {tool} | {unit} | {count['ok']} | {count['crash']} | "
            f"{count['needs real weights']} | "
            f"{f'{statistics.median(errors):.1%}' if errors and tool != 'fxlens' else '—'} | "
            f"{statistics.median(ratios):.2f}× | "
            f"{max(r['peak_rss_bytes'] for r in mine) / 2**30:.2f} GiB |")
    lines += ["", "<details><summary>Every model and tool</summary>", "",
              "| model | tool | status | FLOPs (2×MAC) | error | missed (inferred) | wall | "
              "× fxlens | peak RSS | note |", "|---|---|---|---|---|---|---|---|---|---|"]
    for case in cases:
        for tool in tools:
            r = by.get((tool, case))
            if r is None:
                continue
            fx = by.get(("fxlens", case))
            t = truth[case]
            ok = r.get("status") == "ok" and r.get("flops")
            gone = missed(r["flops"], t) if ok and tool != "fxlens" else ""
            ratio = f"{r['wall_s'] / fx['wall_s']:.2f}×" if fx else "—"
            note = r.get("error") or ""
            if r.get("mode") in ("meta", "fake"):
                note = f"ran on {r['mode']} tensors" + (f" ({r['errors'][0]})"
                                                         if r.get("errors") else "")
            if r.get("skipped_ops"):
                note += ("; " if note else "") + "skipped: " + ", ".join(sorted(r["skipped_ops"]))
            lines.append(
                f"| {case} | {tool} | {r.get('status')} | {si(r.get('flops'))} | "
                f"{cell(r, t) if ok else '—'} | {gone} | {r['wall_s']:.1f} s | {ratio} | "
                f"{r['peak_rss_bytes'] / 2**30:.2f} GiB | {note.replace('|', '/')} |")
    lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("bench/results/peers.json")
    print(render(json.loads(path.read_text())))
