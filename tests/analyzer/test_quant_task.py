"""Quantization in the task's terms: the model file's ``evaluate(model)`` run on the model
quantized (`fxlens.analyzer.quant.task`), its verdicts on every surface."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.core.errors import LoadError
from fxlens.analyzer.quant.section import QuantSettings, quant_section
from fxlens.analyzer.quant.task import keeps
from fxlens.analyzer.quant.weights import find_layers, fold_batch_norms
from fxlens.api import AnalysisOptions, analyze_target
from fxlens.cli.args import percent
from fxlens.cli.main import main
from fxlens.reports.views.quant import quant_verdicts
from fxlens.rules import load_rules
from fxlens.rules.quant import knowledge
from fxlens.rules.task_metrics import lower_is_better
from tests.analyzer import ranking_models as rm

MODELS = Path(__file__).parent.parent / "models"

# The MLP of the zoo, scored by how many rows keep the class the full-precision model gives.
EVALUATE = """

_ROWS = torch.randn(256, 32, generator=torch.Generator().manual_seed(1))
_LABELS = None


def evaluate(model):
    global _LABELS
    model.eval()
    out = model(_ROWS)
    if _LABELS is None:
        _LABELS = out.argmax(-1)
    return {"accuracy": (out.argmax(-1) == _LABELS).float().mean(), "val_loss": 0.5}
"""


@pytest.mark.parametrize(("name", "lower"), [
    ("accuracy", False), ("top1", False), ("bleu", False), ("val_loss", True),
    ("perplexity", True), ("WER", True), ("top1-error", True), ("lossless_ratio", False),
])
def test_which_way_a_metric_improves(name: str, lower: bool) -> None:
    assert lower_is_better(name) is lower


def test_a_run_keeps_the_task_within_the_tolerance_in_the_worse_direction() -> None:
    original = {"accuracy": 0.90, "loss": 0.50}
    assert keeps(original, {"accuracy": 0.8911, "loss": 0.5049}, ("loss",), 0.01)
    assert not keeps(original, {"accuracy": 0.8909, "loss": 0.50}, ("loss",), 0.01)
    assert not keeps(original, {"accuracy": 0.90, "loss": 0.5051}, ("loss",), 0.01)
    assert keeps(original, {"accuracy": 0.99, "loss": 0.1}, ("loss",), 0.0)   # better is fine
    assert not keeps(original, {"accuracy": 0.90}, ("loss",), 0.01)           # a metric lost


def _accuracy_after_a_training_forward(case: rm.Case, m: torch.nn.Module) -> float:
    """A careless evaluate(): one forward in training mode (BatchNorm running statistics
    move), then the accuracy in eval mode."""
    with torch.no_grad():
        m.train()
        m(*case.held_out)
        m.eval()
        return (m(*case.held_out).argmax(-1) == case.target).float().mean().item()


@pytest.mark.slow
def test_evaluate_sees_the_model_quantized_and_the_model_is_left_as_it_was() -> None:
    case = rm.bn_cnn(0)
    model = case.model.eval()
    before = copy.deepcopy(model.state_dict())
    seen: list[dict[str, torch.Tensor]] = []

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        seen.append({k: v.clone() for k, v in m.state_dict().items()})
        return {"accuracy": _accuracy_after_a_training_forward(case, m)}

    rules = knowledge()
    graph = capture(model, case.example, load_rules())
    section = quant_section(model, graph, rules, QuantSettings(evaluate=evaluate))
    assert section.task is not None
    runs = {run.weights: run for run in section.task.runs}
    assert set(runs) == set(rules.formats)
    # The oracle: a copy of the model with every layer's weight replaced by its quantized
    # value (BatchNorms folded in and out again, as `Layer.quantize` defines), evaluated from
    # the original running statistics as each run is.
    for fmt_name, fmt in rules.formats.items():
        oracle = copy.deepcopy(model)
        oracle.load_state_dict(before)
        for layer in fold_batch_norms(oracle, graph, find_layers(oracle, rules), rules):
            layer.weight.data = layer.quantize(fmt)
        expected = _accuracy_after_a_training_forward(case, oracle)
        assert runs[fmt_name].values["accuracy"] == pytest.approx(expected, abs=1e-9)
    assert len(seen) == 1 + len(rules.formats)
    assert all(torch.equal(seen[0][k], v) for k, v in before.items())
    assert any(not torch.equal(seen[0][k], seen[3][k]) for k in seen[0])   # int4 changed some
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(m.training for m in model.modules())


def test_the_verdict_is_in_the_tasks_terms_on_every_surface(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    path = tmp_path / "evaluated_mlp.py"
    path.write_text((MODELS / "mlp.py").read_text() + EVALUATE)
    assert main([str(path), "--quant", "--quant-plan", "w8a8", "--quant-tolerance", "0.5",
                 "--out", str(tmp_path / "out"), "--md", str(tmp_path / "out" / "report.md")]
                ) == 0
    terminal = capsys.readouterr().out
    task = json.loads((tmp_path / "out" / "report.json").read_text())["quant"]["task"]
    assert task["original"] == {"accuracy": 1.0, "val_loss": 0.5}
    assert task["lower_is_better"] == ["val_loss"] and task["tolerance"] == 0.005
    weights = [run["weights"] for run in task["runs"]]
    assert weights[-1] == "plan w8a8" and "int4_g128" in weights
    for run in task["runs"]:
        accuracy = run["values"]["accuracy"]
        assert 0 <= accuracy <= 1
        assert run["keeps"] == (accuracy >= 0.995)
    markdown = (tmp_path / "out" / "report.md").read_text()
    html = (tmp_path / "out" / "report.html").read_text()
    for surface in (terminal, markdown, html):
        assert "quantization in the task" in surface
        assert "accuracy 1.000 →" in surface
    for surface in (markdown.replace("\\_", "_"), html):
        assert "int4_g128 weights on every layer" in surface


@pytest.mark.slow
def test_the_first_screen_leads_with_the_task_where_layers_disagree() -> None:
    """The GRU keeps its accuracy at int4 everywhere though some layers score "keep higher":
    the verdict says the task's answer, the per-layer scores after it."""
    case = rm.gru(0)

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        with torch.no_grad():
            right = m(*case.held_out).argmax(-1) == case.target
        return {"accuracy": right.float().mean().item()}

    graph = capture(case.model, case.example, load_rules())
    section = quant_section(case.model, graph, knowledge(), QuantSettings(
        example_inputs=case.example, evaluate=evaluate))
    figure = quant_verdicts(section)[0]
    int4 = next(run for run in section.task.runs if run.weights.startswith("int4"))
    assert figure.label == f"{int4.weights} weights on every layer"
    assert ("keeps the task" in figure.detail) is int4.keeps
    assert "per-layer scores:" in figure.detail and "layers ok" in figure.detail


@pytest.mark.parametrize(("body", "said"), [
    ("    return 0.97", "returned float; return {\"accuracy\": 0.973}"),
    ("    return {'accuracy': float('nan')}", "'accuracy': nan is not a finite number"),
    ("    return {}", "returned dict"),
    ("    raise RuntimeError('no data')", "evaluate(model) raised at"),
])
def test_an_evaluate_that_cannot_be_read_is_one_line(tmp_path: Path, body: str,
                                                     said: str) -> None:
    path = tmp_path / "bad_evaluate.py"
    path.write_text((MODELS / "mlp.py").read_text() + f"\n\ndef evaluate(model):\n{body}\n")
    with pytest.raises(LoadError, match=None) as raised:
        analyze_target(str(path), AnalysisOptions(quant=True))
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_meta_weights_say_why_evaluate_did_not_run(tmp_path: Path) -> None:
    path = tmp_path / "meta_mlp.py"
    path.write_text((MODELS / "mlp.py").read_text().replace(
        "model = MLP(d_in, d_hidden, d_out).eval()",
        "model = MLP(d_in, d_hidden, d_out).to('meta').eval()").replace(
        "x = torch.randn(batch, d_in)", "x = torch.randn(batch, d_in, device='meta')")
        + "\n\ndef evaluate(model):\n    raise AssertionError('never called')\n")
    quant = analyze_target(str(path), AnalysisOptions(quant=True)).to_dict()["quant"]
    assert quant.get("task") is None
    assert any("evaluate(model) not run: the weights are on the meta device" in note
               for note in quant["notes"])


@pytest.mark.parametrize(("text", "fraction"), [("1", 0.01), ("0.5%", 0.005), ("0", 0.0)])
def test_tolerance_in_percent(text: str, fraction: float) -> None:
    assert percent(text) == pytest.approx(fraction)


@pytest.mark.parametrize("text", ["-1", "101", "lots"])
def test_tolerance_out_of_range_is_refused(text: str) -> None:
    with pytest.raises(Exception, match="percentage"):
        percent(text)
