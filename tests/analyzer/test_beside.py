"""Work beside (`fxlens.analyzer.core.beside`): a forked child's result comes back, and
anything else (an exception, a death, a hang) is one `BesideError` with the child reaped;
the capture that starts its trace beside the proof gives the nodes it gives without forking."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time

import pytest
import torch

from fxlens.analyzer.capture import chain
from fxlens.analyzer.capture.blocks import guessed_repeats
from fxlens.analyzer.core import beside
from fxlens.analyzer.core.beside import Beside, BesideError
from tests.analyzer.test_blocks import Block, Stack, _assert_identical

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forking is used on Linux only")


def _reaped(started: Beside) -> bool:
    try:
        os.waitpid(started._pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_the_result_is_computed_in_the_child_and_its_changes_stay_there():
    touched: list[int] = []

    def work() -> int:
        touched.append(1)
        return os.getpid()

    started = Beside(work)
    assert started.result() not in (os.getpid(), None)
    assert touched == []                  # the child's copy of the list, not ours
    assert _reaped(started)


def test_an_exception_in_the_child_is_one_beside_error_with_its_message():
    def work() -> None:
        raise ValueError("no such block")

    started = Beside(work)
    with pytest.raises(BesideError, match="ValueError: no such block"):
        started.result()
    assert _reaped(started)


def test_a_child_that_dies_gives_a_beside_error():
    started = Beside(lambda: os.kill(os.getpid(), signal.SIGKILL))
    with pytest.raises(BesideError, match="without a result"):
        started.result()


def test_a_child_that_hangs_is_killed_past_its_time(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(beside, "MIN_WAIT_S", 0.5)
    monkeypatch.setattr(beside, "WAIT_FACTOR", 0.0)
    started = Beside(lambda: time.sleep(60))
    begun = time.monotonic()
    with pytest.raises(BesideError, match="took more than"):
        started.result()
    assert time.monotonic() - begun < 10
    assert _reaped(started)


def test_nothing_forks_unless_the_process_allows_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(beside, "_allowed", False)
    with beside.beside(os.getpid) as started:
        assert started is None


def test_no_work_starts_nothing(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(beside, "can_fork", lambda: True)
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked with nothing to do"))
    with beside.beside(None) as started:
        assert started is None


def test_a_fork_that_fails_leaves_the_work_to_the_caller(monkeypatch: pytest.MonkeyPatch):
    def refused() -> int:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(beside, "can_fork", lambda: True)
    monkeypatch.setattr(os, "fork", refused)
    with beside.beside(os.getpid) as started:
        assert started is None


def test_nothing_forks_once_cuda_is_started(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(beside, "_allowed", True)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert beside.can_fork()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not beside.can_fork()


def _by_export_forked(monkeypatch: pytest.MonkeyPatch, model: torch.nn.Module,
                      x: torch.Tensor) -> chain.Captured:
    monkeypatch.setattr(beside, "_allowed", True)
    monkeypatch.setattr(beside, "can_fork", lambda: True)   # also on a one-core runner
    monkeypatch.setattr(chain, "can_fork", lambda: True)
    return chain._by_export(model, (x,), {}, registry=None)


def test_a_trace_beside_the_proof_is_used_when_the_guess_is_proven(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    model, x = Stack([Block(8, 16) for _ in range(4)]), torch.randn(8, 8)
    with caplog.at_level(logging.INFO, logger="fxlens.analyzer.capture.chain"):
        forked = _by_export_forked(monkeypatch, model, x)
    assert "made beside the proof is used" in caplog.text
    assert "copied 3 blocks" in caplog.text
    _assert_identical(forked, chain._export(model, (x,), {}, chain.Repeats()))


def test_a_wrong_guess_is_not_used(monkeypatch: pytest.MonkeyPatch,
                                   caplog: pytest.LogCaptureFixture):
    """Same class and weights, but one block reads another mask: the structure guesses one
    group, the proof finds two, and the trace after the proof is the one used."""
    model = Stack([Block(8, 16), Block(8, 16, sliding=True), Block(8, 16), Block(8, 16,
                                                                                 sliding=True)])
    x = torch.randn(8, 8)
    assert [g.members for g in guessed_repeats(model).groups] == [
        ("blocks.0", "blocks.1", "blocks.2", "blocks.3")]
    with caplog.at_level(logging.INFO, logger="fxlens.analyzer.capture.chain"):
        forked = _by_export_forked(monkeypatch, model, x)
    assert "guessed other groups than the proof found" in caplog.text
    _assert_identical(forked, chain._export(model, (x,), {}, chain.Repeats()))


@pytest.mark.slow
def test_the_console_script_forks_and_writes_the_files_main_writes(
        tmp_path, monkeypatch: pytest.MonkeyPatch):
    """``python -m fxlens`` may fork (`fxlens.cli.main.entry`): the trace beside the proof,
    the pages beside the JSON. In-process `main` may not: the same files either way."""
    import subprocess

    from fxlens.cli.main import main
    from tests.test_cli import ROOT

    model = str(ROOT / "tests/models/tiny_gpt.py")
    forked, plain = tmp_path / "forked", tmp_path / "plain"
    run = subprocess.run([sys.executable, "-m", "fxlens", model, "--quiet", "--debug",
                          "--out", str(forked)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "copied" in run.stderr and "made beside is not used" not in run.stderr
    if len(os.sched_getaffinity(0)) >= 2:
        assert "made beside the proof is used" in run.stderr
    monkeypatch.chdir(tmp_path)          # source lines are shown relative to the cwd
    assert main([model, "--quiet", "--out", str(plain)]) == 0
    names = sorted(p.name for p in plain.iterdir())
    assert names == sorted(p.name for p in forked.iterdir())
    assert {"report.json", "report.html", "summary.md", "graph.dot"} <= set(names)
    for name in names:
        assert (forked / name).read_bytes() == (plain / name).read_bytes(), name


def test_pages_whose_child_failed_are_written_here(tmp_path, monkeypatch: pytest.MonkeyPatch):
    from fxlens.cli.main import main
    from tests.test_cli import ROOT

    class Failed:
        def result(self, timeout_s: float) -> None:
            raise BesideError("the child died")

    started: list[object] = []

    @contextlib.contextmanager
    def failing(work):
        started.append(work)
        yield Failed()

    monkeypatch.setattr(beside, "beside", failing)
    assert beside.result_or_none(Failed(), "the pages", 1.0) is None  # type: ignore[arg-type]
    assert main([str(ROOT / "tests/models/mlp.py"), "--quiet", "--out", str(tmp_path)]) == 0
    assert len(started) == 1                    # the pages were started beside, and failed
    assert (tmp_path / "report.html").is_file() and (tmp_path / "summary.md").is_file()


@pytest.mark.parametrize("fails_in_child", [False, True])
def test_fusion_beside_the_memory_passes_gives_the_sections_made_here(
        monkeypatch: pytest.MonkeyPatch, fails_in_child: bool):
    """A big graph's fusion analysis runs in a child while the parent runs the memory
    passes (`fxlens.pipeline`); its sections are the ones the parent makes, and a child that
    fails leaves the analysis to the parent."""
    from fxlens import pipeline
    from fxlens.analyzer.core.loaded import LoadedModel
    from fxlens.analyzer.core.sections import Findings, Fusion
    from fxlens.api import AnalysisOptions, analyze_loaded
    from tests.models import tiny_gpt

    parent, made_here = os.getpid(), []
    fusion_analysis = pipeline.fusion_analysis

    def counted(ctx, report):
        if os.getpid() == parent:
            made_here.append(1)
        elif fails_in_child:
            raise RuntimeError("the child's fusion failed")
        return fusion_analysis(ctx, report)

    def report():
        module, inputs = tiny_gpt.build()
        return analyze_loaded(LoadedModel(module, inputs, "tiny_gpt", "tiny_gpt.py"),
                              AnalysisOptions(train=True, device="h100"))

    monkeypatch.setattr(pipeline, "fusion_analysis", counted)
    plain = report()
    assert made_here == [1]
    monkeypatch.setattr(beside, "can_fork", lambda: True)   # also on a one-core runner
    monkeypatch.setattr(pipeline, "FUSION_BESIDE_MIN_NODES", 0)
    made_here.clear()
    forked = report()
    assert made_here == ([1] if fails_in_child else [])
    for kind in (Fusion, Findings):
        assert forked.require(kind) == plain.require(kind)
