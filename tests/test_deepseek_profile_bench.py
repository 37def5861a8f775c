"""bench/deepseek_profile.py reads a PyTorch profiler trace as DeepSeek's published one is laid
out: per CPU annotation, the host's time and the kernels launched in it (a phase that waits on
the all-to-all left out of the per-kernel figure), and the busiest stream's kernel time."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))
import deepseek_profile  # noqa: E402


def mark(name: str, ts: int, dur: int) -> dict:
    return {"cat": "user_annotation", "name": name, "ts": ts, "dur": dur}


def launch(ts: int) -> dict:
    return {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 3}


def kernel(stream: int, dur: int) -> dict:
    return {"cat": "kernel", "name": "k", "ts": 0, "dur": dur, "args": {"stream": stream}}


def test_host_per_kernel_leaves_the_all_to_all_wait_out() -> None:
    events = [mark("ProfilerStep#1", 0, 10_000), mark("1F1B", 0, 10_000)]
    for layer in range(2):                      # two layers: attn(F) 400 µs, 4 launches each
        base = layer * 5000
        events += [mark("attn(F)", base, 400), mark("dispatch(F)", base + 500, 3000)]
        events += [launch(base + 10 + 50 * i) for i in range(4)]
        events += [launch(base + 600)]          # inside the waiting phase
        events += [kernel(7, 900), kernel(27, 300)]
    found = deepseek_profile.figures(events)
    assert found.layers == 2
    assert found.launches_per_layer == 4
    assert found.host_per_launch_s == pytest.approx(400e-6 / 4)
    assert found.host_per_layer_s == pytest.approx(400e-6)
    assert found.gpu_per_layer_s == pytest.approx(900e-6)
    waits = {p.name: p for p in found.phases}["dispatch(F)"]
    assert waits.launches == 2 and waits.host_s == pytest.approx(6000e-6)
