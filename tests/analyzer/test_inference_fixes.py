"""An inference forward that does not fit its device: the smaller batch the verdict offers,
applied as printed, fits (issue 36); where nothing on one device fits, the verdict says why.

Devices are made to measure (a user devices file): a fraction of the forward's own need, so
each case lands in another regime (a smaller batch fits; the weights alone are over).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import InferenceFit
from fxlens.api import analyze_target
from fxlens.pipeline import AnalysisOptions
from fxlens.reports.views.headline import headline

GPT, MLP, CONV = "tests/models/tiny_gpt.py", "tests/models/mlp.py", "tests/models/convnet.py"
GPT2 = "hf:gpt2"

# (target, options, device memory as a fraction of what the forward needs)
CASES: list[tuple[str, dict[str, Any], float]] = [
    (GPT, {"sizes": {"batch": 8, "seq_len": 64}}, 0.7),
    (GPT, {"sizes": {"batch": 8, "seq_len": 64}, "kv_cache": True}, 0.6),
    (GPT, {"sizes": {"batch": 16, "seq_len": 32}, "kv_cache": True, "context": 256}, 0.8),
    (MLP, {"sizes": {"batch": 512}}, 0.9),
    (CONV, {"sizes": {"batch": 16}}, 0.8),
    (GPT2, {"overrides": {"n_layer": "2"}, "sizes": {"batch": 8, "seq_len": 128},
            "kv_cache": True}, 0.85),
    (GPT2, {"overrides": {"n_layer": "2"}, "sizes": {"batch": 4, "seq_len": 256}}, 0.95),
]


def _device(tmp_path: Path, memory_bytes: int) -> str:
    path = tmp_path / f"devices-{memory_bytes}.json"
    path.write_text(json.dumps({"devices": {"small": {
        "memory_bytes": memory_bytes, "bandwidth_bytes_per_s": 1e12,
        "peak_flops": {"fp32": 1e14, "bf16": 2e14}, "source": "test"}}}))
    return str(path)


def _fit(target: str, options: AnalysisOptions) -> tuple[Report, InferenceFit]:
    report = analyze_target(target, options)
    fit = report.get(InferenceFit)
    assert fit is not None
    return report, fit


def _verdict(report: Report) -> str:
    return next(f.detail for f in headline(report) if f.label.startswith("fits "))


def _on(tmp_path: Path, given: dict[str, Any], memory_bytes: int) -> AnalysisOptions:
    return AnalysisOptions(device="small", devices_file=_device(tmp_path, memory_bytes), **given)


@pytest.mark.slow
def test_every_suggested_batch_fits_when_applied(tmp_path: Path) -> None:
    offered = 0
    for target, given, fraction in CASES:
        _, whole = _fit(target, _on(tmp_path, given, 2**50))
        assert whole.fits
        options = _on(tmp_path, given, int(whole.needed_bytes * fraction))
        report, fit = _fit(target, options)
        assert not fit.fits, (target, given, fraction)
        assert fit.fixes, (target, given, fraction)
        offered += 1
        for fix in fit.fixes:
            assert fix.flags in _verdict(report)
            batch = int(fix.flags.removeprefix("--batch "))
            after = dataclasses.replace(options, sizes={**options.sizes, "batch": batch})
            _, applied = _fit(target, after)
            assert applied.fits, (target, given, fraction, fix)
            assert applied.needed_bytes <= fix.needed_bytes * 1.01, fix
    assert offered == len(CASES)


def test_weights_over_the_device_offer_no_batch(tmp_path: Path) -> None:
    given = {"sizes": {"batch": 4, "seq_len": 32}}
    _, whole = _fit(GPT, _on(tmp_path, given, 2**50))
    report, fit = _fit(GPT, _on(tmp_path, given, whole.weights_bytes // 2))
    assert not fit.fits and fit.weights_bytes >= fit.device_bytes and not fit.fixes
    verdict = _verdict(report)
    assert "the weights alone take" in verdict and "--batch" not in verdict


FIXED_BATCH = """
import torch

def build():
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 64)), (torch.randn(64, 64),)
"""


def test_a_model_built_at_one_batch_is_offered_no_batch(tmp_path: Path) -> None:
    """A model file whose factory takes no ``batch`` cannot be rebuilt at another: no
    ``--batch`` is offered, and the verdict says what is over."""
    model = tmp_path / "fixed.py"
    model.write_text(FIXED_BATCH)
    _, whole = _fit(str(model), _on(tmp_path, {}, 2**50))
    report, fit = _fit(str(model), _on(tmp_path, {}, whole.weights_bytes + 1))
    assert "batch" not in report.model.resizable
    assert not fit.fits and not fit.fixes and "--batch" not in _verdict(report)


@pytest.mark.slow
def test_decode_that_fits_is_told_apart_from_the_prefill(tmp_path: Path) -> None:
    given = {"sizes": {"batch": 8, "seq_len": 64}, "kv_cache": True}
    _, whole = _fit(GPT, _on(tmp_path, given, 2**50))
    assert whole.decode_bytes is not None and whole.decode_bytes < whole.needed_bytes
    report, fit = _fit(GPT, _on(tmp_path, given, whole.decode_bytes + 1))
    assert not fit.fits
    assert "prefilling the whole batch at once" in _verdict(report)
