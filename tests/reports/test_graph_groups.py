"""The graph a person reads (issue 36): runs of alike blocks as one node and blocks that differ
apart, the tables' grouping kept; asserts hidden, their edges bridged; the input plumbing
folded by its stated criterion; a linear colour scale with its legend; no loader-internal
names in the graph or the page.

Synthetic reports (built here, no tracing) pin each rule; small traced decoders check that real
captures come out the same way."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxlens.analyzer.capture.load import load
from fxlens.analyzer.core.graph import ancestors
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.report import (
    Coverage,
    ModelInfo,
    ModuleReport,
    NodeReport,
    Report,
    Totals,
)
from fxlens.api import AnalysisOptions, analyze_loaded
from fxlens.reports.dot import dot_legend, render_dot
from fxlens.reports.graph_groups import FOLD_ID, MIN_FOLD, block_runs, plan_graph
from fxlens.reports.graph_legend import PALETTE, ZERO_COLOR, Scale
from fxlens.reports.html import render_html
from fxlens.reports.view import Detail
from fxlens.reports.views.model import modules_view

ROOT = Path(__file__).resolve().parents[2]
BIG = 1_000_000     # a block op's FLOPs: the plumbing's shares are measured against these


# --- synthetic reports -----------------------------------------------------------------------


def op(id: int, target: str, module: str, inputs: Sequence[int] = (), flops: int = 0,
       moved: int = 0, shape: Sequence[int] = (4,), status: str = "costed",
       outputs: tuple[dict[str, object], ...] | None = None) -> NodeReport:
    outs = ({"shape": list(shape), "dtype": "float32"},) if outputs is None else outputs
    return NodeReport(id=id, target=f"aten.{target}.default", status=status, module=module,
                      module_type="", source=f"m.py:{id}", inputs=tuple(inputs), outputs=outs,
                      flops=flops, bytes_read=moved, bytes_written=0)


def assert_op(id: int, module: str, inputs: Sequence[int]) -> NodeReport:
    return op(id, "_assert_tensor_metadata", module, inputs, status="free", outputs=())


def report_of(nodes: Sequence[NodeReport], own_params: dict[str, int]) -> Report:
    """A report whose module figures are the sums of `nodes` (params: of `own_params`)."""
    paths: dict[str, None] = {}
    for path in [*(n.module for n in nodes), *own_params]:
        paths.update(dict.fromkeys(ancestors(path)))
    modules = []
    for path in paths:
        inside = [n for n in nodes if path in ancestors(n.module)]
        params = sum(p for q, p in own_params.items() if path in ancestors(q))
        modules.append(ModuleReport(path, "models.Layer" if path.startswith("layers.") else
                                    "models.Module", path.count(".") + bool(path),
                                    sum(n.flops for n in inside), sum(n.flops for n in inside) // 2,
                                    sum(n.bytes_read for n in inside), 0, params, 4 * params,
                                    len(inside)))
    flops, moved = sum(n.flops for n in nodes), sum(n.bytes_read for n in nodes)
    model = ModelInfo("synthetic", "test", "synthetic", (), sum(own_params.values()), 0, 0, 0, 0)
    return Report(model, Totals(flops, flops // 2, moved, 0), tuple(nodes), tuple(modules),
                  Coverage(len(nodes), 0, {}, {}), {})


def decoder(blocks: int = 4, extra_op_in: int | None = None) -> Report:
    """Input plumbing, then `blocks` alike layers (one of them with an extra free op), then a
    head. Ids 1–10 are before the first layer; the comment says why each folds or not."""
    nodes = [
        op(1, "embedding", "embed", moved=100),             # a module with weights: drawn
        op(2, "arange", "", flops=8, moved=32),              # folds
        op(3, "unsqueeze", "rotary", [2], status="free"),    # folds
        assert_op(4, "rotary", [3]),                         # hidden, counted nowhere
        op(5, "cos", "rotary", [3], flops=16, moved=32),     # folds: 4 FLOPs per element
        op(6, "sin", "rotary", [3], flops=16, moved=32),     # folds
        op(7, "to", "rotary", [5], status="free"),           # folds
        op(8, "bmm", "rotary", [3], flops=400, moved=32),    # 100 FLOPs per element: drawn
        op(9, "tril", "", moved=BIG),                        # over 0.1 % of the bytes: drawn
        op(10, "custom", "", status="unsupported"),          # unsupported: drawn
        op(11, "mul", "", [1], flops=16, moved=32),          # reads the embedding: drawn
        op(12, "embedding", "tied", moved=100),              # a tied weight: no params, but
        op(13, "dropout", "", [12], moved=100),              # the first block's alone: drawn
    ]
    last, next_id = 1, 100
    for layer in range(blocks):
        block = f"layers.{layer}"
        nodes.append(op(next_id, "linear", block, [last, 7, 6, 9, 11], flops=BIG,
                        moved=BIG // 10))
        nodes.append(op(next_id + 1, "add", block, [next_id, last if layer else 13], flops=4,
                        moved=16))
        last, next_id = next_id + 1, next_id + 2
        if layer == extra_op_in:
            nodes.append(op(next_id, "view", block, [last], status="free"))
            last, next_id = next_id, next_id + 1
    nodes += [op(900, "to", "", [last], status="free"),      # cheap, but after the blocks
              op(901, "linear", "head", [900], flops=BIG // 2, moved=BIG // 10)]
    own = {"embed": 64, "head": 64, **{f"layers.{i}": 100 for i in range(blocks)}}
    return report_of(nodes, own)


def flop_value(text: str) -> float:
    """``444.45 kFLOP`` → 444450.0"""
    number, unit = text.split()
    return float(number) * {"k": 1e3, "M": 1e6, "G": 1e9}.get(unit[0], 1.0)


def drawn_ids(dot: str) -> list[str]:
    return re.findall(r"^\s*(\w+) \[id=", dot, flags=re.M)


# --- runs --------------------------------------------------------------------------------------


def test_alike_blocks_are_one_node_with_figures_each_and_in_all() -> None:
    report = decoder(blocks=4)
    dot = render_dot(report)
    assert [r.label for r in block_runs(report)] == ["layers.0–3 ×4"]
    assert [i for i in drawn_ids(dot) if i[0] == "b"] == ["b0"]
    line = next(x for x in dot.splitlines() if x.strip().startswith("b0 "))
    assert "layers.0–3 ×4 · Layer" in line and "2 ops · 1.00 MFLOP" in line and "each" in line
    assert "4.00 MFLOP" in line and "in all" in line
    # edges into and out of the run merge: one per neighbour, none between its blocks
    edges = [x.strip() for x in dot.splitlines() if "->" in x]
    assert sum(e.startswith("n1 -> b0") for e in edges) == 1
    assert sum(e.startswith("b0 -> n900") for e in edges) == 1
    assert not any(e.startswith("b0 -> b0") for e in edges)


def test_blocks_that_differ_are_separate_runs_side_by_side() -> None:
    """Layer 2 runs one more op than the others (same FLOPs, params and bytes): three runs,
    0–1, 2 and 3–4, each its own node, chained."""
    report = decoder(blocks=5, extra_op_in=2)
    assert [r.label for r in block_runs(report)] == ["layers.0–1 ×2", "layers.2",
                                                     "layers.3–4 ×2"]
    dot = render_dot(report)
    assert [i for i in drawn_ids(dot) if i[0] == "b"] == ["b0", "b2", "b3"]
    assert "layers.2 · Layer\\n3 ops" in dot
    edges = [x.strip().split(" [")[0] for x in dot.splitlines() if "->" in x]
    assert {"b0 -> b2", "b2 -> b3"} <= set(edges)


def test_expand_opens_the_runs_and_the_fold() -> None:
    report = decoder(blocks=4)
    ids = drawn_ids(render_dot(report, expand=True))
    assert not any(i[0] in "bp" for i in ids)
    assert {f"n{n.id}" for n in report.nodes if n.status != "free" or n.outputs} == set(ids) - {
        "legend"}


# --- hidden asserts ----------------------------------------------------------------------------


def test_asserts_are_not_drawn_and_their_edges_are_bridged() -> None:
    report = report_of([op(1, "relu", "", flops=4), assert_op(2, "", [1]),
                        op(3, "mul", "", [2], flops=4)], {})
    dot = render_dot(report)
    assert "_assert" not in dot and "n2" not in drawn_ids(dot)
    assert re.search(r"^\s*n1 -> n3 ", dot, flags=re.M)
    assert plan_graph(report).hidden == {2}


# --- plumbing ----------------------------------------------------------------------------------


def test_plumbing_folds_the_cheap_input_ops_before_the_first_block() -> None:
    report = decoder(blocks=4)
    plan = plan_graph(report)
    assert [n.id for n in plan.folded] == [2, 3, 5, 6, 7]
    dot = render_dot(report)
    assert "inputs &amp; plumbing: 5 ops" in dot
    for kept in (1, 8, 9, 10, 11, 12, 13, 900):    # why each stays: see `decoder`
        assert f"n{kept}" in drawn_ids(dot)
    assert plan.module_of[FOLD_ID] == ""                 # "" and "rotary": the root holds both
    # the shared rotary tables come from the fold: one dashed edge to the run, not one a block
    shared = [x for x in dot.splitlines() if x.strip().startswith("p0 -> b0")]
    assert len(shared) == 1 and "→ 4 blocks" in shared[0] and "dashed" in shared[0]


def test_too_few_cheap_ops_are_left_as_they_are() -> None:
    nodes = [op(2, "arange", "", flops=8), op(100, "linear", "layers.0", [2], flops=BIG),
             op(101, "linear", "layers.1", [100], flops=BIG)]
    assert MIN_FOLD == 2 and plan_graph(report_of(nodes, {})).folded == ()


def test_no_fold_without_repeated_blocks() -> None:
    report = report_of([op(1, "arange", "", flops=1), op(2, "cos", "", [1], flops=4),
                        op(3, "linear", "fc", [2], flops=BIG)], {"fc": 10})
    assert plan_graph(report).folded == () and FOLD_ID not in render_dot(report)


# --- colour ------------------------------------------------------------------------------------


def test_the_scale_is_linear_from_zero_to_the_largest_node() -> None:
    scale = Scale(900.0)
    assert scale.level(0) is None and scale.fill(0) == ZERO_COLOR
    assert [scale.level(v) for v in (1, 99.9, 100, 450, 899, 900)] == [0, 0, 1, 4, 8, 8]
    assert scale.bounds() == [(100.0 * k, 100.0 * (k + 1)) for k in range(len(PALETTE))]


def test_the_legend_lists_linear_bins_in_the_metric_units() -> None:
    report = decoder(blocks=4)
    dot = render_dot(report)
    legend = dot_legend(report)
    top = 4 * (BIG + 4)                           # the run: its ops summed
    assert legend.bins[0].color == ZERO_COLOR and legend.bins[0].text == "0"
    assert [b.color for b in legend.bins[1:]] == list(PALETTE)
    assert [b.high for b in legend.bins[1:]] == pytest.approx(
        [top * (k + 1) / len(PALETTE) for k in range(len(PALETTE))])
    texts = re.findall(r'<td align="left">([^<]*)</td>', dot)
    assert texts == [b.text for b in legend.bins]
    highs = [flop_value(t.split(" – ")[1]) for t in texts[1:]]           # read back
    steps = [b - a for a, b in zip([0.0, *highs[:-1]], highs, strict=True)]
    assert max(steps) - min(steps) <= 0.01 * 1e6 + 1     # equal steps, to the labels' 2 digits
    assert "FLOPs per node, linear" in dot
    head = next(x for x in dot.splitlines() if x.strip().startswith("n901 "))
    assert f'fillcolor="{PALETTE[1]}"' in head   # 0.5 M of 4 M: the second bin, not a warm one
    run = next(x for x in dot.splitlines() if x.strip().startswith("b0 "))
    assert f'fillcolor="{PALETTE[-1]}"' in run


# --- traced decoders ---------------------------------------------------------------------------


class Rotary(nn.Module):
    """cos and sin tables of one head's width, from a buffer: Llama's rotary embedding."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, dim, 2) / dim),
                             persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq[None, :]   # (T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)                       # (T, D)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class Layer(nn.Module):
    """Attention on rotated queries and keys; `window` makes it a sliding-window layer."""

    def __init__(self, width: int, window: int | None, heads: int) -> None:
        super().__init__()
        self.window, self.heads = window, heads
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:           # x: (B, T, C), mask: (T, T)
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)   # (B, H, T, D)
                   for z in self.qkv(self.norm(x)).chunk(3, dim=-1))
        q, k = q * cos + k * sin, k * cos - q * sin
        if self.window is not None:
            i = torch.arange(t, device=x.device)
            mask = mask & ((i[:, None] - i[None, :]) < self.window)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)          # (B, H, T, D)
        return x + self.out(y.transpose(1, 2).reshape(b, t, c))


class Decoder(nn.Module):
    """Sized so that the rotary tables and the mask are under 0.1 % of the work, as in a real
    LLM: 32 heads of 8 over a width of 256, 16 tokens."""

    def __init__(self, windows: Sequence[int | None], width: int = 256, heads: int = 32,
                 vocab: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rotary = Rotary(width // heads)
        self.layers = nn.ModuleList(Layer(width, w, heads) for w in windows)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:       # ids: (B, T)
        t = ids.shape[1]
        x = self.embed(ids)
        cos, sin = self.rotary(torch.arange(t, device=ids.device), x.dtype)
        mask = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.head(x)


def traced(windows: Sequence[int | None]) -> Report:
    torch.manual_seed(0)
    module = Decoder(windows).eval()
    return analyze_loaded(LoadedModel(module, (torch.randint(0, 64, (1, 16)),), "decoder",
                                      "test_graph_groups.py"), AnalysisOptions(strict=True))


@pytest.fixture(scope="module")
def rotary_report() -> Report:
    return traced([None] * 4)


def test_a_traced_decoder_is_embedding_plumbing_one_run_and_head(rotary_report: Report
                                                                  ) -> None:
    dot = render_dot(rotary_report)
    assert "layers.0–3 ×4 · Layer" in dot
    assert [i for i in drawn_ids(dot) if i[0] == "b"] == ["b0"]
    folded = {n.target.split(".")[1] for n in plan_graph(rotary_report).folded}
    assert {"arange", "cos", "sin"} <= folded and "embedding" not in folded
    assert "_assert" not in dot


def test_sliding_and_full_layers_are_not_merged_and_agree_with_the_table() -> None:
    report = traced([None, None, 4, 4])
    assert [r.label for r in block_runs(report)] == ["layers.0–1 ×2", "layers.2–3 ×2"]
    rows = [row[0].text.strip() for row in modules_view(report, Detail(depth=2)).blocks[0].rows]
    assert "0–1 ×2" in rows and "2–3 ×2" in rows        # the modules table cuts them alike
    dot = render_dot(report)
    assert "layers.0–1 ×2 · Layer" in dot and "layers.2–3 ×2 · Layer" in dot


# --- names -------------------------------------------------------------------------------------


def test_no_loader_internal_name_in_the_graph_or_the_page() -> None:
    """examples/tiny_gpt.py, loaded as a model file: its 6 blocks are one ×6 node, and its
    types read ``tiny_gpt.Block`` everywhere (never the loader's ``fxlens_user_`` module)."""
    loaded = load(str(ROOT / "examples" / "tiny_gpt.py"), sizes={"seq_len": 16})
    report = analyze_loaded(loaded, AnalysisOptions(strict=True))
    dot = render_dot(report)
    assert [line for line in dot.splitlines() if "box3d" in line and "blocks.0–5 ×6 · Block"
            in line]
    page = render_html(report, "<svg></svg>")
    assert "fxlens_user_" not in dot and "fxlens_user_" not in page
    assert "fxlens_user_" not in report.to_json()
    assert {m.type for m in report.modules if m.path == "blocks.0"} == {"tiny_gpt.Block"}


def test_the_page_links_folded_items_and_shows_the_legend(rotary_report: Report) -> None:
    page = render_html(rotary_report, "<svg></svg>")
    data = json.loads(re.search(r'id="fxlens-data">(.*?)</script>', page, re.S).group(1))
    graph = data["view"]["graph"]
    assert graph["runs"] == [{"item": "b0", "first": 0, "count": 4, "label": "layers.0–3 ×4",
                              "type": f"{Layer.__module__}.Layer"}]
    assert graph["folded"]["nodes"] == [n.id for n in plan_graph(rotary_report).folded]
    assert graph["hidden"] == sorted(plan_graph(rotary_report).hidden)
    legend = page[page.index('id="graph-legend"'):]
    legend = legend[:legend.index("</div>")]
    assert legend.count('class="bin"') == len(PALETTE) + 1 and "FLOPs per node" in legend
