"""Terminal tables: Report → rich renderables. Pure: the CLI decides where they are printed.

FLOPs and parameter counts use SI prefixes (G = 10⁹), bytes binary ones (GiB = 2³⁰); the
summary says so.
"""

from __future__ import annotations

from collections import defaultdict

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from fxlens.analyzer.core.graph import ancestors
from fxlens.analyzer.core.report import ModuleReport, Report
from fxlens.analyzer.core.sections import KVCache, Memory, Training
from fxlens.reports.fusion_terminal import fusion_parts
from fxlens.reports.quant_terminal import quant_parts
from fxlens.reports.roofline_terminal import roofline_parts
from fxlens.reports.units import binary_bytes, percent, si


def render_terminal(report: Report, depth: int = 2, top: int = 10) -> RenderableType:
    parts: list[RenderableType] = [summary(report), module_tree(report, depth),
                                   top_ops(report, top)]
    training, memory, cache = report.get(Training), report.get(Memory), report.get(KVCache)
    if training is not None:
        parts.append(training_tables(training, depth))
    elif memory is not None:
        parts.append(memory_table(memory, top))
    if cache is not None:
        parts.append(kv_cache_table(cache))
    parts.extend(roofline_parts(report, depth, top))
    parts.extend(fusion_parts(report, top))
    parts.extend(quant_parts(report, top))
    return Group(*parts)


def columns_table(title: str, text: tuple[str, ...], figures: tuple[str, ...]) -> Table:
    """A titled table: `text` columns left-aligned, then `figures` columns right-aligned."""
    table = Table(title=title, title_justify="left")
    for name in text:
        table.add_column(name, justify="left")
    for name in figures:
        table.add_column(name, justify="right")
    return table


def kv_cache_table(cache: KVCache) -> Table:
    table = columns_table(
        f"KV cache · batch {cache.batch} · context {cache.context} "
        f"· {cache.dtype_bytes} B/element (layout from {cache.source})",
        ("layers",), ("kv heads × head dim", "tokens", "bytes per layer"))
    groups: dict[tuple[int, int, int, int], list[str]] = defaultdict(list)
    for layer in cache.layers:
        groups[(layer.kv_heads, layer.k_head_dim, layer.tokens, layer.bytes)].append(layer.name)
    for (heads, dim, tokens, size), names in groups.items():
        label = names[0] if len(names) == 1 else f"{len(names)} layers ({names[0]} …)"
        table.add_row(label, f"{heads} × {dim}", str(tokens), binary_bytes(size))
    table.add_row(Text("total", style="bold"), "", "",
                  Text(binary_bytes(cache.total_bytes), style="bold"))
    step = cache.decode_step
    table.caption = (f"decode step: weights {binary_bytes(step.weights_bytes)} + cache "
                     f"{binary_bytes(step.kv_cache_bytes)} + one token's activations "
                     f"{binary_bytes(step.activation_bytes)} = "
                     f"{binary_bytes(step.total_bytes)}")
    return table


def memory_table(memory: Memory, top: int) -> Table:
    """Inference memory: resident bytes, the activation peak and what is live there."""
    table = Table(title="memory (inference)", title_justify="left")
    table.add_column("what")
    table.add_column("bytes", justify="right")
    table.add_column("where")
    table.add_row("parameters", binary_bytes(memory.param_bytes), "")
    table.add_row("buffers", binary_bytes(memory.buffer_bytes), "")
    table.add_row("inputs", binary_bytes(memory.input_bytes), "")
    table.add_row(Text("activation peak", style="bold"),
                  Text(binary_bytes(memory.peak_activation_bytes), style="bold"),
                  f"node {memory.peak_node} in {memory.peak_module or '(root)'}"
                  " (graph executor)")
    eager = memory.eager
    if eager is not None and eager.peak_bytes is not None:
        table.add_row("eager peak", binary_bytes(eager.peak_bytes),
                      f"after {eager.peak_op} (eager, simulated)")
    for live in memory.live_at_peak[:top]:
        table.add_row(f"  live: {live.target}", binary_bytes(live.bytes),
                      f"{live.module or '(root)'} {tuple(live.shape)} {live.dtype}")
    return table


def training_tables(training: Training, depth: int) -> Group:
    return Group(_step_summary(training), _state_by_module(training, depth))


def _step_summary(training: Training) -> Table:
    table = Table(title=f"training step · {training.precision} · {training.optimizer}",
                  show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column()
    step = training.step_flops
    for label, flops in (("forward", training.forward_flops),
                         ("backward", training.backward_flops),
                         ("optimizer", training.optimizer_flops)):
        table.add_row(f"{label} FLOPs", si(flops), percent(flops, step))
    table.add_row("step FLOPs", si(step), "")
    states = training.states
    for label, size in (("weights", states.weights_bytes), ("master weights", states.master_bytes),
                        ("gradients", states.grad_bytes),
                        ("optimizer state", states.optimizer_bytes),
                        ("buffers", states.buffer_bytes)):
        table.add_row(label, binary_bytes(size), "")
    table.add_row("saved activations", binary_bytes(training.saved_activation_bytes),
                  "autograd's saved tensors, each storage once")
    breakdown = training.peak_breakdown
    table.add_row(Text("step peak", style="bold"),
                  Text(binary_bytes(training.step_peak_bytes), style="bold"),
                  f"persistent {binary_bytes(breakdown.persistent_bytes)} + forward/backward "
                  f"peak {binary_bytes(breakdown.fwd_bwd_peak_bytes)}")
    ckpt = training.checkpointing
    if ckpt is not None:
        table.add_row("checkpointing", binary_bytes(ckpt.memory_saved_bytes),
                      f"saved over {len(ckpt.blocks)} blocks for "
                      f"+{si(ckpt.recompute_flops)}FLOPs ({ckpt.flops_overhead:.0%})")
    fit = training.fit
    if fit is not None:
        verdict = Text("fits", style="bold green") if fit.fits else Text(
            "does not fit", style="bold red")
        table.add_row(f"on {fit.device}", verdict,
                      f"headroom {binary_bytes(fit.headroom_bytes)}, "
                      f"largest batch {fit.largest_batch}")
    return table


def _state_by_module(training: Training, depth: int) -> Table:
    table = columns_table(f"training memory by module (depth ≤ {depth})", ("module",),
                          ("weights", "grads", "optimizer", "master", "saved act."))
    saved: dict[str, int] = defaultdict(int)
    for entry in training.saved_by_module:
        for path in ancestors(entry.module):
            saved[path] += entry.bytes
    for path, state in training.states.by_module.items():
        level = len(ancestors(path)) - 1
        if level > depth:
            continue
        table.add_row("  " * level + (path.rsplit(".", 1)[-1] if path else "(root)"),
                      binary_bytes(state.weights_bytes), binary_bytes(state.grad_bytes),
                      binary_bytes(state.optimizer_bytes), binary_bytes(state.master_bytes),
                      binary_bytes(saved[path]))
    return table


def summary(report: Report) -> Table:
    model, totals = report.model, report.totals
    table = Table(title=f"fxlens · {model.name}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("source", model.source)
    table.add_row("capture", model.capture_method)
    for note in model.capture_notes:
        table.add_row("", Text(note, style="dim"))
    table.add_row("parameters", f"{si(model.params)} ({binary_bytes(model.param_bytes)})"
                  + (f", buffers {binary_bytes(model.buffer_bytes)}" if model.buffers else ""))
    table.add_row("forward FLOPs", f"{si(totals.flops, 'FLOP')}  ({si(totals.macs, 'MAC')})")
    table.add_row("bytes moved", f"read {binary_bytes(totals.bytes_read)}, "
                  f"written {binary_bytes(totals.bytes_written)}")
    table.add_row("coverage", _coverage_text(report))
    table.caption = "1 MAC = 2 FLOPs · SI prefixes for counts, binary (KiB…) for bytes"
    return table


def _coverage_text(report: Report) -> Text:
    coverage = report.coverage
    text = Text(f"{coverage.ratio:.1%} of ops: {coverage.costed} costed, {coverage.free} free")
    if coverage.unsupported:
        listed = ", ".join(f"{op} ×{n}" for op, n in coverage.unsupported.items())
        text.append(f"; unsupported: {listed}", style="bold red")
    if coverage.failed:
        text.append(f"; rule failures: {', '.join(coverage.failed)}", style="bold red")
    return text


def module_tree(report: Report, depth: int) -> Table:
    total = report.totals.flops
    table = columns_table(f"modules (depth ≤ {depth})", ("module", "type"),
                          ("params", "FLOPs", "share"))
    for module in _tree_order(report.modules, depth):
        label = module.path.rsplit(".", 1)[-1] if module.path else "(root)"
        table.add_row("  " * module.depth + label, module.type.rsplit(".", 1)[-1],
                      si(module.params), si(module.flops), percent(module.flops, total))
    return table


def _tree_order(modules: tuple[ModuleReport, ...], depth: int) -> list[ModuleReport]:
    """Depth-first, children in execution order, without recursion."""
    children: dict[str, list[ModuleReport]] = defaultdict(list)
    root = None
    for module in modules:
        if module.path == "":
            root = module
        elif module.depth <= depth:
            children[module.path.rpartition(".")[0]].append(module)
    ordered: list[ModuleReport] = []
    stack = [root] if root else []
    while stack:
        module = stack.pop()
        ordered.append(module)
        stack.extend(reversed(children.get(module.path, [])))
    return ordered


def top_ops(report: Report, top: int) -> Table:
    total = report.totals.flops
    table = columns_table(f"top {top} ops by FLOPs", ("op",),
                          ("calls", "FLOPs", "share", "bytes moved"))
    for op in report.by_op()[:top]:
        table.add_row(op.target, str(op.calls), si(op.flops), percent(op.flops, total),
                      binary_bytes(op.bytes_moved))
    return table
