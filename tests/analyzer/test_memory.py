"""Liveness on synthetic graphs, every expected number derived by hand in the test.

Specs are fp32 unless stated, so a (4, 8) tensor is 4 · 8 · 4 = 128 bytes. Each graph is
built node by node; `timeline[i]` is the live bytes right after call ``i``'s allocation.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fxlens.analyzer.core.codec import encode
from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef, TensorSpec
from fxlens.analyzer.memory.liveness import Lifetimes, liveness
from fxlens.rules import load_rules
from tests.helpers import T

F32 = 4
X = 4 * 8 * F32  # bytes of a (4, 8) fp32 tensor: 128


class Build:
    """Appends nodes with consecutive ids; `call` returns the refs of the node's outputs."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def leaf(self, spec: TensorSpec, kind: NodeKind = NodeKind.INPUT, name: str = "x") -> TensorRef:
        self.nodes.append(Node(len(self.nodes), kind, name, {}, (spec,)))
        return TensorRef(len(self.nodes) - 1)

    def call(self, target: str, args: dict[str, Any], *outputs: TensorSpec, module: str = "",
             source: str = "", phase: str = "forward") -> TensorRef:
        self.nodes.append(Node(len(self.nodes), NodeKind.CALL, target, args, outputs,
                               module=module, source=source, phase=phase))
        return TensorRef(len(self.nodes) - 1)

    def graph(self, outputs: tuple[TensorRef, ...] = (), **kw: Any) -> Graph:
        return Graph(tuple(self.nodes), "synthetic", outputs=outputs, **kw)


def profile(graph: Graph, lifetimes: Lifetimes = Lifetimes.GRAPH,
            registry: CostRegistry | None = None) -> Any:
    return liveness(graph, registry if registry is not None else load_rules(), lifetimes)


def test_views_and_in_place_ops_share_their_base_storage() -> None:
    b = Build()
    x = b.leaf(T(4, 8))
    w = b.leaf(T(8, 16), NodeKind.PARAM, "w")
    b.leaf(T(16), NodeKind.BUFFER, "running_mean")
    a = b.call("aten.mm.default", {"self": x, "mat2": w}, T(4, 16))          # node 3: 256 B
    v = b.call("aten.view.default", {"self": a, "size": [64]}, T(64))        # node 4: alias
    r = b.call("aten.relu.default", {"self": v}, T(64))                      # node 5: 256 B
    r2 = b.call("aten.add_.Tensor", {"self": r, "other": r}, T(64))          # node 6: alias
    s = b.call("aten.sum.default", {"self": r2}, T())                        # node 7: 4 B
    p = profile(b.graph(outputs=(s,)))
    mm, relu, total = 4 * 16 * F32, 64 * F32, F32
    assert p.timeline == (mm, mm, mm + relu, relu, relu + total)
    assert p.peak_activation_bytes == mm + relu
    assert p.peak_node == 5
    assert [(t.node, t.bytes) for t in p.live_at_peak] == [(3, mm), (5, relu)]
    assert (p.param_bytes, p.buffer_bytes, p.input_bytes) == (8 * 16 * F32, 16 * F32, X)


def test_a_tied_weight_is_one_storage_under_both_its_names() -> None:
    """GPT-2's lm_head.weight is transformer.wte.weight: torch.export gives each name a graph
    input, and counting both overstated the weights by a vocabulary × width matrix."""
    b = Build()
    x = b.leaf(T(4, 8))
    emb = b.leaf(T(16, 8), NodeKind.PARAM, "wte.weight")
    head = b.leaf(T(16, 8), NodeKind.PARAM, "lm_head.weight")
    b.call("aten.mm.default", {"self": x, "mat2": head}, T(4, 16))
    b.call("aten.mm.default", {"self": x, "mat2": emb}, T(4, 16))
    tied = profile(b.graph(tied={"lm_head.weight": "wte.weight"}))
    untied = profile(b.graph())
    assert tied.param_bytes == 16 * 8 * F32
    assert untied.param_bytes == 2 * 16 * 8 * F32


def test_a_tied_hf_model_counts_its_weights_once() -> None:
    from fxlens.analyzer.capture.hf import load_preset
    from fxlens.analyzer.core.sections import Memory
    from fxlens.api import AnalysisOptions, analyze_loaded

    loaded = load_preset("gpt2", {"n_layer": "1", "n_embd": "32", "n_head": "2",
                                  "vocab_size": "512"}, 1, 8)
    memory = analyze_loaded(loaded, AnalysisOptions(fusion=False)).require(Memory)
    unique = sum(p.numel() * p.element_size() for p in loaded.module.parameters())
    assert memory.param_bytes == unique


def test_graph_outputs_live_to_the_end() -> None:
    b = Build()
    x = b.leaf(T(4, 8))
    a = b.call("aten.relu.default", {"self": x}, T(4, 8))
    c = b.call("aten.neg.default", {"self": a}, T(4, 8))
    d = b.call("aten.exp.default", {"self": c}, T(4, 8))
    freed = profile(b.graph(outputs=(d,)))
    kept = profile(b.graph(outputs=(d, a)))
    assert freed.timeline == (X, 2 * X, 2 * X)
    assert kept.timeline == (X, 2 * X, 3 * X)     # a stays live after its last reader
    assert kept.peak_node == 3


def test_unread_outputs_live_only_through_their_node() -> None:
    b = Build()
    x = b.leaf(T(4, 8))
    out = b.call("aten.native_layer_norm.default",
                 {"input": x, "normalized_shape": [8], "weight": None, "bias": None, "eps": 1e-5},
                 T(4, 8), T(4, 1), T(4, 1))                     # mean and rstd never read
    y = b.call("aten.relu.default", {"self": out}, T(4, 8))
    p = profile(b.graph(outputs=(y,)))
    stats = 2 * 4 * F32
    assert p.timeline == (X + stats, 2 * X)


def test_reshape_is_a_view_only_when_the_strides_allow_it() -> None:
    transposed = TensorSpec((8, 4), "float32", (1, 8))
    b = Build()
    x = b.leaf(T(4, 8))
    a = b.call("aten.relu.default", {"self": x}, T(4, 8))
    t = b.call("aten.t.default", {"self": a}, transposed)                    # alias
    viewed = b.call("aten.reshape.default", {"self": a, "shape": [32]}, T(32))   # a view
    copied = b.call("aten.reshape.default", {"self": t, "shape": [32]}, T(32))   # a copy
    out = b.call("aten.add.Tensor", {"self": viewed, "other": copied}, T(32))
    p = profile(b.graph(outputs=(out,)))
    assert p.timeline == (X, X, X, 2 * X, 3 * X)   # a (read as `viewed`) lives until the add


@pytest.mark.parametrize("target, args, out, aliases", [
    ("aten.to.dtype", {"dtype": "float32"}, T(4, 8), True),
    ("aten.to.dtype", {"dtype": "float16"}, T(4, 8, dtype="float16"), False),
    ("aten.contiguous.default", {}, T(4, 8), True),
    ("aten.dropout.default", {"p": 0.1, "train": False}, T(4, 8), True),
    ("aten.dropout.default", {"p": 0.1, "train": True}, T(4, 8), False),
    ("aten.type_as.default", {}, T(4, 8), True),
])
def test_alias_checks_decide_sometimes_views(
    target: str, args: dict[str, Any], out: TensorSpec, aliases: bool
) -> None:
    b = Build()
    x = b.leaf(T(4, 8))
    a = b.call("aten.relu.default", {"self": x}, T(4, 8))
    first = "input" if "dropout" in target else "self"
    extra = {"other": a} if "type_as" in target else {}
    b.call(target, {first: a, **args, **extra}, out)
    p = profile(b.graph())
    assert p.timeline[1] == X + (0 if aliases else out.allocation_bytes)


def test_contiguous_of_a_transposed_tensor_is_a_copy() -> None:
    b = Build()
    x = b.leaf(T(4, 8))
    a = b.call("aten.relu.default", {"self": x}, T(4, 8))
    t = b.call("aten.t.default", {"self": a}, TensorSpec((8, 4), "float32", (1, 8)))
    b.call("aten.contiguous.default", {"self": t}, T(8, 4))
    assert profile(b.graph()).timeline == (X, X, 2 * X)


def test_split_views_keep_their_base_alive_until_the_last_one_is_read() -> None:
    half = TensorSpec((4, 4), "float32", (8, 1))
    b = Build()
    x = b.leaf(T(4, 8))
    a = b.call("aten.relu.default", {"self": x}, T(4, 8))                     # node 1
    b.call("aten.split.Tensor", {"self": a, "split_size": 4, "dim": 1}, half, half)   # node 2
    left = b.call("aten.neg.default", {"self": TensorRef(2, 0)}, T(4, 4))     # node 3: 64 B
    b.call("aten.exp.default", {"self": left}, T(4, 4))                       # node 4: 64 B
    right = b.call("aten.neg.default", {"self": TensorRef(2, 1)}, T(4, 4))    # node 5
    p = profile(b.graph(outputs=(right,)))
    small = 4 * 4 * F32
    # node 4 frees `left` and its unread exp; the second view keeps a until node 5.
    assert p.timeline == (X, X, X + small, X + 2 * small, X + small)


def test_out_variants_write_into_their_out_argument() -> None:
    b = Build()
    x = b.leaf(T(4, 8))
    e = b.call("aten.empty.memory_format", {"size": [4, 8]}, T(4, 8))
    s = b.call("aten.add.out", {"self": x, "other": x, "out": e}, T(4, 8))
    r = b.call("aten.relu.default", {"self": s}, T(4, 8))
    assert profile(b.graph(outputs=(r,))).timeline == (X, X, 2 * X)


def test_ops_without_a_schema_allocate_fresh_outputs() -> None:
    b = Build()
    x = b.leaf(T(4, 8))
    h = b.call("higher_order.my_op", {"arg0": x}, T(4, 8))
    assert profile(b.graph(outputs=(h,))).timeline == (X,)


def test_a_failing_alias_check_falls_back_to_the_schema() -> None:
    registry = CostRegistry()

    def broken(call: Any) -> bool:
        raise RuntimeError("boom")

    registry.register_alias(["aten.reshape"], broken)
    b = Build()
    x = b.leaf(T(4, 8))
    a = b.call("aten.relu.default", {"self": x}, T(4, 8))
    b.call("aten.reshape.default", {"self": a, "shape": [32]}, T(32))
    assert profile(b.graph(), registry=registry).timeline == (X, X)   # schema: Tensor(a)


def test_roles_count_gradients_and_optimizer_state_to_the_end() -> None:
    b = Build()
    w = b.leaf(T(4, 8), NodeKind.PARAM, "w")
    m = b.leaf(T(4, 8), NodeKind.INPUT, "exp_avg")          # state from earlier steps
    g = b.call("aten.neg.default", {"self": w}, T(4, 8), phase="backward")       # node 2
    t = b.call("aten.mul.Tensor", {"self": g, "other": g}, T(4, 8), phase="optimizer")
    m2 = b.call("aten.add_.Tensor", {"self": m, "other": t}, T(4, 8), phase="optimizer")
    roles = {g: "gradient", m2: "optimizer_state"}
    p = profile(b.graph(roles=roles))
    # exp_avg (an input) counts as optimizer state from the start; the grad lives to the end.
    assert p.timeline == (2 * X, 3 * X, 3 * X)
    assert p.input_bytes == 0
    assert p.peak_by_category == {"gradient": X, "optimizer_state": X, "activation": X}
    assert p.at_peak_by_category == {"gradient": X, "optimizer_state": X, "activation": X}
    assert p.peak_by_phase == {"backward": 2 * X, "optimizer": 3 * X}


def test_live_at_peak_is_largest_first_with_producing_module() -> None:
    b = Build()
    x = b.leaf(T(4, 8))
    small = b.call("aten.sum.dim_IntList", {"self": x, "dim": [1]}, T(4), module="a")
    big = b.call("aten.relu.default", {"self": x}, T(4, 8), module="b")
    out = b.call("aten.mul.Tensor", {"self": big, "other": small}, T(4, 8), module="b")
    p = profile(b.graph(outputs=(out,)))
    assert p.peak_node == 3 and p.peak_module == "b"
    assert [(t.node, t.module, t.bytes) for t in p.live_at_peak] == [
        (2, "b", X), (3, "b", X), (1, "a", 4 * F32)]
    assert p.live_at_peak_by_module == {"a": 16, "b": 2 * X}
    assert p.allocated_by_module == {"a": 16, "b": 2 * X}


def _two_statements(module_type: str) -> Graph:
    """r = relu(x) on line 1; line 2 calls module `lin` on r, then exp; line 3 adds."""
    b = Build()
    x = b.leaf(T(4, 8))
    r = b.call("aten.relu.default", {"self": x}, T(4, 8), source="f.py:1")
    t = b.call("aten.neg.default", {"self": r}, T(4, 8), module="lin", source="f.py:2")
    u = b.call("aten.exp.default", {"self": t}, T(4, 8), source="f.py:2")
    out = b.call("aten.add.Tensor", {"self": u, "other": x}, T(4, 8), source="f.py:3")
    return b.graph(outputs=(out,), module_types={"": "m.Top", "lin": module_type})


def test_eager_named_values_live_through_the_statement_that_reads_them() -> None:
    graph = _two_statements("torch.nn.modules.linear.Linear")   # its ops are the caller's line
    assert profile(graph, Lifetimes.GRAPH).timeline == (X, 2 * X, 2 * X, 2 * X)
    # r was bound to a name: it lives until line 2 completes, through the exp.
    assert profile(graph, Lifetimes.EAGER).timeline == (X, 2 * X, 3 * X, 2 * X)


def test_eager_arguments_live_until_the_call_returns() -> None:
    graph = _two_statements("m.UserModule")       # `lin` runs its own code: r is an argument
    assert profile(graph, Lifetimes.EAGER).timeline == (X, 2 * X, 2 * X, 2 * X)
    b = Build()
    x = b.leaf(T(4, 8))
    r = b.call("aten.relu.default", {"self": x}, T(4, 8))
    a = b.call("aten.neg.default", {"self": r}, T(4, 8), module="layers.0")
    c = b.call("aten.exp.default", {"self": a}, T(4, 8), module="layers.0")
    d = b.call("aten.exp.default", {"self": c}, T(4, 8), module="layers.1")
    e = b.call("aten.exp.default", {"self": d}, T(4, 8), module="layers.1")
    types = {"": "m.Top", "layers": "torch.nn.modules.container.ModuleList",
             "layers.0": "m.Block", "layers.1": "m.Block"}
    graph = b.graph(outputs=(e,), module_types=types)
    assert profile(graph, Lifetimes.GRAPH).timeline == (X, 2 * X, 2 * X, 2 * X, 2 * X)
    # r is held until layers.0 returns; c, the argument of layers.1, until layers.1 returns.
    assert profile(graph, Lifetimes.EAGER).timeline == (X, 2 * X, 3 * X, 2 * X, 3 * X)


def test_section_has_the_report_contract_and_is_json() -> None:
    b = Build()
    x = b.leaf(T(4, 8))
    r = b.call("aten.relu.default", {"self": x}, T(4, 8))
    section = encode(profile(b.graph(outputs=(r,))).to_section())
    for key in ("param_bytes", "buffer_bytes", "peak_activation_bytes", "peak_node",
                "timeline", "peak_module", "live_at_peak", "input_bytes"):
        assert key in section
    assert json.loads(json.dumps(section))["timeline"] == [X]


def test_no_call_nodes_gives_an_empty_profile() -> None:
    b = Build()
    b.leaf(T(4, 8))
    p = profile(b.graph())
    assert (p.peak_activation_bytes, p.peak_node, p.timeline, p.live_at_peak) == (0, None, (), ())


def _layers(count: int) -> Graph:
    """A transformer-like stream: per layer 10 ops in 3 modules, views, reshapes, lines."""
    b = Build()
    h = b.leaf(T(8, 64))
    types = {"": "m.Top", "layers": "torch.nn.modules.container.ModuleList"}
    for i in range(count):
        layer = f"layers.{i}"
        types.update({layer: "m.Layer", f"{layer}.mlp": "m.MLP"})
        a = b.call("aten.relu.default", {"self": h}, T(8, 64), module=layer, source="l.py:1")
        v = b.call("aten.view.default", {"self": a, "size": [512]}, T(512), module=layer,
                   source="l.py:2")
        r = b.call("aten.reshape.default", {"self": v, "shape": [8, 64]}, T(8, 64),
                   module=layer, source="l.py:2")
        m = r
        for j in range(5):
            m = b.call("aten.exp.default", {"self": m}, T(8, 64), module=f"{layer}.mlp",
                       source=f"mlp.py:{j}")
        s = b.call("aten.add.Tensor", {"self": m, "other": h}, T(8, 64), module=layer,
                   source="l.py:3")
        h = b.call("aten.mul.Tensor", {"self": s, "other": a}, T(8, 64), module=layer,
                   source="l.py:4")
    return b.graph(outputs=(h,), module_types=types)


@pytest.mark.slow
def test_a_ten_thousand_node_graph_has_a_full_timeline() -> None:
    """Its speed is measured in bench/liveness.py, not here (no timed tests)."""
    graph = _layers(1000)            # 10 000 call nodes
    p = liveness(graph, load_rules(), Lifetimes.EAGER)
    assert len(p.timeline) == 10_000


@pytest.mark.parametrize(("spec", "allocation", "storage"), [
    (TensorSpec((4, 8), "float32", (8, 1)), 4 * 8 * 4, 4 * 8 * 4),          # contiguous
    (TensorSpec((4, 8), "float32"), 4 * 8 * 4, 4 * 8 * 4),                  # no strides known
    (TensorSpec((4, 8), "float32", (16, 1)), (3 * 16 + 8) * 4, 4 * 8 * 4),  # padded rows: gaps
    (TensorSpec((4, 8), "float32", (0, 1)), 8 * 4, 8 * 4),                  # expanded (stride 0)
    (TensorSpec((0, 8), "float32", (8, 1)), 0, 0),
])
def test_allocation_counts_the_gaps_storage_does_not(spec: TensorSpec, allocation: int,
                                                     storage: int) -> None:
    assert (spec.allocation_bytes, spec.storage_bytes) == (allocation, storage)
