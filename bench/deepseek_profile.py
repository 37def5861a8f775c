"""DeepSeek-V3's published training trace against fxlens: a MoE layer's GPU time, and the host
time a Python training framework spends per kernel it launches (issue 30).

deepseek-ai/profile-data (commit ae7fc0780d06b5e51aec4ca3005b03d575209643) publishes
``train.json``, a PyTorch profiler trace of DeepSeek's own training framework on an H800:
one forward chunk and one backward chunk of four MoE layers each, overlapped as DualPipe
runs them (EP64, TP1, 4K sequence, routing forced to balance). Its CPU annotations name each
phase of a layer (``attn(F)``, ``mlp(B)``, ``dispatch(F)``…). Per layer's forward and
backward this reads, from the trace alone:

- the host's time in each phase and the kernels it launched there (``cudaLaunchKernel*``),
  leaving out ``dispatch(F)``, whose time is a wait for the all-to-all: host seconds per
  kernel launched, the figure a plan's host floor costs (`fxlens.analyzer.plan.host`);
- the busiest stream's kernel time (the compute stream; DeepEP's kernels run beside it on
  their own SMs).

The trace stays outside this repository (fetch the repository, pass the file):

    python bench/deepseek_profile.py path/to/train.json [--predict]

``--predict`` adds fxlens's seconds for one MoE layer's forward and backward at that layout
(``hf:deepseek-v3``, fp8, ``--fused``, H100 figures: the H800 is an H100 with fewer NVLink
lanes), alone and on the SMs DeepEP leaves it (`fxlens.analyzer.plan.transfers.DEEPEP_SMS`).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WAITING = ("dispatch(F)",)          # the host waits on the all-to-all in these
OUTER = ("ProfilerStep", "1F1B")    # annotations around the whole chunk pair
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC")


@dataclass(frozen=True)
class Phase:
    name: str
    count: int             # occurrences (one per layer)
    host_s: float          # host time in the phase, all occurrences
    launches: int          # kernels launched in it


@dataclass(frozen=True)
class TraceFigures:
    layers: int
    phases: tuple[Phase, ...]
    compute_stream_s: float     # the busiest stream's kernel time, all layers

    @property
    def working(self) -> list[Phase]:
        return [p for p in self.phases if p.name not in WAITING]

    @property
    def host_per_launch_s(self) -> float:
        return (sum(p.host_s for p in self.working)
                / max(sum(p.launches for p in self.working), 1))

    @property
    def launches_per_layer(self) -> float:
        return sum(p.launches for p in self.working) / self.layers

    @property
    def host_per_layer_s(self) -> float:
        return sum(p.host_s for p in self.working) / self.layers

    @property
    def gpu_per_layer_s(self) -> float:
        return self.compute_stream_s / self.layers


def figures(events: Sequence[Mapping[str, Any]]) -> TraceFigures:
    """The trace's phases (host time, launches) and its busiest stream's kernel time."""
    marks = sorted((e for e in events if e.get("cat") == "user_annotation"
                    and not str(e["name"]).startswith(OUTER)), key=lambda e: e["ts"])
    launches = sorted(e["ts"] for e in events
                      if e.get("cat") == "cuda_runtime" and e["name"] in LAUNCHES)
    host: defaultdict[str, float] = defaultdict(float)
    count: Counter[str] = Counter()
    launched: Counter[str] = Counter()
    for mark in marks:
        start, end = mark["ts"], mark["ts"] + mark["dur"]
        host[mark["name"]] += mark["dur"] * 1e-6
        count[mark["name"]] += 1
        launched[mark["name"]] += sum(1 for t in launches if start <= t < end)
    streams: defaultdict[Any, float] = defaultdict(float)
    for e in events:
        if e.get("cat") == "kernel":
            streams[e["args"]["stream"]] += e["dur"] * 1e-6
    phases = tuple(Phase(n, count[n], host[n], launched[n]) for n in count)
    return TraceFigures(layers=max(count.values(), default=1), phases=phases,
                        compute_stream_s=max(streams.values(), default=0.0))


def predicted_layer_s() -> tuple[float, float]:
    """fxlens's seconds for one DeepSeek-V3 MoE layer's forward and backward at EP64, TP1:
    alone, and slowed to the SMs DeepEP's kernels leave it."""
    from fxlens.analyzer.capture.load import load
    from fxlens.analyzer.plan.strategy import parse
    from fxlens.analyzer.plan.transfers import DEEPEP_SMS
    from fxlens.analyzer.plan.unit_share import phase_s
    from fxlens.pipeline import AnalysisOptions, Context, run_context
    from fxlens.plan_pass import plan_facts
    from fxlens.rules.hardware import DEVICES

    spec = DEVICES["h100"]
    options = AnalysisOptions(train=True, plan=True, fused=True, precision="fp8",
                              device="h100", strategy="ddp", gpus=64)
    loaded = load("hf:deepseek-v3", None, {"num_hidden_layers": "4"},
                  {"seq_len": 4096, "batch": 1}, True)   # three dense layers, one MoE
    ctx = Context(loaded, options, lambda _: None)
    facts = plan_facts(ctx, run_context(ctx), spec)
    layout = parse("dp=64,ep=64", 64)
    moe = [u for u in facts.units if u.expert_gemms][-1]
    alone = phase_s(layout, moe, "forward") + phase_s(layout, moe, "backward")
    return alone, alone * spec.multiprocessors / (spec.multiprocessors - DEEPEP_SMS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--predict", action="store_true")
    args = parser.parse_args()
    found = figures(json.loads(args.trace.read_text())["traceEvents"])
    print("| phase | host per layer | kernels launched |\n|---|---:|---:|")
    for p in found.phases:
        print(f"| {p.name}{' (waits)' if p.name in WAITING else ''} | "
              f"{p.host_s / p.count * 1e3:.2f} ms | {p.launches / p.count:.1f} |")
    print(f"\nper layer: host {found.host_per_layer_s * 1e3:.2f} ms over "
          f"{found.launches_per_layer:.0f} kernels = {found.host_per_launch_s * 1e6:.1f} µs "
          f"per kernel; compute stream {found.gpu_per_layer_s * 1e3:.2f} ms")
    if args.predict:
        alone, shared = predicted_layer_s()
        print(f"fxlens, one MoE layer forward + backward: {alone * 1e3:.2f} ms alone, "
              f"{shared * 1e3:.2f} ms on the SMs DeepEP leaves "
              f"({shared / found.gpu_per_layer_s - 1:+.0%} against the trace)")


if __name__ == "__main__":
    main()
