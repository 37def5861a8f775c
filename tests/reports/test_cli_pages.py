"""`analyze` writes the graph and pages by default and where the flags say; without graphviz
it still writes the DOT and says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxlens.cli.main import main
from fxlens.reports import write

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "tests/models/mlp.py")


def test_default_files_in_the_report_folder(tmp_path: Path) -> None:
    assert main([MODEL, "--out", str(tmp_path), "--quiet"]) == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert {"report.json", "graph.dot", "report.html", "summary.md"} <= names
    if write.dot_binary():
        assert "graph.svg" in names
        assert 'id="graph-view"' in (tmp_path / "report.html").read_text()


def test_explicit_paths_and_png(tmp_path: Path) -> None:
    args = [MODEL, "--out", str(tmp_path / "o"), "--quiet", "--dot", str(tmp_path / "g.dot"),
            "--html", str(tmp_path / "p.html"), "--md", str(tmp_path / "s.md"),
            "--color", "bytes", "--expand"]
    if write.dot_binary():
        args += ["--svg", str(tmp_path / "g.svg"), "--png"]
    assert main(args) == 0
    assert "coloured by bytes" in (tmp_path / "g.dot").read_text()
    assert (tmp_path / "p.html").exists() and (tmp_path / "s.md").exists()
    if write.dot_binary():
        assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_without_graphviz_a_clear_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(write, "dot_binary", lambda: None)
    assert main([MODEL, "--out", str(tmp_path), "--quiet"]) == 0
    assert "graphviz's `dot` not found" in capsys.readouterr().err
    assert (tmp_path / "graph.dot").exists() and not (tmp_path / "graph.svg").exists()
    assert 'id="graph-missing"' in (tmp_path / "report.html").read_text()


@pytest.mark.skipif(write.dot_binary() is None, reason="graphviz's dot is not installed")
def test_a_slow_layout_skips_the_default_svg_with_a_note(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A layout that needs more than its budget (a dot that never ends, given 1 s) is
    stopped, and the page and the DOT are written without it. (A tiny budget alone no
    longer shows it: the layouts start once the ops are costed, and one done by the time
    the pages read it is taken.)"""
    from fxlens.reports import dot

    fake = tmp_path / "slow-dot"
    fake.write_text("#!/bin/sh\ncat >/dev/null\nwhile :; do :; done\n")
    fake.chmod(0o755)
    monkeypatch.setattr(dot, "dot_binary", lambda: str(fake))
    monkeypatch.setattr(write, "DEFAULT_SVG_BUDGET_S", 1)
    assert main([MODEL, "--out", str(tmp_path), "--quiet"]) == 0
    assert "render it with --svg PATH" in capsys.readouterr().err
    assert (tmp_path / "graph.dot").exists() and not (tmp_path / "graph.svg").exists()
    assert (tmp_path / "report.html").exists()


@pytest.mark.skipif(write.dot_binary() is None, reason="graphviz's dot is not installed")
def test_a_block_layout_that_fails_leaves_the_graph_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The block layouts run beside the whole graph's: one failing costs only the in-place
    expansion, with a note."""
    monkeypatch.setattr(write, "render_block_dot", lambda *_: "not a graph {")
    assert main([str(ROOT / "tests/models/tiny_gpt.py"), "--out", str(tmp_path), "--quiet"]) == 0
    assert "expanded blocks skipped on the page" in capsys.readouterr().err
    assert (tmp_path / "graph.svg").exists() and (tmp_path / "summary.md").exists()
    assert "<svg" in (tmp_path / "report.html").read_text()


def test_time_colour_without_roofline_is_a_clear_error(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    assert main([MODEL, "--out", str(tmp_path), "--quiet", "--color", "time"]) == 2
    assert "roofline" in capsys.readouterr().err


needs_dot = pytest.mark.skipif(write.dot_binary() is None, reason="graphviz's dot is not installed")


@needs_dot
def test_a_layout_can_be_read_by_a_forked_child(tmp_path: Path) -> None:
    """The CLI starts the layouts and a forked child writes the pages: the child reads
    dot's output through the pipe though dot is not its child."""
    import os

    from fxlens.reports.dot import Layout

    layout = Layout("digraph { a -> b }")
    read, written = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: write what it read, then leave without running exit handlers
        os.close(read)
        try:
            os.write(written, layout.result())
        finally:
            os._exit(0)
    os.close(written)
    with os.fdopen(read, "rb") as pipe:
        svg = pipe.read()
    os.waitpid(pid, 0)
    layout.close()
    assert svg.startswith(b"<?xml") and svg.rstrip().endswith(b"</svg>")


def test_a_layout_cut_short_is_a_failure_even_with_exit_status_0(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where dot is not this process's child its exit status reads 0: an SVG without its
    closing tag (dot crashed halfway) must still fail."""
    from fxlens.analyzer.core.errors import ReportError
    from fxlens.reports import dot

    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\ncat >/dev/null\nprintf '<svg><g>'\necho 'cut short' >&2\n")
    fake.chmod(0o755)
    monkeypatch.setattr(dot, "dot_binary", lambda: str(fake))
    with pytest.raises(ReportError, match="failed: cut short"):
        dot.graphviz_render("digraph { a }")


@needs_dot
def test_layouts_started_early_are_the_ones_the_pages_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`write_pages` takes a layout started from the costed report where the final report
    gives the same DOT source, starts its own where not, and writes the same pages."""
    from fxlens.analyzer.core.loaded import LoadedModel
    from fxlens.api import AnalysisOptions, analyze_loaded
    from tests.models import tiny_gpt

    module, inputs = tiny_gpt.build()
    report = analyze_loaded(LoadedModel(module, inputs, "tiny_gpt", "tiny_gpt.py"),
                            AnalysisOptions())
    options = write.PageOptions(folder=tmp_path / "plain")
    write.write_pages(report, options)
    early = write.start_layouts(report, options)
    assert len(early) == 2                       # the block, then the whole graph
    stale = write.start_layouts(report, write.PageOptions(folder=tmp_path, color="bytes"))
    made: list[str] = []
    render = write.graphviz_render

    def counted(source: str, *args: object) -> bytes:
        made.append(source)
        return render(source, *args)             # type: ignore[arg-type]

    monkeypatch.setattr(write, "graphviz_render", counted)
    early_options = write.PageOptions(folder=tmp_path / "early")
    write.write_pages(report, early_options, {**early, **stale})
    assert made == []                            # every layout came from `early`
    write.write_pages(report, write.PageOptions(folder=tmp_path / "stale"), stale)
    assert len(made) == 2                        # other sources: laid out anew
    monkeypatch.setattr(write, "PARALLEL_LAYOUTS", 1)
    first = write.start_layouts(report, options)
    assert len(first) == 1                       # at most PARALLEL_LAYOUTS started at once
    write.write_pages(report, write.PageOptions(folder=tmp_path / "capped"), first)
    assert len(made) == 3                        # the whole graph laid out then
    write.close_layouts({**early, **stale, **first})
    for name in ("graph.dot", "graph.svg", "report.html", "summary.md"):
        assert ((tmp_path / "early" / name).read_bytes()
                == (tmp_path / "plain" / name).read_bytes()
                == (tmp_path / "stale" / name).read_bytes()
                == (tmp_path / "capped" / name).read_bytes()), name


def test_no_layout_starts_before_the_report_can_be_drawn(tmp_path: Path) -> None:
    """Coloured by time, the graph needs the roofline section, which comes after costing."""
    from fxlens.analyzer.core.loaded import LoadedModel
    from fxlens.api import AnalysisOptions, analyze_loaded
    from tests.models import mlp

    module, inputs = mlp.build()
    report = analyze_loaded(LoadedModel(module, inputs, "mlp", "mlp.py"), AnalysisOptions())
    assert write.start_layouts(report, write.PageOptions(folder=tmp_path, color="time")) == {}


def test_a_layout_nobody_reads_stops_at_its_budget(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Started early, a layout may be read long after its budget: dot must not keep a core
    busy until then."""
    import time

    from fxlens.analyzer.core.errors import ReportError
    from fxlens.reports import dot

    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\ncat >/dev/null\nwhile :; do :; done\n")
    fake.chmod(0o755)
    monkeypatch.setattr(dot, "dot_binary", lambda: str(fake))
    layout = dot.Layout("digraph { a }", "svg", timeout_s=0.5)
    try:
        deadline = time.monotonic() + 20
        while layout._process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert layout._process.poll() is not None, "dot still runs past its CPU budget"
        with pytest.raises(ReportError, match="took over 0.5 s"):
            layout.result()
    finally:
        layout.close()


@needs_dot
def test_without_poll_a_layout_is_read_by_communicate(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Where `select.poll` is missing (Windows), nothing forks, so dot is this process's
    child: its output, its exit status and its budget come through `communicate`."""
    import select

    from fxlens.analyzer.core.errors import ReportError
    from fxlens.reports import dot

    monkeypatch.delattr(select, "poll")
    assert dot.graphviz_render("digraph { a -> b }").rstrip().endswith(b"</svg>")
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\ncat >/dev/null\nwhile :; do :; done\n")
    fake.chmod(0o755)
    monkeypatch.setattr(dot, "dot_binary", lambda: str(fake))
    with pytest.raises(ReportError, match="took over 0.5 s"):
        dot.graphviz_render("digraph { a }", "svg", 0.5)
