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
    monkeypatch.setattr(write, "DEFAULT_SVG_BUDGET_S", 1e-6)
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
