"""DOT output: goldens (``pytest --update-goldens``), determinism, collapsing, colouring and
escaping."""

from __future__ import annotations

import re
import shutil

import pytest

from fxlens.analyzer.core.errors import ReportError
from fxlens.analyzer.core.loaded import LoadedModel
from fxlens.analyzer.core.report import Report
from fxlens.api import AnalysisOptions, analyze_loaded
from fxlens.reports.dot import collapsed_blocks, dot_binary, graphviz_render, render_dot
from fxlens.reports.graph_legend import PALETTE
from tests.models import evil_names, tiny_gpt
from tests.test_goldens import GOLDENS, MODELS, check, report_of


@pytest.mark.parametrize("name", sorted(MODELS))
def test_dot_matches_golden(name: str, update_goldens: bool) -> None:
    check(GOLDENS / f"{name}.dot", render_dot(report_of(name)), update_goldens)


def test_dot_golden_of_collapsed_gpt(gpt_report: Report, update_goldens: bool) -> None:
    check(GOLDENS / "tiny_gpt.collapsed.dot", render_dot(gpt_report, color="bytes"),
          update_goldens)


def test_same_report_same_bytes(gpt_report: Report) -> None:
    assert render_dot(gpt_report) == render_dot(gpt_report)
    assert render_dot(gpt_report, expand=True) == render_dot(gpt_report, expand=True)


def test_repeated_blocks_collapse_into_one_run_unless_expanded(gpt_report: Report) -> None:
    assert collapsed_blocks(gpt_report) == ("blocks.0", "blocks.1")
    collapsed, expanded = render_dot(gpt_report), render_dot(gpt_report, expand=True)
    block_nodes = [n for n in gpt_report.nodes if n.module.startswith("blocks.")]
    assert 'b0 [id="b0"' in collapsed and "b1" not in re.findall(r"\bb\d+\b", collapsed)
    assert "blocks.0–1 ×2 · Block" in collapsed
    assert f"{sum(n.module.startswith('blocks.0') for n in block_nodes)} ops" in collapsed
    assert not any(f'n{n.id} [id=' in collapsed for n in block_nodes)
    assert all(f'n{n.id} [id="n{n.id}", URL="#n{n.id}"' in expanded for n in gpt_report.nodes)
    assert "b0" not in re.findall(r"\bb\d+\b", expanded)


def test_every_edge_labelled_with_a_shape(gpt_report: Report) -> None:
    """(Edges into a run merge: one per source, see tests/reports/test_graph_groups.py.)"""
    edges = [line for line in render_dot(gpt_report, expand=True).splitlines() if "->" in line]
    assert edges and all(re.search(r'label="[\d×]+ \w+"', e) for e in edges)


def test_colour_follows_the_metric(gpt_report: Report) -> None:
    text = render_dot(gpt_report, expand=True)
    biggest = max(gpt_report.nodes, key=lambda n: n.flops)
    line = next(x for x in text.splitlines() if x.strip().startswith(f"n{biggest.id} "))
    assert f'fillcolor="{PALETTE[-1]}"' in line
    memory = render_dot(gpt_report, color="memory")
    assert "live" in memory and memory != text


def test_time_colour_needs_a_roofline(gpt_report: Report) -> None:
    with pytest.raises(ReportError, match="roofline"):
        render_dot(gpt_report, color="time")
    module, inputs = tiny_gpt.build()
    timed = analyze_loaded(LoadedModel(module, inputs, "tiny_gpt", "tiny_gpt.py"),
                           AnalysisOptions(device="h100"))
    assert re.search(r"\d+(\.\d+)? (µs|ns)", render_dot(timed, color="time"))
    with pytest.raises(ReportError, match="unknown colour"):
        render_dot(gpt_report, color="heat")


def test_names_from_user_code_are_escaped(evil_report: Report) -> None:
    text = render_dot(evil_report)
    assert 'tooltip="q\\"uote&amp;\\\\amp' in text
    assert evil_names.SCRIPT_NAME in text        # plain text inside a quoted DOT string
    unescaped = text.replace("\\\\", "").replace('\\"', "")
    assert all(line.count('"') % 2 == 0 for line in unescaped.splitlines())


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed")
def test_graphviz_accepts_it_and_keeps_node_ids(evil_report: Report, gpt_report: Report) -> None:
    svg = graphviz_render(render_dot(gpt_report)).decode()
    assert 'id="b0"' in svg and 'xlink:href="#b0"' in svg and 'id="legend"' in svg
    evil = graphviz_render(render_dot(evil_report)).decode()
    assert "<script>" not in evil and "&lt;script&gt;" in evil


@pytest.mark.slow
def test_shared_inputs_are_drawn_once_not_to_every_block() -> None:
    """Llama's rotary tables and causal mask feed every layer: one dashed edge each, labelled
    with the count, instead of one edge per layer."""
    from fxlens.api import AnalysisOptions, analyze_target
    from fxlens.reports.dot import SHARED_FANOUT

    layers = SHARED_FANOUT + 1
    report = analyze_target("hf:llama-2-7b", AnalysisOptions(
        overrides={"num_hidden_layers": str(layers), "hidden_size": "256",
                   "intermediate_size": "512", "num_attention_heads": "4",
                   "num_key_value_heads": "4"}, sizes={"seq_len": 16}, fusion=False))
    text = render_dot(report)
    shared = [line for line in text.splitlines() if "style=dashed" in line]
    assert shared and all(f"→ {layers} blocks" in line for line in shared)
    for line in shared:
        source = line.split("->")[0].strip()
        assert sum(ln.strip().startswith(f"{source} ->") for ln in text.splitlines()) == 1
    # the rotary tables come from the folded plumbing, into the one run of 4 layers
    assert any(line.strip().startswith("p0 -> b0") for line in shared)
    assert f"model.layers.0–{layers - 1} ×{layers} · LlamaDecoderLayer" in text
    assert "_assert" not in text


@pytest.mark.skipif(dot_binary() is None, reason="graphviz's dot is not installed")
def test_a_training_graph_with_clusters_lays_out() -> None:
    """graphviz's old ranking failed on the conv net's training step ("trouble in init_rank");
    newrank lays it out."""
    from tests.models import convnet

    module, inputs = convnet.build()
    report = analyze_loaded(LoadedModel(module, inputs, "convnet", "convnet.py"),
                            AnalysisOptions(train=True, fusion=False))
    assert graphviz_render(render_dot(report)).startswith(b"<?xml")
