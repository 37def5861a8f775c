"""A pipeline layout as Megatron-core writes it (``--pipeline-model-parallel-layout``): which
virtual stage holds the embedding, each decoder layer, the MTP layers and the loss.

Text (``layout=`` in a strategy): virtual stages separated by ``|``, each a run of ``E``
(the embedding), ``t`` (one decoder layer: a repeated block), ``m`` (one multi-token
prediction layer) and ``L`` (the loss: the final norm and the head); ``x*N`` repeats one
symbol and ``(…)*N`` a group, e.g. ``Et*4|(t*4|)*14tmL`` — DeepSeek-V3's 61 layers over 16
virtual stages, the embedding with four layers on the first, one layer with MTP and the loss on
the last. Virtual stage j runs on pipeline rank j mod pp as its (j div pp)-th chunk, so a
layout of pp · v stages sets v (Megatron-core's ``PipelineParallelLayerLayout``). Case is
ignored (strategy text is read in lower case); Megatron's cosmetic commas cannot appear in a
strategy, whose parts commas separate.

``layout=slots``: the even split with the embedding and the loss each taking one layer's slot
(Megatron-core's ``account_for_embedding_in_pipeline_split`` and
``account_for_loss_in_pipeline_split``, which Megatron-Bridge's Llama-3.1 405B and Qwen3-235B
recipes set): (blocks + 2) / (pp · v) slots per virtual stage, the first holding the
embedding and one layer fewer, the last the loss and one layer fewer (`slots_layout`).

What runs after the blocks (``post``: the final norm, the head, the loss, and the MTP depths
`--mtp` adds) is one unit here, so ``m`` must share the loss's stage. No torch here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

SYMBOLS = "etml"
SLOTS = "slots"
MAX_SYMBOLS = 1 << 16           # a layout longer than any model's layer count is a typo
_GROUP = re.compile(r"\(([^()]+)\)\*(\d+)")
_SINGLE = re.compile(r"([etml|])\*(\d+)")


def parse_layout(text: str) -> tuple[str, ...]:
    """The virtual stages of `text`, each a string over ``e t m l`` (lower case), in order.
    ValueError naming what cannot be read (``slots`` is laid out per model: `slots_layout`)."""
    flat = text.strip().lower()
    if flat == SLOTS:
        raise ValueError("layout=slots is laid out per model (slots_layout)")
    if not flat:
        raise ValueError("layout= needs stages, e.g. layout=Et*4|(t*4|)*14tmL")
    bad = sorted(set(flat) - set(SYMBOLS + "|()*0123456789"))
    if bad:
        raise ValueError(f"layout={text}: {''.join(bad)!r} is none of E (embedding), t "
                         f"(decoder layer), m (MTP layer), L (loss), | ( ) *N")
    for pattern in (_GROUP, _SINGLE):
        flat = _unrolled(pattern, flat, text)
    if set(flat) & set("()*0123456789"):
        raise ValueError(f"layout={text}: a repeat is written x*N or (…)*N, N a whole number")
    stages = tuple(flat.split("|"))
    problems = _order_problems(stages)
    if problems:
        raise ValueError(f"layout={text}: {'; '.join(problems)}")
    return stages


def _unrolled(pattern: re.Pattern[str], flat: str, text: str) -> str:
    """`flat` with every repeat `pattern` matches written out, refused past `MAX_SYMBOLS`."""
    while True:
        match = pattern.search(flat)
        if match is None:
            return flat
        body, times = match.group(1), int(match.group(2))
        grown = len(flat) - len(match.group(0)) + len(body) * times
        if grown > MAX_SYMBOLS:
            raise ValueError(f"layout={text}: more than {MAX_SYMBOLS:,} symbols written out")
        flat = flat[:match.start()] + body * times + flat[match.end():]


def _order_problems(stages: tuple[str, ...]) -> list[str]:
    """What Megatron-core's validation refuses: one embedding first, one loss last, MTP after
    every decoder layer — and here, MTP on the loss's stage."""
    flat = "".join(stages)
    found = []
    if flat.count("e") != 1 or not flat.startswith("e"):
        found.append("the embedding E must come once, first")
    if flat.count("l") != 1 or not flat.endswith("l"):
        found.append("the loss L must come once, last")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        found.append("MTP layers m come after every decoder layer t")
    if "m" in flat and "m" in "".join(s for s in stages if "l" not in s):
        found.append("MTP layers m share the loss's stage (fxlens plans them with the head)")
    return found


def layout_problems(layout: str, pp: int, v: int, blocks: int) -> list[str]:
    """Why the ``layout=`` text cannot lay out `blocks` repeated blocks over ``pp`` ranks of
    ``v`` chunks."""
    try:
        stages = resolved(layout, blocks, pp, v) or ()
    except ValueError as error:
        return [str(error)]
    found = []
    if len(stages) != pp * v:
        found.append(f"layout has {len(stages)} virtual stages, pp·v = {pp}·{v} = {pp * v}")
    layers = sum(stage.count("t") for stage in stages)
    if layers != blocks:
        found.append(f"layout places {layers} decoder layers (t), the model has {blocks}")
    return found


def by_rank(chunks: Sequence[T], pp: int) -> list[list[T]]:
    """Per pipeline rank, its chunks in layer order: rank r runs virtual stages r, r + pp, …"""
    return [[chunks[j] for j in range(rank, len(chunks), pp)] for rank in range(pp)]


def rank_contents(stages: tuple[str, ...], pp: int) -> list[str]:
    """Per pipeline rank, the symbols of its chunks in layer order."""
    return ["".join(chunks) for chunks in by_rank(stages, pp)]


def slots_layout(blocks: int, virtual_stages: int) -> tuple[str, ...]:
    """``layout=slots`` for `blocks` repeated blocks over `virtual_stages` (pp · v): each
    stage (blocks + 2) / virtual_stages slots, the embedding taking one on the first and the
    loss one on the last. ValueError where they do not divide (Megatron-core asserts so)."""
    slots, left = divmod(blocks + 2, virtual_stages)
    if left or slots < 1:
        raise ValueError(f"layout=slots: {blocks} blocks + the embedding and the loss "
                         f"({blocks + 2} slots) do not divide over pp·v = {virtual_stages} "
                         f"virtual stages")
    if virtual_stages == 1:
        return ("e" + "t" * blocks + "l",)
    return ("e" + "t" * (slots - 1), *["t" * slots] * (virtual_stages - 2),
            "t" * (slots - 1) + "l")


def resolved(layout: str | None, blocks: int, pp: int, v: int) -> tuple[str, ...] | None:
    """The virtual stages a strategy's ``layout=`` text places for a model of `blocks`
    repeated blocks (None: no layout, the even split)."""
    if layout is None:
        return None
    if layout == SLOTS:
        return slots_layout(blocks, pp * v)
    return parse_layout(layout)
