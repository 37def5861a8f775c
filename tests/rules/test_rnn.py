"""Recurrent rules: closed forms for cells and whole sequences, FlopCounterMode on the eager
decomposition (GEMMs only), and the CPU oneDNN per-layer kernels against the sequence op."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from fxlens.analyzer.core.aten import bind_args, resolve_op, spec_of
from fxlens.analyzer.core.costs import OpCall
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef, TensorSpec
from fxlens.rules import load_rules
from fxlens.rules.rnn import BACKWARD_ELEMENTWISE_FACTOR, SIGMOID_FLOPS, TANH_FLOPS
from tests.helpers import T, cost_of

SIG, TANH = SIGMOID_FLOPS, TANH_FLOPS
bsz, steps, n_in, h, proj = 3, 7, 5, 8, 4


def lstm_unit(n_biases: int) -> int:
    """Gate sums 4·(1 + n_b), 3 sigmoids, 2 tanh, c' = f·c + i·g (3), h' = o·tanh(c') (1)."""
    return 4 * (1 + n_biases) + 3 * SIG + 2 * TANH + 3 + 1


def gru_unit(n_biases: int) -> int:
    """Biases 3·n_b, r/z sums (2), r·h_n + x_n (2), 2 sigmoids, tanh, h' = n + z·(h − n) (3)."""
    return 3 * n_biases + 2 + 2 + 2 * SIG + TANH + 3


def rnn_unit(n_biases: int, activation: int) -> int:
    return 1 + n_biases + activation


CELL_CASES: list[tuple[str, tuple[Any, ...], int]] = [
    ("aten.lstm_cell.default",
     (T(bsz, n_in), [T(bsz, h), T(bsz, h)], T(4 * h, n_in), T(4 * h, h), T(4 * h), T(4 * h)),
     bsz * (2 * (n_in * 4 * h + h * 4 * h) + h * lstm_unit(2))),
    ("aten.lstm_cell.default",
     (T(bsz, n_in), [T(bsz, h), T(bsz, h)], T(4 * h, n_in), T(4 * h, h)),
     bsz * (2 * (n_in * 4 * h + h * 4 * h) + h * lstm_unit(0))),
    ("aten.lstm_cell.default",  # one bias vector
     (T(bsz, n_in), [T(bsz, h), T(bsz, h)], T(4 * h, n_in), T(4 * h, h), T(4 * h)),
     bsz * (2 * (n_in * 4 * h + h * 4 * h) + h * lstm_unit(1))),
    ("aten.gru_cell.default",
     (T(bsz, n_in), T(bsz, h), T(3 * h, n_in), T(3 * h, h), T(3 * h), T(3 * h)),
     bsz * (2 * (n_in * 3 * h + h * 3 * h) + h * gru_unit(2))),
    ("aten.rnn_tanh_cell.default",
     (T(bsz, n_in), T(bsz, h), T(h, n_in), T(h, h), T(h), T(h)),
     bsz * (2 * (n_in * h + h * h) + h * rnn_unit(2, TANH))),
    ("aten.rnn_relu_cell.default",
     (T(bsz, n_in), T(bsz, h), T(h, n_in), T(h, h)),
     bsz * (2 * (n_in * h + h * h) + h * rnn_unit(0, 1))),
    ("aten._thnn_fused_lstm_cell.default",  # GEMMs were done by the caller
     (T(bsz, 4 * h), T(bsz, 4 * h), T(bsz, h), T(4 * h), T(4 * h)), bsz * h * lstm_unit(2)),
]


@pytest.mark.parametrize(("target", "args", "expected"), CELL_CASES)
def test_cells(target: str, args: tuple, expected: int):
    cost = cost_of(target, *args)
    assert cost.flops == expected
    assert (cost.bytes_read, cost.bytes_written) == (None, None)


@pytest.mark.parametrize("biases", [0, 1, 2])
def test_fused_gru_cell(biases: int):
    """No meta kernel exists for this CUDA op, so the call is built by hand."""
    gates, state = T(bsz, 3 * h), T(bsz, h)
    args = [gates, gates, state, *[T(3 * h)] * biases]
    inputs = [Node(i, NodeKind.INPUT, f"x{i}", {}, (spec,)) for i, spec in enumerate(args)]
    op = resolve_op("aten._thnn_fused_gru_cell.default")
    bound = bind_args(op, [TensorRef(i) for i in range(len(args))], {})
    node = Node(len(inputs), NodeKind.CALL, "aten._thnn_fused_gru_cell.default", bound,
                (state, T(bsz, 5 * h)))
    call = OpCall(node, Graph((*inputs, node), "synthetic"))
    rule = load_rules().lookup(node)
    assert callable(rule)
    assert rule(call).flops == bsz * h * gru_unit(biases)


def flat_params(gates: int, layers: int, directions: int, bias: bool, p: int = 0) -> list:
    """The `params` list of a sequence op: per stack W_ih, W_hh, [b_ih, b_hh], [W_hr]."""
    out_h = p or h
    params: list[TensorSpec] = []
    for layer in range(layers):
        width = n_in if layer == 0 else directions * out_h
        for _ in range(directions):
            params += [T(gates * h, width), T(gates * h, out_h)]
            params += [T(gates * h), T(gates * h)] if bias else []
            params += [T(p, h)] if p else []
    return params


def stack_gemms(gates: int, layers: int, directions: int, p: int = 0) -> int:
    """Σ over stacks of the per-token MACs: in·G·h + h_out·G·h (+ h·p)."""
    out_h = p or h
    first = n_in * gates * h + out_h * gates * h + h * p
    deeper = directions * out_h * gates * h + out_h * gates * h + h * p
    return directions * (first + (layers - 1) * deeper)


SEQ = [
    # (target, gates, unit FLOPs, layers, bidirectional, batch_first, bias, proj)
    ("aten.lstm.input", 4, lstm_unit(2), 2, True, True, True, 0),
    ("aten.lstm.input", 4, lstm_unit(0), 1, False, False, False, 0),
    ("aten.lstm.input", 4, lstm_unit(2), 3, True, False, True, proj),
    ("aten.gru.input", 3, gru_unit(2), 2, True, True, True, 0),
    ("aten.rnn_tanh.input", 1, rnn_unit(2, TANH), 2, False, True, True, 0),
    ("aten.rnn_relu.input", 1, rnn_unit(2, 1), 1, True, False, True, 0),
]


@pytest.mark.parametrize(("target", "gates", "unit", "layers", "bidi", "batch_first", "bias", "p"),
                         SEQ)
def test_sequences(target: str, gates: int, unit: int, layers: int, bidi: bool,
                   batch_first: bool, bias: bool, p: int):
    dirs = 2 if bidi else 1
    x = T(bsz, steps, n_in) if batch_first else T(steps, bsz, n_in)
    state = T(layers * dirs, bsz, p or h)
    hx = [state, T(layers * dirs, bsz, h)] if gates == 4 else state
    params = flat_params(gates, layers, dirs, bias, p)
    cost = cost_of(target, x, hx, params, bias, layers, 0.0, False, bidi, batch_first)
    gemms, units = 2 * stack_gemms(gates, layers, dirs, p), layers * dirs * h * unit
    assert cost.flops == steps * bsz * (gemms + units)


def test_packed_sequence_counts_packed_rows():
    lengths = [7, 5, 2]
    # batch_sizes is a real CPU tensor even in a fake trace: packing reads it
    batch_sizes = torch.tensor([sum(n > t for n in lengths) for t in range(max(lengths))])
    data, params = T(sum(lengths), n_in), flat_params(3, 1, 1, True)
    cost = cost_of("aten.gru.data", data, batch_sizes, T(1, 3, h), params, True, 1, 0.0, False,
                   False)
    assert cost.flops == sum(lengths) * (2 * stack_gemms(3, 1, 1) + h * gru_unit(2))


def test_unbatched_sequence():
    cost = cost_of("aten.rnn_tanh.input", T(steps, n_in), T(1, h), flat_params(1, 1, 1, False),
                   False, 1, 0.0, False, False, False)
    assert cost.flops == steps * (2 * stack_gemms(1, 1, 1) + h * rnn_unit(0, TANH))


# ---- eager oracles ---------------------------------------------------------------------

def sequence_cost(module: torch.nn.RNNBase, x: torch.Tensor) -> int:
    """Our rule for the whole-sequence op that export keeps for `module` on `x`."""
    target = {"LSTM": "aten.lstm.input", "GRU": "aten.gru.input",
              "RNN_TANH": "aten.rnn_tanh.input", "RNN_RELU": "aten.rnn_relu.input"}[module.mode]
    dirs = 2 if module.bidirectional else 1
    rows = module.num_layers * dirs
    batch = x.shape[0 if module.batch_first else 1]
    state = T(rows, batch, module.proj_size or module.hidden_size)
    hx = [state, T(rows, batch, module.hidden_size)] if module.mode == "LSTM" else state
    params = [spec_of(w) for w in module._flat_weights]
    return cost_of(target, spec_of(x), hx, params, module.bias, module.num_layers, 0.0, False,
                   module.bidirectional, module.batch_first).flops


def elementwise(module: torch.nn.RNNBase, tokens: int) -> int:
    n_b = 2 if module.bias else 0
    unit = {"LSTM": lstm_unit(n_b), "GRU": gru_unit(n_b), "RNN_TANH": rnn_unit(n_b, TANH),
            "RNN_RELU": rnn_unit(n_b, 1)}[module.mode]
    dirs = 2 if module.bidirectional else 1
    return tokens * module.num_layers * dirs * module.hidden_size * unit


@st.composite
def rnns(draw: st.DrawFn) -> tuple[torch.nn.RNNBase, torch.Tensor]:
    kind = draw(st.sampled_from(["LSTM", "LSTM_PROJ", "GRU", "RNN_TANH", "RNN_RELU"]))
    kw = dict(input_size=draw(st.integers(1, 6)), hidden_size=draw(st.integers(2, 6)),
              num_layers=draw(st.integers(1, 3)), bias=draw(st.booleans()),
              batch_first=draw(st.booleans()), bidirectional=draw(st.booleans()))
    if kind == "LSTM_PROJ":
        proj_size = draw(st.integers(1, kw["hidden_size"] - 1))
        module: torch.nn.RNNBase = torch.nn.LSTM(proj_size=proj_size, **kw)
    elif kind.startswith("RNN"):
        module = torch.nn.RNN(nonlinearity=kind[4:].lower(), **kw)
    else:
        module = getattr(torch.nn, kind)(**kw)
    batch, steps = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    shape = (batch, steps) if module.batch_first else (steps, batch)
    return module, torch.randn(*shape, kw["input_size"])


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")  # mkldnn.flags noise
@settings(max_examples=25, deadline=None)
@given(case=rnns())
def test_gemms_match_flop_counter_on_the_eager_decomposition(
        case: tuple[torch.nn.RNNBase, torch.Tensor]):
    """With oneDNN off, eager CPU runs every RNN as addmm/mm per step: FlopCounterMode counts
    exactly our GEMM part (it counts the elementwise ops as 0)."""
    module, x = case
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False), \
            FlopCounterMode(display=False) as counter:
        module(x)
    tokens = x.shape[0] * x.shape[1]
    assert sequence_cost(module, x) == counter.get_total_flops() + elementwise(module, tokens)


class Recorder(TorchDispatchMode):
    """Records every aten call with its arguments as specs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[Any], dict[str, Any]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        def spec(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                return spec_of(v)
            return type(v)(spec(i) for i in v) if isinstance(v, (list, tuple)) else v

        self.calls.append((str(func), spec(list(args)), spec(kwargs or {})))
        return func(*args, **(kwargs or {}))

    def cost(self, target: str) -> int:
        return sum(cost_of(t, *a, **k).flops for t, a, k in self.calls if t == target)


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(bidirectional=st.booleans(), batch_first=st.booleans(), layers=st.integers(1, 3),
       bias=st.booleans())
def test_onednn_layers_add_up_to_the_sequence_op(bidirectional: bool, batch_first: bool,
                                                layers: int, bias: bool):
    """Eager CPU LSTM runs one mkldnn_rnn_layer per stack (forward) and one backward each."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN: the CPU LSTM does not use mkldnn_rnn_layer")
    module = torch.nn.LSTM(n_in, h, num_layers=layers, bias=bias, batch_first=batch_first,
                           bidirectional=bidirectional)
    x = torch.randn(bsz, steps, n_in) if batch_first else torch.randn(steps, bsz, n_in)
    recorder = Recorder()
    with recorder:
        module(x)[0].sum().backward()
    stacks = layers * (2 if bidirectional else 1)
    assert sum(t == "aten.mkldnn_rnn_layer.default" for t, _, _ in recorder.calls) == stacks
    forward = recorder.cost("aten.mkldnn_rnn_layer.default")
    assert forward == sequence_cost(module, x)
    units = elementwise(module, bsz * steps)
    assert recorder.cost("aten.mkldnn_rnn_layer_backward.default") == (
        2 * (forward - units) + BACKWARD_ELEMENTWISE_FACTOR * units)


@pytest.mark.filterwarnings("ignore:.*were assigned during export")  # torch's RNN internals
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")
@pytest.mark.parametrize(("module", "target"), [
    (torch.nn.LSTM(n_in, h, num_layers=2, batch_first=True, bidirectional=True), "aten.lstm.input"),
    (torch.nn.GRU(n_in, h, num_layers=2, batch_first=True, bidirectional=True), "aten.gru.input"),
    (torch.nn.RNN(n_in, h, num_layers=2, batch_first=True), "aten.rnn_tanh.input"),
])
def test_export_keeps_the_sequence_op_whole(module: torch.nn.RNNBase, target: str):
    """Pinned for torch 2.13: non-strict export (and its default decompositions) leaves one
    whole-sequence op, which has a rule here."""
    x = torch.randn(bsz, steps, n_in)
    program = torch.export.export(module.eval(), (x,), strict=False).run_decompositions({})
    ops = [str(n.target) for n in program.graph.nodes if str(n.target).startswith("aten.")]
    assert target in ops
    assert [op for op in ops if op != "aten.zeros.default"] == [target]
    assert load_rules().knows(target)
