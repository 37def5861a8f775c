"""The GPU timeline of an eager run: kernels wait for the host only when it falls behind."""

from __future__ import annotations

import pytest

from fxlens.analyzer.time.host import HostCosts, Issue, gpu_timeline

LAUNCH = 1.0
HOST = HostCosts(launch_s=LAUNCH, free_s=0.25, module_s=2.0)


def kernels(*works: float, module: str = "", phase: str = "backward") -> list[Issue]:
    return [Issue(w, module, phase) for w in works]


def test_gpu_bound_kernels_hide_the_host_after_the_first() -> None:
    added = gpu_timeline(kernels(5.0, 5.0, 5.0), HOST)
    assert added == [(LAUNCH + 5.0, LAUNCH), (5.0, 0.0), (5.0, 0.0)]


def test_host_bound_kernels_take_the_launch_each() -> None:
    added = gpu_timeline(kernels(0.1, 0.1, 0.1), HOST)
    assert [t for t, _ in added] == pytest.approx([LAUNCH + 0.1, LAUNCH, LAUNCH])
    assert sum(t for t, _ in added) == pytest.approx(3 * LAUNCH + 0.1)


def test_free_ops_and_module_calls_delay_the_next_kernel() -> None:
    issues = [Issue(None, "a", "forward"), Issue(0.1, "a", "forward"),
              Issue(0.1, "a.b", "forward"), Issue(0.1, "a.b", "forward")]
    added = gpu_timeline(issues, HOST)
    # "" and "a" entered (2 modules) and a view before the first kernel; "a.b" later.
    assert added[0] == (0.0, 0.0)
    assert added[1][1] == pytest.approx(2 * 2.0 + 0.25 + LAUNCH)
    assert added[2][1] == pytest.approx(2.0 + LAUNCH - 0.1)
    assert added[3][1] == pytest.approx(LAUNCH - 0.1)


def test_backward_nodes_pay_no_module_calls() -> None:
    forward = gpu_timeline(kernels(0.1, module="a.b", phase="forward"), HOST)
    backward = gpu_timeline(kernels(0.1, module="a.b", phase="backward"), HOST)
    assert forward[0][0] - backward[0][0] == pytest.approx(3 * 2.0)
