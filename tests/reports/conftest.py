"""Reports of small zoo models, built once per session for the renderer tests."""

from __future__ import annotations

import pytest

from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Finding, Findings, Quant, QuantLayer, QuantPlan
from fxlens.api import AnalysisOptions, analyze_loaded
from tests.models import evil_names, tiny_gpt


def analyzed(build: object, name: str, path: str) -> Report:
    module, inputs = build()  # type: ignore[operator]
    return analyze_loaded(LoadedModel(module, inputs, name, path), AnalysisOptions(strict=True))


@pytest.fixture(scope="session")
def full_report() -> Report:
    """tiny_gpt with every section: training with checkpointing and a device, KV cache,
    quantization, roofline, fusion and a plan."""
    module, inputs = tiny_gpt.build()
    options = AnalysisOptions(train=True, quant=True, kv_cache=True, device="h100",
                              device_memory="80GiB", checkpoint=True, plan=True, gpus=4)
    return analyze_loaded(LoadedModel(module, inputs, "tiny_gpt", "tiny_gpt.py"), options)


@pytest.fixture(scope="session")
def gpt_report() -> Report:
    return analyzed(tiny_gpt.build, "tiny_gpt", "tests/models/tiny_gpt.py")


@pytest.fixture(scope="session")
def evil_report() -> Report:
    report = analyzed(evil_names.build, "evil <b>model</b>", "tests/models/evil_names.py")
    # A finding and a quant row carrying markup too, in the sections' real types.
    finding = Finding(code="FUS001", nodes=(report.nodes[0].id,),
                      modules=(evil_names.SCRIPT_NAME,), saved_bytes=64, saved_s=1e-6,
                      message="<img src=x onerror=alert(2)>", fix="torch.compile")
    layer = QuantLayer(layer=evil_names.SCRIPT_NAME, type="torch.nn.Linear", params=64,
                       status="scored", reason=None, stats={},
                       weight_sqnr_db={"int8": 41.5}, data_free_sqnr_db={"int8": 41.5},
                       risks=(), risk_details={}, precision="int8")
    plan = QuantPlan(name="w8a8", activations="int8", weight_bytes=128, original_bytes=256,
                     compression_ratio=2.0, budget_bytes=None, fits=None,
                     predicted_output_sqnr_db=41.5, basis="data-free",
                     precision={evil_names.SCRIPT_NAME: "int8"})
    quant = Quant(status="scored", notes=(), formats=("int8",), score_format="int8",
                  calibration=None, layers=(layer,), risks=(), plan=plan)
    return report.with_(Findings((finding,)), quant)
