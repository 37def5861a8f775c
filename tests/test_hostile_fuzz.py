"""Fuzzing ``analyze diff`` over report JSON (hypothesis): whatever a baseline holds — a value
of the wrong type, NaN, an integer of 400 digits, a missing key, text cut short, stray bytes —
the command ends with 0, 1 or 2, never a traceback (3), and a baseline that `load_report`
refuses always ends with 2, never 0 under ``--fail-on``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fxlens.analyzer.core.errors import ReportError
from fxlens.analyzer.core.report import load_report
from fxlens.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
GATES = "flops:+0,params:+0,bytes_read:+5%,peak_memory:+0"

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=10**29)
           | st.just(10**400) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=12) | st.sampled_from(["\x1b[2J", "[/]", "\u202e", "NaN"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=8)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("fuzz") / "base.json"
    assert main([str(ROOT / "tests/models/mlp.py"), "--quiet", "--no-pages", "--device", "h100",
                 "--json", str(path)]) == 0
    return path, json.loads(path.read_text())


def mutate(data: Any, draw: Any) -> Any:
    """`data` with one value somewhere replaced, deleted, or wrapped; or the root replaced."""
    data = copy.deepcopy(data)
    parent: Any = None
    key: Any = None
    node = data
    for _ in range(draw(st.integers(0, 6))):
        if isinstance(node, dict) and node:
            parent, key = node, draw(st.sampled_from(sorted(node)))
        elif isinstance(node, list) and node:
            parent, key = node, draw(st.integers(0, len(node) - 1))
        else:
            break
        node = parent[key]
    action = draw(st.sampled_from(["replace", "delete", "wrap", "negate"]))
    if parent is None:
        return draw(json_values) if action == "replace" else data
    if action == "delete" and isinstance(parent, dict):
        del parent[key]
    elif action == "wrap":
        parent[key] = [node]
    elif action == "negate" and isinstance(node, (int, float)) and not isinstance(node, bool):
        parent[key] = -node - 1
    else:
        parent[key] = draw(json_values)
    return data


def run_diff(old: Path, new: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["diff", str(old), str(new), "--fail-on", GATES, "--quiet"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    assert code in (0, 1, 2), f"exit {code}: {err}"
    return code, err


def refused(path: Path) -> bool:
    try:
        load_report(path)
    except ReportError:
        return True
    return False


@pytest.mark.slow
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(draw=st.data())
def test_a_mutated_baseline_never_crashes_nor_passes_when_refused(
        draw: Any, base: tuple[Path, dict[str, Any]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path, data = base
    mutated = mutate(data, draw.draw)
    bad = tmp_path / "baseline.json"
    bad.write_text(json.dumps(mutated, allow_nan=True))
    code, err = run_diff(bad, path, capsys)
    if refused(bad):
        assert code == 2, err
    code, err = run_diff(path, bad, capsys)     # the same report as the candidate side
    if refused(bad):
        assert code == 2, err


@pytest.mark.slow
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0, 1), junk=st.binary(max_size=8), at=st.floats(0, 1))
def test_a_damaged_baseline_file_is_exit_2(cut: float, junk: bytes, at: float,
                                           base: tuple[Path, dict[str, Any]], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = base
    raw = path.read_bytes()
    raw = raw[:int(len(raw) * cut)] if cut < 0.999 else raw
    where = int(len(raw) * at)
    bad = tmp_path / "baseline.json"
    bad.write_bytes(raw[:where] + junk + raw[where:])
    code, err = run_diff(bad, path, capsys)
    if refused(bad):
        assert code == 2, err
