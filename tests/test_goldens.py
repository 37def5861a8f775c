"""Whole-model outputs against golden files. Rewrite them with ``pytest --update-goldens``
after a deliberate change, and review the diff like code."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.report import Report
from fxlens.api import AnalysisOptions, analyze_loaded
from fxlens.reports.terminal import render_terminal
from tests.models import convnet, mlp

GOLDENS = Path(__file__).parent / "goldens"
MODELS = {"mlp": mlp.build, "convnet": convnet.build}


def report_of(name: str) -> Report:
    module, inputs = MODELS[name]()
    loaded = LoadedModel(module, inputs, name, f"tests/models/{name}.py")
    return analyze_loaded(loaded, AnalysisOptions(strict=True))


def check(path: Path, text: str, update: bool) -> None:
    if update:
        path.write_text(text)
    assert path.exists(), f"{path} missing: run pytest --update-goldens"
    assert text == path.read_text(), f"{path.name} changed; review and --update-goldens"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_json_report_matches_golden(name: str, update_goldens: bool) -> None:
    data = json.loads(report_of(name).to_json())
    data.pop("meta")  # versions of fxlens and torch, not the model's figures
    check(GOLDENS / f"{name}.json", json.dumps(data, indent=1, sort_keys=True) + "\n",
          update_goldens)


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_terminal_tables_match_golden(name: str, width: int, update_goldens: bool) -> None:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(render_terminal(report_of(name), depth=3, top=8, full=True))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width
    check(GOLDENS / f"{name}.{width}.txt", text, update_goldens)
