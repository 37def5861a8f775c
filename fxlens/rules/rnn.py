"""Cost rules for recurrent layers: whole-sequence LSTM/GRU/RNN ops, single cells, the fused
cell kernels and the CPU (oneDNN) per-layer kernel ``mkldnn_rnn_layer`` with its backward.

Legend: ``T, B`` time and batch; ``tokens = T·B`` (or the packed rows of a ``.data`` op);
``h`` hidden size; ``G`` gates per cell (LSTM 4, GRU 3, RNN 1); "stack" = one layer in one
direction. What each op is: ``export`` keeps ``aten.lstm.input``/``gru.input``/
``rnn_tanh.input`` whole; eager CPU dispatch runs LSTM as one ``mkldnn_rnn_layer`` per stack
(input already time-major whatever ``batch_first`` says) and decomposes GRU/RNN, and LSTM
with ``proj_size``, into ``addmm``/``mm`` plus pointwise ops, which other families cost.

GEMMs: every weight matrix of a stack is applied once per token, so a stack costs
``2·tokens·(numel(W_ih) + numel(W_hh) [+ numel(W_hr)])``, i.e. ``2·B·(in·G·h + h·G·h)`` per
time step, with the LSTM projection ``W_hr`` when ``proj_size`` is set. For the whole-sequence
ops this is ``2·tokens·Σ numel(2-D params)``: the flat ``params`` list carries each stack's
sizes, so bidirectional, deeper layers' ``2·h`` inputs and projections need no special case.

Elementwise FLOPs per hidden unit per token (``n_b`` bias vectors, 2 when ``has_biases``;
sigmoid ``SIGMOID_FLOPS`` = 7 and tanh ``TANH_FLOPS`` = 4 as everywhere, see
`fxlens.rules.conventions`; relu 1):
- LSTM: gate sums ``4·(1 + n_b)``; 3 sigmoids + tanh(g) + tanh(c); c' = f·c + i·g (3);
  h' = o·tanh(c') (1): ``8 + 4·n_b + 3·7 + 2·4`` = 37 + 4·n_b;
- GRU: biases ``3·n_b``; r, z sums (2); n = tanh(x_n + r·h_n) (2 + tanh); 2 sigmoids;
  h' = n + z·(h − n) (3): ``7 + 3·n_b + 2·7 + 4`` = 25 + 3·n_b;
- RNN: one sum, ``n_b`` biases, one tanh (4) or relu (1).
The fused cell kernels (``_thnn_fused_*_cell``) receive precomputed gate GEMMs and cost the
elementwise part only.

Backward (``mkldnn_rnn_layer_backward``): twice the forward GEMMs (grad of the input and of the
recurrent state, grad of both weights). NB: its elementwise work is taken as
``BACKWARD_ELEMENTWISE_FACTOR`` (2) × the forward's (a product rule term per multiply plus
the activation derivatives), an approximation.

Bytes: the default (each input read once, outputs written once) is a lower bound: it assumes
the weights stay in cache across time steps.
Known limitations: dropout between layers is not counted; ``_cudnn_rnn``/``miopen_rnn`` (GPU)
and the fused cells' backward kernels have no rule yet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fxlens.analyzer.core.costs import Cost, OpCall, RuleError, RuleFn, cost_rule, numel
from fxlens.analyzer.core.graph import TensorSpec
from fxlens.rules.conventions import FLOPS_PER_MAC, RELU_FLOPS, SIGMOID_FLOPS, TANH_FLOPS

aten = torch.ops.aten

BACKWARD_ELEMENTWISE_FACTOR = 2


@dataclass(frozen=True)
class CellKind:
    """Per-hidden-unit elementwise work of one recurrent cell step."""

    name: str
    gates: int
    arithmetic: int  # adds/muls other than biases and activations
    sigmoids: int = 0
    tanhs: int = 0
    relus: int = 0

    def unit_flops(self, n_biases: int) -> int:
        activations = self.sigmoids * SIGMOID_FLOPS + self.tanhs * TANH_FLOPS
        return self.arithmetic + self.gates * n_biases + activations + self.relus * RELU_FLOPS


LSTM = CellKind("lstm", gates=4, arithmetic=8, sigmoids=3, tanhs=2)
GRU = CellKind("gru", gates=3, arithmetic=7, sigmoids=2, tanhs=1)
RNN_TANH = CellKind("rnn_tanh", gates=1, arithmetic=1, tanhs=1)
RNN_RELU = CellKind("rnn_relu", gates=1, arithmetic=1, relus=1)
MKLDNN_MODES = {0: RNN_RELU, 1: RNN_TANH, 2: LSTM, 3: GRU}  # ideep::rnn_kind, as cuDNN


def _tokens(x: TensorSpec) -> int:
    """Time steps × batch (or packed rows): every dim but the feature dim."""
    return numel(x.shape[:-1])


def _stacked(call: OpCall, cell: CellKind) -> Cost:
    """A whole multi-layer (bi)directional sequence op with a flat `params` list."""
    x = call.tensor("input") if call.has("input") else call.tensor("data")
    params = call.tensors("params")
    matrices = sum(p.numel for p in params if len(p.shape) == 2)
    hidden = params[0].shape[0] // cell.gates
    stacks = call.arg("num_layers") * (2 if call.arg("bidirectional") else 1)
    units = stacks * hidden * cell.unit_flops(2 * bool(call.arg("has_biases")))
    return Cost(flops=_tokens(x) * (FLOPS_PER_MAC * matrices + units))


def _cell(call: OpCall, cell: CellKind) -> Cost:
    """One time step: input (B, in) or (in,), weights (G·h, in) and (G·h, h)."""
    w_ih, w_hh = call.tensor("w_ih"), call.tensor("w_hh")
    n_biases = call.has("b_ih") + call.has("b_hh")
    units = w_hh.shape[0] // cell.gates * cell.unit_flops(n_biases)
    gemm = FLOPS_PER_MAC * (w_ih.numel + w_hh.numel)
    return Cost(flops=_tokens(call.tensor("input")) * (gemm + units))


def _fused_cell(call: OpCall, cell: CellKind, state: str) -> Cost:
    """Elementwise part of a cell on precomputed gate GEMMs; one unit per `state` element."""
    n_biases = call.has("input_bias") + call.has("hidden_bias")
    return Cost(flops=call.tensor(state).numel * cell.unit_flops(n_biases))


def _rule(shape: Callable[..., Cost], cell: CellKind, **options: str) -> RuleFn:
    """The cost rule of one op: `shape` (`_stacked`, `_cell` or `_fused_cell`) of `cell`."""

    def rule(call: OpCall) -> Cost:
        return shape(call, cell, **options)

    rule.__qualname__ = f"{shape.__name__.lstrip('_')}({cell.name})"
    return rule


# Whole sequences, single cell steps, and the fused cells (whose `state` tensor holds one
# element per hidden unit).
RULES = {
    aten.lstm: _rule(_stacked, LSTM),
    aten.gru: _rule(_stacked, GRU),
    aten.rnn_tanh: _rule(_stacked, RNN_TANH),
    aten.rnn_relu: _rule(_stacked, RNN_RELU),
    aten.lstm_cell: _rule(_cell, LSTM),
    aten.gru_cell: _rule(_cell, GRU),
    aten.rnn_tanh_cell: _rule(_cell, RNN_TANH),
    aten.rnn_relu_cell: _rule(_cell, RNN_RELU),
    aten._thnn_fused_lstm_cell: _rule(_fused_cell, LSTM, state="cx"),
    aten._thnn_fused_gru_cell: _rule(_fused_cell, GRU, state="hx"),
}
for _op, _fn in RULES.items():
    cost_rule(_op)(_fn)


def _mkldnn_layer(call: OpCall, weights: tuple[str, str]) -> tuple[int, int]:
    """(GEMM FLOPs, elementwise FLOPs) of one oneDNN layer in one direction."""
    mode = int(call.arg("mode"))
    if mode not in MKLDNN_MODES:
        raise RuleError(f"{call.target}: unknown RNN mode {mode}")
    tokens = _tokens(call.tensor("input"))
    matrices = sum(call.tensor(w).numel for w in weights)
    n_biases = 2 * bool(call.arg("has_biases"))
    units = tokens * int(call.arg("hidden_size")) * MKLDNN_MODES[mode].unit_flops(n_biases)
    return FLOPS_PER_MAC * tokens * matrices, units


@cost_rule(aten.mkldnn_rnn_layer)
def mkldnn_rnn_layer(call: OpCall) -> Cost:
    """One stack of the CPU LSTM: weight0 = W_ih, weight1 = W_hh, weight2/3 the biases."""
    gemm, units = _mkldnn_layer(call, ("weight0", "weight1"))
    return Cost(flops=gemm + units)


@cost_rule(aten.mkldnn_rnn_layer_backward)
def mkldnn_rnn_layer_backward(call: OpCall) -> Cost:
    """Input/state grads and weight grads: 2× the forward GEMMs (weight1 = W_ih here)."""
    gemm, units = _mkldnn_layer(call, ("weight1", "weight2"))
    return Cost(flops=2 * gemm + BACKWARD_ELEMENTWISE_FACTOR * units)
