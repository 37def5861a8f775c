"""The host's side of an eager run on a GPU: Python and the dispatcher issue kernels that the
GPU runs asynchronously, so a step takes its kernels' time only while the host keeps ahead.

The host spends, in graph order:
- per costed op: `launch_s` (the dispatcher and the launch of its kernel);
- per free op (a view, a metadata query): `host_free_s` (the dispatcher, no kernel);
- per module call, when a forward node first enters it: `host_module_s` (``nn.Module.__call__``
  and the Python around the ops). Backward nodes pay no module cost: autograd's engine runs
  the backward from C++.
The GPU starts a kernel once it has been issued and the previous one has ended::

    host_t += host_i;   start = max(host_t, gpu_t);   gpu_t = start + work_i

A kernel's time is what it adds to the GPU's timeline: its work (the roofline's
max(compute, memory)), plus the wait for the host when the host is behind ("launch"-bound).
Free ops add nothing of their own: the host time they take shows as the next kernel's wait.
The total is the end of the timeline, the sum of node times.

Measured on an H200 (bench/gpu, 2026-11-27): GPT-2 at batch 1 and 1,024 tokens ran its kernels
for 1.96 ms of a 5.94 ms forward: the host decided the time.
NB: the first kernel waits for the host's whole preamble; work the host does after the last
kernel (returning outputs) is not counted. On a CPU the host is the device: a node's time is
its work plus its launch, in turn (`fxlens.analyzer.time.roofline`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fxlens.analyzer.core.graph import ancestors


@dataclass(frozen=True)
class HostCosts:
    """Seconds the host spends per costed op, per free op and per module call entered."""

    launch_s: float
    free_s: float
    module_s: float


@dataclass(frozen=True)
class Issue:
    """One node as the timeline sees it: its GPU work (None: no kernel) and where it runs."""

    work_s: float | None
    module: str
    phase: str


def gpu_timeline(issues: Sequence[Issue], host: HostCosts) -> list[tuple[float, float]]:
    """Per node: (the time it adds to the GPU's timeline, of which the wait for the host)."""
    host_t = gpu_t = 0.0
    entered: set[str] = set()
    added: list[tuple[float, float]] = []
    for issue in issues:
        if issue.phase == "forward":
            new = [path for path in ancestors(issue.module) if path not in entered]
            entered.update(new)
            host_t += len(new) * host.module_s
        if issue.work_s is None:
            host_t += host.free_s
            added.append((0.0, 0.0))
            continue
        host_t += host.launch_s
        wait = max(host_t - gpu_t, 0.0)
        added.append((wait + issue.work_s, wait))
        gpu_t += wait + issue.work_s
    return added
