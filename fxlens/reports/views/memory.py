"""Views of the memory sections: inference memory, the training step, the KV cache."""

from __future__ import annotations

from collections import defaultdict

from fxlens.analyzer.core.graph import ancestors
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import KVCache, KVLayerBytes, Memory, Training
from fxlens.reports.units import binary_bytes, percent, short_op, si
from fxlens.reports.view import Cell, Column, Detail, Table, Tone, View, columns
from fxlens.reports.views.tree import Node as TreeNode
from fxlens.reports.views.tree import grouped_rows


def memory_view(report: Report, detail: Detail) -> View | None:
    """Inference memory: resident bytes, the activation peak and what is live there. A
    training report shows its memory in the training view instead."""
    top = detail.top
    memory = report.get(Memory)
    if memory is None or report.get(Training) is not None:
        return None
    rows: list[tuple[str | Cell, ...]] = [
        ("parameters", binary_bytes(memory.param_bytes), ""),
        ("buffers", binary_bytes(memory.buffer_bytes), ""),
        ("inputs", binary_bytes(memory.input_bytes), ""),
    ]
    graph_peak = (binary_bytes(memory.peak_activation_bytes),
                  f"node {memory.peak_node} in {memory.peak_module or '(root)'}")
    eager = memory.eager
    if eager is not None and eager.peak_bytes is not None:     # the headline's figure first
        rows += [(Cell("activation peak", Tone.STRONG),
                  Cell(binary_bytes(eager.peak_bytes), Tone.STRONG),
                  "eager forward (simulated)"
                  + (f", after {short_op(eager.peak_op)}" if eager.peak_op else "")),
                 ("graph-executor peak", *graph_peak)]
    else:
        rows.append((Cell("activation peak", Tone.STRONG), Cell(graph_peak[0], Tone.STRONG),
                     f"{graph_peak[1]} (graph executor)"))
    rows += [(f"  live: {short_op(live.target)}", binary_bytes(live.bytes),
              f"{live.module or '(root)'} {tuple(live.shape)} {live.dtype}")
             for live in memory.live_at_peak[:top]]
    table = Table.of("memory (inference)",
                     (Column("what"), Column("bytes", right=True), Column("where")), rows)
    return View("memory", "Memory", (table,))


def training_view(report: Report, detail: Detail) -> View | None:
    training = report.get(Training)
    if training is None:
        return None
    tables = [step_summary(training)]
    if detail.full:
        tables.append(state_by_module(training, detail.depth))
    return View("training", "Training step", tuple(tables))


def step_summary(training: Training) -> Table:
    step = training.step_flops
    rows: list[tuple[str | Cell, ...]] = [
        (f"{label} FLOPs", si(flops), percent(flops, step))
        for label, flops in (("forward", training.forward_flops),
                             ("backward", training.backward_flops),
                             ("optimizer", training.optimizer_flops))]
    rows.append(("step FLOPs", si(step), ""))
    states = training.states
    rows += [(label, binary_bytes(size), "")
             for label, size in (("weights", states.weights_bytes),
                                 ("master weights", states.master_bytes),
                                 ("gradients", states.grad_bytes),
                                 ("optimizer state", states.optimizer_bytes),
                                 ("buffers", states.buffer_bytes))]
    rows.append(("saved activations", binary_bytes(training.saved_activation_bytes),
                 "autograd's saved tensors, each storage once"))
    breakdown = training.peak_breakdown
    what, size = breakdown.on_top
    rows.append((Cell("step peak", Tone.STRONG),
                 Cell(binary_bytes(training.step_peak_bytes), Tone.STRONG),
                 f"persistent {binary_bytes(breakdown.persistent_bytes)} + {what} "
                 f"{binary_bytes(size)}"))
    ckpt = training.checkpointing
    if ckpt is not None:
        rows.append(("checkpointing", binary_bytes(ckpt.memory_saved_bytes),
                     f"saved over {len(ckpt.blocks)} blocks for "
                     f"+{si(ckpt.recompute_flops)}FLOPs ({ckpt.flops_overhead:.0%})"))
    fit = training.fit
    if fit is not None:
        verdict = Cell("fits", Tone.GOOD) if fit.fits else Cell("does not fit", Tone.BAD)
        rows.append((f"on {fit.device}", verdict,
                     f"headroom {binary_bytes(fit.headroom_bytes)}, "
                     f"largest batch {fit.largest_batch}"))
    return Table.of(f"training step · {training.recipe}",
                    (Column("", strong=True), Column("", right=True), Column("")), rows,
                    show_header=False)


def state_by_module(training: Training, depth: int) -> Table:
    saved: dict[str, int] = defaultdict(int)
    for entry in training.saved_by_module:
        for path in ancestors(entry.module):
            saved[path] += entry.bytes
    nodes = [TreeNode(path, "", (s.weights_bytes, s.grad_bytes, s.optimizer_bytes,
                                 s.master_bytes, saved[path]))
             for path, s in training.states.by_module.items()]
    rows = [(r.label, *(binary_bytes(f) for f in r.figures)) for r in grouped_rows(nodes, depth)]
    return Table.of(f"training memory by module (depth ≤ {depth})",
                    columns(("module",), ("weights", "grads", "optimizer", "master",
                                          "saved act.")), rows)


def _kept(layer: KVLayerBytes) -> str:
    """What a layer keeps between decode steps: K and V heads, a fixed state, or nothing."""
    if layer.kind == "none":
        return "nothing (reuses another layer's K, V)"
    if layer.kind == "state":
        return "fixed state per sequence"
    dims = (f"{layer.k_head_dim}" if layer.k_head_dim == layer.v_head_dim
            else f"{layer.k_head_dim}+{layer.v_head_dim}")
    kv = f"K, V: {layer.kv_heads} heads × {dims}"
    return kv + (f" + state {binary_bytes(layer.state_bytes)}" if layer.state_bytes else "")


def kv_cache_view(report: Report, detail: Detail) -> View | None:
    cache = report.get(KVCache)
    if cache is None:
        return None
    groups: dict[tuple[str, str, int], list[str]] = defaultdict(list)
    for layer in cache.layers:
        groups[(_kept(layer), str(layer.tokens) if layer.kind == "attention" else "—",
                layer.bytes)].append(layer.name)
    rows: list[tuple[str | Cell, ...]] = [
        (names[0] if len(names) == 1 else f"{len(names)} layers ({names[0]} …)",
         kept, tokens, binary_bytes(size))
        for (kept, tokens, size), names in groups.items()]
    rows.append((Cell("total", Tone.STRONG), "", "",
                 Cell(binary_bytes(cache.total_bytes), Tone.STRONG)))
    step = cache.decode_step
    caption = (f"decode step: weights {binary_bytes(step.weights_bytes)} + cache "
               f"{binary_bytes(step.kv_cache_bytes)} + one token's activations "
               f"{binary_bytes(step.activation_bytes)} = {binary_bytes(step.total_bytes)}")
    table = Table.of(f"KV cache · batch {cache.batch} · context {cache.context} "
                     f"· {cache.dtype_bytes} B/element (layout from {cache.source})",
                     columns(("layers",), ("keeps", "tokens", "bytes per layer")),
                     rows, caption=caption)
    return View("kv-cache", "KV cache", (table,))
