"""The ``plan`` section: one requested layout, or a search over layouts ranked.

A search holds the global batch fixed (``global_batch`` samples per step; by default the
captured batch on every GPU of the largest count searched) so that layouts are compared on the
same work: a layout's micro-batches are ``global_batch / (captured batch · dp)`` and it is
dropped when that is not a whole number. Searched: GPU counts (powers of two up to
``max_gpus``, and ``max_gpus``), tp over powers of two up to a node that divide every column-
parallel width, pp over powers of two up to the block count, cp over powers of two up to
`CP_MAX` where the blocks attend and each GPU keeps at least `CP_MIN_TOKENS` of the sequence
(a bound on the search, not a judgement: the estimate ranks them), ep over powers of two
dividing the expert count and the GPUs of a stage (tp · cp · dp, each expert whole:
etp = 1), ZeRO 0–3 (over dp · cp) and hybrid sharding, recompute as ``ckpt=auto`` chooses it
(none where the layout fits without, else the modules that make it fit for the least
recompute) and full; tensor-parallel layouts with sequence parallel (same transfers, less
memory). CPU offload, expert tensor parallelism and compression are not searched. Layouts
that do not fit are dropped with the bytes they need (their memory alone is estimated); the
rest are ranked by step time, or by the cost of a step (``price``), or of the whole run
(``tokens``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace

from fxlens.analyzer.core.sections import DroppedLayout, Plan, PlanLayout
from fxlens.analyzer.plan.auto_recompute import estimate_auto, estimate_resolved, resolve_auto
from fxlens.analyzer.plan.pipeline_layout import layout_problems
from fxlens.analyzer.plan.recompute import KINDS, recomputed
from fxlens.analyzer.plan.strategy import Strategy
from fxlens.analyzer.plan.structure import ModelFacts
from fxlens.analyzer.plan.transfers import Links

SHOWN = 8
CP_MAX = 8              # context parallel degrees searched (Llama 3's 128k runs used 16)
CP_MIN_TOKENS = 2048    # tokens per GPU below which splitting the sequence is not tried
DROPPED_SHOWN = 12


@dataclass(frozen=True)
class PlanRequest:
    strategy: Strategy | None = None       # None: search
    gpus: int | None = None                # a search at exactly this count
    max_gpus: int | None = None            # a search up to this count
    global_batch: int | None = None        # samples per step in a search
    tokens: int | None = None
    price_per_gpu_hour: float | None = None
    routing: str | None = None             # the run's router (`Strategy.routing`), kept


def _powers(limit: int) -> list[int]:
    return [2**i for i in range(int(math.log2(max(limit, 1))) + 1)]


def candidates(facts: ModelFacts, request: PlanRequest, gpus_per_node: int
               ) -> Iterator[Strategy | DroppedLayout]:
    """Every layout the search considers, or why one cannot be laid out at all."""
    counts = ([request.gpus] if request.gpus else
              sorted({*_powers(request.max_gpus or 8), request.max_gpus or 8}))
    widths = _block_widths(facts)
    pairs = any(u.row_gemms for u in facts.units)
    batch = request.global_batch or facts.samples * max(counts)
    for n in counts:
        for tp in _powers(min(gpus_per_node, n)):
            if tp > 1 and not pairs:
                continue
            if any(w % tp for w in widths):
                yield DroppedLayout(f"tp={tp}", f"tp={tp} does not divide every column-"
                                    f"parallel width ({', '.join(map(str, sorted(widths)))})")
                continue
            for pp in _powers(max(facts.blocks, 1)):
                if n % (tp * pp):
                    continue
                for cp in context_degrees(facts, n // (tp * pp)):
                    yield from _inner(facts, n // (tp * pp * cp), tp, pp, cp, batch,
                                      gpus_per_node)


def context_degrees(facts: ModelFacts, gpus: int) -> list[int]:
    """The cp a search tries on `gpus` GPUs: 1, and where the blocks attend over sequences
    long enough to split (`CP_MIN_TOKENS` per GPU, in 2·cp chunks for the causal load
    balance), powers of two up to `CP_MAX`."""
    seq = facts.tokens // max(facts.samples, 1)
    attends = any(u.attention.kv_bytes for u in facts.units)
    return [cp for cp in _powers(min(gpus, CP_MAX))
            if cp == 1 or (attends and seq % (2 * cp) == 0 and seq // cp >= CP_MIN_TOKENS)]


def _inner(facts: ModelFacts, dp: int, tp: int, pp: int, cp: int, batch: int,
           gpus_per_node: int) -> Iterator[Strategy | DroppedLayout]:
    per_step = facts.samples * dp
    if batch % per_step:
        yield DroppedLayout(f"dp={dp},tp={tp},pp={pp}" + (f",cp={cp}" if cp > 1 else ""),
                            f"the global batch of {batch} is not a multiple of dp × "
                            f"micro-batch = {per_step}")
        return
    m = batch // per_step
    eps = [e for e in _powers(dp * tp * cp) if facts.experts and facts.experts % e == 0] or [1]
    for ep in eps:
        for zero, hybrid in ((0, False), (1, False), (2, False), (3, False), (3, True)):
            shard = gpus_per_node // (tp * cp)
            if (dp * cp == 1 and zero) or (hybrid and not 1 < shard < dp * cp):
                continue   # nothing to shard, or hybrid would be plain ZeRO-3 or DDP
            for full in (False, True):
                yield Strategy(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, hybrid=hybrid,
                               sp=tp > 1, micro_batches=m, checkpoint=full,
                               checkpoint_auto=not full)


def misfits(facts: ModelFacts, strategy: Strategy) -> list[str]:
    """Why `strategy` cannot split this model (empty when it can): more stages than blocks,
    a tp that does not divide a column-parallel width, an ep that does not divide the experts,
    a selective recompute that names no module of the blocks."""
    found = []
    if strategy.pp > max(facts.blocks, 1):
        found.append(f"pp={strategy.pp} needs at least {strategy.pp} repeated blocks; the "
                     f"model has {facts.blocks}")
    if strategy.layout is not None:
        found += layout_problems(strategy.layout, strategy.pp, strategy.v, facts.blocks)
    widths = sorted(_block_widths(facts))
    if strategy.tp > 1 and not any(u.row_gemms for u in facts.units):
        found.append("tp > 1 needs tensor-parallel pairs; none were found in the graph")
    elif any(w % strategy.tp for w in widths):
        found.append(f"tp={strategy.tp} does not divide every column-parallel width "
                     f"({', '.join(map(str, widths))})")
    if strategy.ep > 1 and (not facts.experts or facts.experts % strategy.ep):
        found.append(f"ep={strategy.ep} must divide the experts per layer ({facts.experts})")
    blocks = [u for u in facts.units if _is_block(u.name)]
    for pattern in strategy.recompute:
        if not any(recomputed(u.name, u.parts, (pattern,)) for u in blocks):
            names = sorted({p.name[len(u.name) + 1:].split(".")[0] for u in blocks[:1]
                            for p in u.parts if p.name.startswith(u.name + ".")})
            found.append(f"ckpt={pattern} recomputes no module of the repeated blocks "
                         f"(theirs: {', '.join(names) or 'none'}; kinds: {', '.join(KINDS)})")
    return found


def _block_widths(facts: ModelFacts) -> set[int]:
    """Column widths tp must divide: the blocks' (an LM head's vocabulary is padded to a
    multiple of tp, as Megatron-LM does)."""
    return {w for u in facts.units if _is_block(u.name) for w in u.column_widths}


def _is_block(name: str) -> bool:
    return name not in ("pre", "post")


def plan_section(facts: ModelFacts, request: PlanRequest, device: Links,
                 assumptions: tuple[str, ...], link_efficiency: float, link_source: str,
                 intra: float, inter: float) -> Plan:
    """The report's ``plan`` section for `facts` on `device`."""
    layouts: list[PlanLayout] = []
    dropped: list[tuple[int, DroppedLayout]] = []
    reasons: Counter[str] = Counter()
    considered = 0
    if request.strategy is not None:
        layouts.append(estimate_auto(facts, request.strategy, device, request.tokens,
                                     request.price_per_gpu_hour))
        considered = 1
        ranked_by = "requested"
        if not layouts[0].fits:   # what would fit on the same GPUs, at the same batch
            asked = request.strategy
            batch = request.global_batch or facts.samples * asked.dp * asked.micro_batches
            fitting, *_ = _search(facts, replace(request, strategy=None, gpus=asked.gpus,
                                                 global_batch=batch, routing=asked.routing),
                                  device)
            layouts += fitting[:SHOWN - 1]
    else:
        fitting, dropped, reasons, considered = _search(facts, request, device)
        layouts = fitting[:SHOWN]
        ranked_by = _objective_name(request)
    return Plan(
        device=device.name, device_bytes=device.usable_bytes,
        gpus_per_node=device.gpus_per_node, intra_node_bytes_per_s=intra,
        inter_node_bytes_per_s=inter, link_efficiency=link_efficiency, link_source=link_source,
        micro_batch_samples=facts.samples, micro_batch_tokens=facts.tokens, blocks=facts.blocks,
        experts=facts.experts,
        tensor_parallel_pairs=max((u.row_gemms for u in facts.units if _is_block(u.name)),
                                  default=0),
        ranked_by=ranked_by, layouts=tuple(layouts), considered=considered,
        dropped=tuple(d for _, d in sorted(dropped, key=lambda x: x[0])[:DROPPED_SHOWN]),
        dropped_by_reason=dict(sorted(reasons.items())), assumptions=assumptions,
        tokens=request.tokens, price_per_gpu_hour=request.price_per_gpu_hour,
    )


def _search(facts: ModelFacts, request: PlanRequest, device: Links
            ) -> tuple[list[PlanLayout], list[tuple[int, DroppedLayout]], Counter[str], int]:
    fitting: list[PlanLayout] = []
    dropped: list[tuple[int, DroppedLayout]] = []
    reasons: Counter[str] = Counter()
    seen: set[str] = set()
    considered = 0
    for item in candidates(facts, request, device.gpus_per_node):
        if isinstance(item, DroppedLayout):
            considered += 1
            reasons[item.reason.split(" (")[0].split(" of ")[0]] += 1
            dropped.append((1 << 62, item))
            continue
        if request.routing is not None and item.ep > 1:     # the router is the run's
            item = replace(item, routing=request.routing)
        resolved, peak = resolve_auto(facts, item, device)
        if resolved.label in seen:
            continue        # ckpt=auto settled on no recompute, or on full recompute
        seen.add(resolved.label)
        considered += 1
        if peak <= device.usable_bytes:     # only a layout that fits is timed
            fitting.append(estimate_resolved(facts, item, resolved, device, request.tokens,
                                             request.price_per_gpu_hour))
        else:
            reasons["does not fit"] += 1
            dropped.append((peak - device.usable_bytes, DroppedLayout(
                resolved.label, "does not fit", needed_bytes=peak)))
    fitting.sort(key=lambda layout: _objective(layout, request))
    return fitting, dropped, reasons, considered


def _objective_name(request: PlanRequest) -> str:
    if request.price_per_gpu_hour is not None:
        return "cost of the run" if request.tokens else "cost per token"
    return "time of the run" if request.tokens else "time per token"


def _objective(layout: PlanLayout, request: PlanRequest) -> tuple[float, int]:
    """Lower is better: GPU-seconds (× price) per sample, or the whole run's wall time."""
    t = layout.time
    work = t.tokens_per_step or t.samples_per_step
    if request.price_per_gpu_hour is not None:
        value = t.step_s * layout.gpus / work if work else math.inf
    else:
        value = t.step_s / work if work else math.inf
    return value, layout.gpus
