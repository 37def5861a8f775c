"""Reports of small zoo models, built once per session for the renderer tests."""

from __future__ import annotations

import dataclasses

import pytest

from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.report import Report
from fxlens.api import AnalysisOptions, analyze_loaded
from tests.models import evil_names, tiny_gpt


def analyzed(build: object, name: str, path: str) -> Report:
    module, inputs = build()  # type: ignore[operator]
    return analyze_loaded(LoadedModel(module, inputs, name, path), AnalysisOptions(strict=True))


@pytest.fixture(scope="session")
def gpt_report() -> Report:
    return analyzed(tiny_gpt.build, "tiny_gpt", "tests/models/tiny_gpt.py")


@pytest.fixture(scope="session")
def evil_report() -> Report:
    report = analyzed(evil_names.build, "evil <b>model</b>", "tests/models/evil_names.py")
    # A finding and a quant row carrying markup too, as later stages will write them.
    return dataclasses.replace(report, sections={
        **report.sections,
        "findings": [{"code": "FUS001", "nodes": [report.nodes[0].id],
                      "modules": [evil_names.SCRIPT_NAME], "saved_bytes": 64, "saved_s": 1e-6,
                      "message": "<img src=x onerror=alert(2)>", "fix": "torch.compile"}],
        "quant": {"layers": [{"name": evil_names.SCRIPT_NAME, "sqnr_db": {"int8": 41.5}}],
                  "plan": {"weights_bytes": 128}},
    })
