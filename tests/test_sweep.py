"""`analyze sweep`: the grid, a row per point (errors included), streaming and resume, the
outputs (CSV, JSON, page with charts), a process pool and a local Ray instance."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from fxlens import sweep
from fxlens.cli.main import main
from fxlens.reports.sweep import render_sweep_html, sweep_view
from fxlens.sweep import COLUMNS, Point, SweepSpec, axis_value, grid, run_sweep, swept_axes

MODELS = Path(__file__).parent / "models"
MLP = str(MODELS / "mlp.py")
GPT = str(MODELS / "tiny_gpt.py")


def test_grid_is_the_product_in_order() -> None:
    points = grid(["a", "b"], {"n": ["1", "2"]}, batches=[1, 8], devices=["h100"])
    assert len(points) == 2 * 2 * 2
    assert points[0] == Point("a", (("n", "1"),), 1, None, "h100", None)
    assert points[-1] == Point("b", (("n", "2"),), 8, None, "h100", None)
    assert len({p.key() for p in points}) == len(points)


def test_every_point_is_a_row_and_a_failure_is_a_row(tmp_path: Path) -> None:
    points = grid([MLP, str(tmp_path / "missing.py")], batches=[1, 4])
    rows = run_sweep(points, SweepSpec(), tmp_path / "out")
    assert [r["status"] for r in rows] == ["ok", "ok", "error", "error"]
    assert "missing.py" in rows[2]["error"]
    ok = rows[:2]
    assert ok[1]["flops"] == 4 * ok[0]["flops"]          # FLOPs linear in batch
    assert ok[0]["flops_of"] == "forward" and ok[0]["peak_bytes"] > 0
    assert ok[0]["peak_of"] == "weights + activation peak (eager, simulated)"
    streamed = sweep.read_rows(tmp_path / "out" / sweep.ROWS_FILE)
    assert len(streamed) == 4 and all(set(COLUMNS) <= set(r) for r in streamed)


def test_a_training_row_says_which_step_peak_it_counts() -> None:
    from fxlens.analyzer.core.sections import Training
    from fxlens.api import analyze_target

    spec = SweepSpec(train=True, checkpoint=True)
    row = sweep.run_point(Point(GPT), spec)
    report = analyze_target(GPT, spec.options(Point(GPT)))
    assert row["flops_of"] == "training step"
    assert row["peak_of"] == "training step peak (one device, checkpointed)"
    assert row["peak_bytes"] == report.require(Training).checkpointed_peak_bytes
    plain = sweep.run_point(Point(GPT), SweepSpec(train=True))
    assert plain["peak_of"] == "training step peak (one device)"


def test_resume_skips_the_points_that_succeeded(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    points = grid([MLP], batches=[1, 2, 3])
    out = tmp_path / "out"
    run_sweep(points[:2], SweepSpec(), out)
    with (out / sweep.ROWS_FILE).open("a") as sink:
        sink.write('{"cut short by a kill')               # an interrupted write
    ran: list[Point] = []
    real = sweep.run_point

    def counting(point: Point, spec: SweepSpec) -> dict[str, Any]:
        ran.append(point)
        return real(point, spec)

    monkeypatch.setattr(sweep, "run_point", counting)
    rows = run_sweep(points, SweepSpec(), out, resume=True)
    assert ran == [points[2]]
    assert [r["batch"] for r in rows] == [1, 2, 3] and all(r["status"] == "ok" for r in rows)


def test_cli_writes_csv_json_and_a_page_with_charts(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["sweep", MLP, "--batch", "1,2,4", "--device", "h100", "--out", str(out),
                 "--csv", str(tmp_path / "s.csv"), "--json", "-", "--quiet"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)               # stdout holds the JSON alone
    assert [r["batch"] for r in rows] == [1, 2, 4]
    with (tmp_path / "s.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert tuple(table[0]) == COLUMNS and [int(r["flops"]) for r in table] == [
        r["flops"] for r in rows]
    page = (out / "sweep.html").read_text()
    assert page.count('<figure class="chart"') == 3          # FLOPs, peak, time: no plan
    assert "FLOPs vs batch" in page and "<title>" in page and 'class="tick"' in page
    assert "| batch |" in (out / "sweep.md").read_text()


def test_cli_exit_code_says_some_points_failed(tmp_path: Path) -> None:
    assert main(["sweep", MLP, str(tmp_path / "nope.py"), "--out", str(tmp_path / "o"),
                 "--quiet", "--no-pages"]) == 1


def test_bad_axis_is_refused_before_any_point_runs(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", MLP, "--device", "h100,nosuchgpu", "--out", str(tmp_path)]) == 2
    assert "nosuchgpu" in capsys.readouterr().err
    assert not (tmp_path / sweep.ROWS_FILE).exists()


def test_swept_axes_and_the_view() -> None:
    rows = [{"target": "m", "set": f"n_layer={n}", "batch": b, "status": "ok", "flops": n * b,
             "flops_of": "forward", "peak_bytes": 10} for n in (2, 4) for b in (1, 8)]
    axes = swept_axes(rows)
    assert axes == ["set:n_layer", "batch"]
    assert axis_value(rows[3], "set:n_layer") == "4"
    (table,) = sweep_view(rows, axes, axis_value).tables()
    assert [c.name for c in table.columns][:2] == ["n_layer", "batch"]
    page = render_sweep_html(rows, axes, axis_value)
    assert page.count('<figure class="chart"') == 2          # FLOPs and peak
    assert page.count("<polyline") == 2 * 2                  # one line per batch in each


@pytest.mark.slow
def test_two_workers_give_the_rows_of_one(tmp_path: Path) -> None:
    points = grid([MLP, GPT], batches=[1, 2])
    one = run_sweep(points, SweepSpec(), tmp_path / "a")
    two = run_sweep(points, SweepSpec(), tmp_path / "b", workers=2)
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in one]
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in two] == strip


@pytest.mark.slow
def test_a_local_ray_instance_runs_the_same_rows(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray", reason="Ray is the optional 'ray' extra")
    points = grid([MLP], batches=[1, 2])
    local = run_sweep(points, SweepSpec(), tmp_path / "a")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = run_sweep(points, SweepSpec(), tmp_path / "b", ray_address="auto")
    finally:
        ray.shutdown()
    assert [r["flops"] for r in on_ray] == [r["flops"] for r in local]


def _fake_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Points 'run' instantly (an ok row, no model); the list records runs and refusal notes
    in the order they happen."""
    import fxlens.cli.console as console

    events: list[str] = []
    real_note = console.note

    def run(point: Point, spec: SweepSpec) -> dict[str, Any]:
        events.append(f"run seq_len={point.seq_len}")
        return {**point.axes(), **dict.fromkeys(sweep.FIGURES), "status": "ok", "flops": 1,
                "flops_of": "forward", "peak_bytes": 1, "peak_of": "weights"}

    def note(text: object) -> None:
        events.append("note")
        real_note(text)

    monkeypatch.setattr(sweep, "run_point", run)
    monkeypatch.setattr(console, "note", note)
    return events


def test_points_past_the_context_length_are_refused_before_any_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    events = _fake_runs(monkeypatch)
    out = tmp_path / "out"
    code = main(["sweep", "hf:gpt2", "--seq-len", "512,2048,1024", "--batch", "1,2",
                 "--out", str(out), "--quiet"])
    assert code == 1                                        # some points did not run
    assert events[0] == "note" and events.count("note") == 1
    assert sorted(events[1:]) == ["run seq_len=1024"] * 2 + ["run seq_len=512"] * 2
    said = [line for line in capsys.readouterr().err.splitlines() if "refused 2 of 6" in line]
    assert len(said) == 1 and "seq_len 2048" in said[0] and "1024 (n_positions" in said[0]
    rows = sweep.read_rows(out / sweep.ROWS_FILE)
    refused = [r for r in rows if r["status"] == "refused"]
    assert [(r["batch"], r["seq_len"]) for r in refused] == [(1, 2048), (2, 2048)]
    assert "context length 1024" in refused[0]["error"]
    markdown = (out / "sweep.md").read_text()
    assert "refused \\[1\\]" in markdown and "--set n\\_positions=N" in markdown


def test_a_grid_with_no_valid_point_runs_nothing(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    events = _fake_runs(monkeypatch)
    code = main(["sweep", "hf:gpt2", "--seq-len", "4096,2048", "--out", str(tmp_path / "o"),
                 "--quiet"])
    assert code == 2 and events == []
    error = capsys.readouterr().err
    assert "seq_len 2048, 4096 past its context length 1024" in error
    assert not (tmp_path / "o").exists()


def test_the_context_limit_follows_the_points_overrides() -> None:
    points = grid(["hf:gpt2", MLP], {"n_positions": ["1024", "4096"]}, seq_lens=[2048])
    found = sweep.past_context(points)
    assert [(p.point.target, p.point.overrides, p.limit, p.key) for p in found] == [
        ("hf:gpt2", (("n_positions", "1024"),), 1024, "n_positions")]   # model files: unknown
