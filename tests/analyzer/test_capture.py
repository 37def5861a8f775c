"""Capture: the fallback chain, what each node keeps, decomposition until known."""

from __future__ import annotations

import importlib
import logging
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.core.costs import Cost, CostRegistry
from fxlens.analyzer.core.graph import NodeKind
from fxlens.analyzer.cost.engine import analyze
from fxlens.rules import load_rules
from tests.models import branchy, mlp


def flops(module: torch.nn.Module, inputs, methods=("export", "make_fx", "record")) -> int:  # type: ignore[no-untyped-def]
    registry = load_rules()
    return analyze(capture(module, inputs, registry, methods), registry, strict=True).totals.flops


def test_export_keeps_module_path_type_and_user_source_line() -> None:
    module, inputs = mlp.build()
    graph = capture(module, inputs, load_rules())
    assert graph.capture_method.startswith("torch.export")
    linear = next(n for n in graph.calls() if n.target == "aten.linear.default")
    assert linear.module == "fc1"
    assert linear.module_type == "torch.nn.modules.linear.Linear"
    assert linear.source.startswith("tests/models/mlp.py:")
    params = {p.name for p in graph.params}
    assert "fc1.weight" in params
    kinds = {n.target: n.kind for n in graph.nodes if n.kind is not NodeKind.CALL}
    assert kinds["fc1.weight"] is NodeKind.PARAM


def test_every_method_gives_the_same_flops() -> None:
    module, inputs = mlp.build()
    figures = {m: flops(module, inputs, (m,)) for m in ("export", "make_fx", "record")}
    assert len(set(figures.values())) == 1, figures


def test_data_dependent_model_falls_back_to_recording_and_says_so() -> None:
    module, inputs = branchy.build()
    graph = capture(module, inputs, load_rules())
    assert graph.capture_method.startswith("eager recording")
    assert any(note.startswith("export failed") for note in graph.notes)
    assert any(n.module for n in graph.calls())


class Noisy(torch.nn.Module):
    """Data-dependent (export fails and torch prints its partial graph) and warns; notes which
    stream `sys.stderr` is while it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.stderr_seen: list[object] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stderr_seen.append(sys.stderr)
        warnings.warn("noisy model", UserWarning, stacklevel=1)
        y = self.fc(x)
        return y if y.sum() > 0 else -y


def test_torch_chatter_goes_to_the_debug_log_without_swapping_stderr(
    capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    module = Noisy()
    stderr = sys.stderr
    with caplog.at_level(logging.DEBUG, logger="fxlens.analyzer.capture"), \
            warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        graph = capture(module, (torch.randn(2, 4),), load_rules())
    assert any(note.startswith("export failed") for note in graph.notes)
    assert capsys.readouterr().err == ""
    assert not [w for w in escaped if "noisy model" in str(w.message)]
    assert "torch.export printed during capture" in caplog.text and "noisy model" in caplog.text
    assert module.stderr_seen and all(seen is stderr for seen in module.stderr_seen)
    assert "print" not in vars(importlib.import_module("torch.export._trace"))


def test_symbolic_shapes_warnings_are_held_back_during_a_capture_step(
        caplog: pytest.LogCaptureFixture) -> None:
    """torch's symbolic-shapes logger has a handler of its own (our level on "torch" does not
    reach it): a data-dependent branch made it print "Unable to find user code corresponding
    to {u0}" on every run of such a model."""
    from fxlens.analyzer.capture.chatter import torch_chatter_to_debug_log

    shapes = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    shapes.addHandler(handler)
    try:
        # logged as an error here: other tests quiet "torch" and disable warnings process-wide,
        # and the record must be emitted to be held (holding does not look at the level)
        with caplog.at_level(logging.DEBUG, logger="fxlens.analyzer.capture.chatter"), \
                caplog.at_level(logging.DEBUG, logger=shapes.name), \
                torch_chatter_to_debug_log():
            shapes.error("Unable to find user code corresponding to {u0}")
    finally:
        shapes.removeHandler(handler)
    assert seen == []
    assert "held back; the first: torch.fx.experimental.symbolic_shapes" in caplog.text


class GroupedExperts(torch.nn.Module):
    """Float32 experts through ``torch._grouped_mm``, as transformers runs MoE on CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 16, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offs = torch.tensor([2, 4, 6, 8], dtype=torch.int32)
        return torch._grouped_mm(x, self.weight, offs=offs)


def test_float32_grouped_gemm_stays_on_fake_tensors_quietly(
    capfd: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    """torch's meta kernel takes only bfloat16 where the CPU kernel takes float32: our fake
    mode answers as the CPU kernel, so no link fails and torch logs nothing."""
    module, x = GroupedExperts(), torch.randn(8, 16)
    for method in ("make_fx", "record"):
        graph = capture(module, (x,), load_rules(), methods=(method,))
        assert "real tensors" not in graph.capture_method
        (node,) = [n for n in graph.calls() if n.target == "aten._grouped_mm.default"]
        assert node.outputs[0] is not None
        assert (node.outputs[0].shape, node.outputs[0].dtype) == ((8, 32), "float32")
    assert capfd.readouterr().err == ""
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_torch_log_records_during_capture_become_one_debug_line(
    capfd: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    from fxlens.analyzer.capture.chatter import torch_chatter_to_debug_log

    fake_tensor_log = logging.getLogger("torch._subclasses.fake_tensor")
    with caplog.at_level(logging.DEBUG, logger="fxlens.analyzer.capture"):
        with torch_chatter_to_debug_log():
            for _ in range(3):
                fake_tensor_log.error("failed while attempting to run meta for %s", "aten.op")
        fake_tensor_log.debug("after the step: not held back")
    assert capfd.readouterr().err == ""
    summary = [r.getMessage() for r in caplog.records if r.name.endswith("chatter")]
    assert summary == ["torch logged 3 message(s) during capture, held back; the first: "
                       "torch._subclasses.fake_tensor: failed while attempting to run meta "
                       "for aten.op"]
    assert not fake_tensor_log.filters


def test_nested_capture_steps_each_hold_their_own_records(
        caplog: pytest.LogCaptureFixture) -> None:
    """Two steps' sinks are equal lists while both are empty: the inner one leaving must take
    its own away, not the outer's, or the outer one's exit fails after a record came in."""
    from fxlens.analyzer.capture import chatter

    fake_tensor_log = logging.getLogger("torch._subclasses.fake_tensor")
    with caplog.at_level(logging.DEBUG, logger="fxlens.analyzer.capture"), \
            chatter.torch_chatter_to_debug_log():
        with chatter.torch_chatter_to_debug_log():
            pass
        fake_tensor_log.error("held by the outer step")
    assert chatter._holder.sinks == [] and not fake_tensor_log.filters
    assert "the first: torch._subclasses.fake_tensor: held by the outer step" in caplog.text


def test_unknown_ops_are_decomposed_until_known() -> None:
    registry = CostRegistry()
    registry.register(["aten.mm", "aten.addmm"], lambda call: Cost(flops=1))
    registry.declare_free(["aten.t", "aten.permute", "aten.view", "aten._unsafe_view"], "view")
    module = torch.nn.Linear(4, 3)
    graph = capture(module, (torch.randn(2, 4),), registry, ("export",))
    targets = {n.target for n in graph.calls()}
    assert "aten.linear.default" not in targets
    assert targets & {"aten.mm.default", "aten.addmm.default"}
    assert all(n.module == "" for n in graph.calls())


def test_linear_forms_cost_the_same() -> None:
    weight, bias = torch.randn(6, 5), torch.randn(6)
    x = torch.randn(3, 7, 5)

    class Module(torch.nn.Module):
        def forward(self, x):  # type: ignore[no-untyped-def]
            return F.linear(x, weight, bias)

    class Matmul(torch.nn.Module):
        def forward(self, x):  # type: ignore[no-untyped-def]
            return x @ weight.T + bias

    linear = torch.nn.Linear(5, 6)
    expected = 2 * 3 * 7 * 5 * 6
    assert flops(linear, (x,)) == flops(Module(), (x,)) == expected
    # x @ W.T + b: the same GEMM plus one add per output element (not folded into an epilogue).
    assert flops(Matmul(), (x,)) == expected + 3 * 7 * 6


def test_flops_linear_in_batch() -> None:
    module, _ = mlp.build()
    one = flops(module, (torch.randn(1, 32),))
    assert flops(module, (torch.randn(4, 32),)) == 4 * one


def test_meta_model_is_never_materialised() -> None:
    with torch.device("meta"):
        big = torch.nn.Sequential(torch.nn.Linear(20_000, 20_000), torch.nn.ReLU())
    x = torch.empty(2, 20_000, device="meta")
    report_flops = flops(big, (x,))
    assert report_flops >= 2 * 2 * 20_000 * 20_000


# Ops that must stay whole in export graphs, per supported torch version (design decision 4).
KEPT_WHOLE = {
    "2.13": {"aten.linear.default", "aten.scaled_dot_product_attention.default",
             "aten.layer_norm.default", "aten.gelu.default", "aten.embedding.default"},
}


def test_ops_with_cost_rules_stay_whole() -> None:
    from tests.models import tiny_gpt

    version = ".".join(torch.__version__.split(".")[:2])
    assert version in KEPT_WHOLE, f"torch {version} is not pinned: add its expected ops"
    module, inputs = tiny_gpt.build()
    targets = {n.target for n in capture(module, inputs, load_rules()).calls()}
    assert KEPT_WHOLE[version] <= targets


def test_only_real_small_integer_tensors_keep_their_values() -> None:
    """`known_value`: what a capture may keep on a graph input (a BlockMask's block table),
    copied; weights, data, fake and meta tensors and large tables are not."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxlens.analyzer.core.aten import KNOWN_VALUE_ELEMENTS, known_value

    table = torch.arange(12, dtype=torch.int32).view(3, 4)
    kept = known_value(table)
    assert kept is not None and torch.equal(kept, table)
    table[0, 0] = 99
    assert kept[0, 0] == 0                                  # a copy, not the user's tensor
    assert known_value(torch.ones(3, dtype=torch.bool)) is not None
    assert known_value(torch.randn(3)) is None               # floats: weights or data
    assert known_value(torch.zeros(3, dtype=torch.int64, device="meta")) is None
    assert known_value(torch.zeros(KNOWN_VALUE_ELEMENTS + 1, dtype=torch.int8)) is None
    with FakeTensorMode() as mode:
        assert known_value(mode.from_tensor(table)) is None
    assert known_value(torch.nn.Parameter(torch.ones(2), requires_grad=False)) is None
