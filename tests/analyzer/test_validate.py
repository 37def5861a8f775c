"""`analyze validate`'s engine (fxlens/analyzer/validate.py) on CPU: the captured graph run for
real node by node. Structure and sanity only — never speed, so nothing here is flaky on a
loaded machine."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.time.validate import (
    RunSettings,
    bind_inputs,
    error,
    flat_tensors,
    interpret,
    prepare,
)
from fxlens.devices import validate
from fxlens.rules import load_rules
from fxlens.rules.hardware import host_cpu
from tests.models import OWN_ZOO
from tests.models.hf_zoo import ZOO as HF_ZOO

FAST = RunSettings("cpu", warmup=1, repeat=2)
SMALL_HF = ("gpt2", "llama", "bert")


def _clock() -> Callable[[], float]:
    return lambda: 0.0


def _no_clock() -> Callable[[], Callable[[], float]]:
    return _clock


@functools.cache
def validated(name: str) -> dict[str, Any]:
    build = OWN_ZOO[name] if name in OWN_ZOO else HF_ZOO[name.removeprefix("hf-")]
    model, inputs = build()
    report = validate(LoadedModel(model, inputs, name, "zoo"), host_cpu(), FAST)
    return {"report": report, "validation": report.to_dict()["validation"]}


@pytest.mark.parametrize("name", [*OWN_ZOO, *(f"hf-{n}" for n in SMALL_HF)])
def test_every_node_is_timed_with_both_figures(name: str) -> None:
    result = validated(name)
    report, validation = result["report"], result["validation"]
    assert validation["timed_nodes"] == len(report.nodes)
    assert validation["made_up_inputs"] == []
    for node in validation["nodes"]:
        assert node["measured_s"] > 0 and node["predicted_s"] >= 0
    total = validation["total"]
    assert total["measured_s"] == pytest.approx(sum(n["measured_s"] for n in validation["nodes"]))
    assert total["predicted_s"] == pytest.approx(report.to_dict()["roofline"]["totals"]["time_s"])
    assert total["error"] == pytest.approx(error(total["predicted_s"], total["measured_s"]))
    assert total["pass_s"] > 0 and total["eager_s"] > 0
    root = next(m for m in validation["modules"] if m["path"] == "")
    assert root["calls"] == len(report.nodes)
    assert sum(c["calls"] for c in validation["op_classes"]) == len(report.nodes)
    assert validation["memory"]["measured_peak_bytes"] > 0


def test_the_interpreter_is_faithful_on_the_mlp() -> None:
    model, inputs = OWN_ZOO["mlp"]()
    graph = capture(model, inputs, load_rules())
    bound, made_up = bind_inputs(graph, model, inputs, torch.device("cpu"))
    with torch.no_grad():
        _, outputs = interpret(graph, bound, torch.device("cpu"), _no_clock)
        expected = list(flat_tensors(model(*inputs)))
    assert made_up == ()
    assert len(outputs) == len(expected) == 1
    torch.testing.assert_close(outputs[0], expected[0], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["tiny_gpt", "dict_io", "branchy"])
def test_the_interpreter_matches_eager_on_more_of_the_zoo(name: str) -> None:
    model, inputs = OWN_ZOO[name]()
    graph = capture(model, inputs, load_rules())
    bound, _ = bind_inputs(graph, model, inputs, torch.device("cpu"))
    with torch.no_grad():
        _, outputs = interpret(graph, bound, torch.device("cpu"), _no_clock)
        eager = model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    expected = list(flat_tensors(eager))
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected, strict=True):
        torch.testing.assert_close(got, want)


def test_a_meta_model_gets_random_weights() -> None:
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
    real, inputs = prepare(model, (torch.randn(2, 8),), "cpu")
    assert not any(p.is_meta for p in real.parameters())
    assert real(*inputs).shape == (2, 4)


def test_memory_prediction_is_close_on_the_mlp() -> None:
    memory = validated("mlp")["validation"]["memory"]
    assert memory["predicted_peak_bytes"] == memory["measured_peak_bytes"]


def test_relative_error() -> None:
    assert error(1.5, 1.0) == pytest.approx(0.5)
    assert error(0.5, 1.0) == pytest.approx(-0.5)
    assert error(1.0, 0.0) is None
