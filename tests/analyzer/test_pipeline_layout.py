"""``layout=`` in a strategy: Megatron-core's pipeline layout string, read as it reads it
(`fxlens.analyzer.plan.pipeline_layout`), and the units each pipeline rank then holds."""

from __future__ import annotations

import pytest

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.plan.estimate import estimate
from fxlens.analyzer.plan.pipeline_layout import (
    layout_problems,
    parse_layout,
    rank_contents,
    slots_layout,
)
from fxlens.analyzer.plan.stage_memory import stages
from fxlens.analyzer.plan.strategy import parse
from fxlens.analyzer.plan.structure import ModelFacts, Unit
from fxlens.analyzer.plan.unit_share import phase_s
from fxlens.rules.hardware import device

H100 = device("h100")
DEEPSEEK_V3 = "Et*4|(t*4|)*14tmL"     # Megatron-Bridge's (PP, VP) = (4, 4) and (2, 8) map


def test_megatrons_own_example_unrolls_as_its_docstring_says() -> None:
    # megatron/core/transformer/pipeline_parallel_layer_layout.py, parse_str_to_list:
    # "Ettt|(tt|)*29,m|L" -> [["E","t","t","t"]] + [["t","t"]]*29 + [["m"],["L"]] (its
    # cosmetic comma left out: commas separate a strategy's parts). MTP on a stage of its
    # own ("standalone") is refused here: the plan keeps the depths with the head and loss
    assert parse_layout("Ettt|(tt|)*29mL") == ("ettt", *["tt"] * 29, "ml")
    with pytest.raises(ValueError, match="share the loss's stage"):
        parse_layout("Ettt|(tt|)*29m|L")


def test_deepseek_v3s_layout_puts_61_layers_on_16_virtual_stages() -> None:
    layout = parse_layout(DEEPSEEK_V3)
    assert len(layout) == 16 and sum(s.count("t") for s in layout) == 61
    assert layout[0] == "etttt" and layout[-1] == "tml"
    # on 4 ranks, rank r holds virtual stages r, r + 4, r + 8, r + 12
    ranks = rank_contents(layout, 4)
    assert [r.count("t") for r in ranks] == [16, 16, 16, 13]
    assert ranks[0].startswith("e") and ranks[3].endswith("tml")


def test_the_layout_sets_v_and_reads_back() -> None:
    s = parse(f"dp=64,pp=4,ep=64,layout={DEEPSEEK_V3}")
    assert s.v == 4
    assert parse(s.label) == s
    assert f"layout={DEEPSEEK_V3}" in s.label


@pytest.mark.parametrize(("text", "says"), [
    ("dp=4,pp=4,v=2,layout=Et*4|(t*4|)*14tmL", "16 virtual stages, pp·v = 4·2 = 8"),
    ("dp=4,layout=Et|L", "needs pp > 1"),
    ("dp=4,pp=2,layout=Ex|L", "'x' is none of"),
    ("dp=4,pp=2,layout=tE|L", "embedding E must come once, first"),
    ("dp=4,pp=2,layout=Et|Lt", "loss L must come once, last"),
    ("dp=4,pp=2,layout=Em|tL", "MTP layers m come after every decoder layer"),
    ("dp=4,pp=2,layout=Etm|tL", "come after every decoder layer"),
    ("dp=4,pp=3,layout=Et|tL", "2 virtual stages, pp·v = 3·1 = 3"),
    ("dp=4,pp=3,layout=Et|t|m|L", "share the loss's stage"),
    ("dp=4,pp=2,layout=(t*65536|)*65536EL", "more than 65,536 symbols"),
    ("dp=4,pp=2,layout=E(tt)|L", "x*N or (…)*N"),
    ("dp=4,pp=2,layout=Et|tL,layout=Et|tL", "layout is given twice"),
])
def test_a_layout_that_cannot_be_read_is_refused_naming_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")
                       .replace("*", r"\*").replace("|", r"\|")):
        parse(text)


def test_a_layout_must_place_every_block_once() -> None:
    assert layout_problems(DEEPSEEK_V3, 4, 4, 61) == []
    assert layout_problems(DEEPSEEK_V3, 4, 4, 60) == [
        "layout places 61 decoder layers (t), the model has 60"]


def test_slots_give_the_embedding_and_the_loss_a_layers_slot() -> None:
    # Megatron-Bridge's Llama-3.1 405B at PP8 VP8: (126 + 2) / 64 = 2 slots a virtual stage;
    # Qwen3-235B at PP8 VP4: (94 + 2) / 32 = 3
    llama = slots_layout(126, 64)
    assert llama == ("et", *["tt"] * 62, "tl")
    qwen = slots_layout(94, 32)
    assert qwen[0] == "ett" and qwen[-1] == "ttl" and set(qwen[1:-1]) == {"ttt"}
    assert sum(s.count("t") for s in qwen) == 94
    assert [r.count("t") for r in rank_contents(qwen, 8)] == [11, *[12] * 6, 11]
    assert layout_problems("slots", 8, 4, 94) == []
    assert layout_problems("slots", 8, 4, 95) == [
        "layout=slots: 95 blocks + the embedding and the loss (97 slots) do not divide over "
        "pp·v = 32 virtual stages"]
    s = parse("dp=8,pp=8,v=4,layout=slots")
    assert s.v == 4 and parse(s.label) == s and "layout=slots" in s.label


def unit(name: str) -> Unit:
    return Unit(name=name)


def test_each_rank_holds_what_its_chunks_place() -> None:
    units = [unit("pre"), *(unit(f"blocks.{i}") for i in range(6)), unit("post")]
    # 3 ranks × 2 chunks: the embedding alone, the head and loss with one block; blocks in
    # layer order over the chunks (rank 0: chunks 0 and 3; rank 1: 1 and 4; rank 2: 2 and 5)
    laid = stages(units, 6, 3, parse_layout("E|tt|t|t|t|tL"))
    assert [[u.name for u in rank] for rank in laid] == [
        ["pre", "blocks.3"], ["blocks.0", "blocks.1", "blocks.4"],
        ["blocks.2", "blocks.5", "post"]]
    even = stages(units, 6, 3)
    assert [[u.name for u in rank] for rank in even] == [
        ["pre", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3"], ["blocks.4", "blocks.5", "post"]]


def test_a_layout_as_the_default_split_plans_the_same(gpt: tuple[Report, ModelFacts]) -> None:
    _, facts = gpt     # tests/models/tiny_gpt.py: 2 blocks
    laid = estimate(facts, parse("dp=1,pp=2,layout=Et|tL", micro_batches=4), H100)
    even = estimate(facts, parse("dp=1,pp=2", micro_batches=4), H100)
    assert (laid.time, laid.memory) == (even.time, even.memory)
    assert laid.strategy == "dp=1,pp=2,layout=Et|tL"


def test_a_layout_moves_the_work_it_places(gpt: tuple[Report, ModelFacts]) -> None:
    """Both blocks and the head on the last rank, the embedding alone on the first: the
    slowest rank computes the whole model but the embedding."""
    _, facts = gpt
    m = 4
    laid = estimate(facts, parse("dp=1,pp=2,layout=E|ttL", micro_batches=m), H100)
    one = parse("dp=1", micro_batches=m)
    whole = estimate(facts, one, H100).time.compute_s
    pre = next(u for u in facts.units if u.name == "pre")
    embedding = m * (phase_s(one, pre, "forward") + phase_s(one, pre, "backward"))
    assert laid.time.compute_s == pytest.approx(whole - embedding)
    even = estimate(facts, parse("dp=1,pp=2", micro_batches=m), H100)
    assert laid.time.compute_s > even.time.compute_s
