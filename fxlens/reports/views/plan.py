"""View of the ``plan`` section: layouts over many GPUs, the first one taken apart, and why
the others were dropped. `plan_verdict` is its line on the first screen."""

from __future__ import annotations

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Plan, PlanLayout, PlanTime
from fxlens.reports.units import binary_bytes, seconds, si
from fxlens.reports.view import Cell, Column, Detail, Figure, Table, Tone, View, columns

HOST_BOUND = 0.1    # the share of a step waiting for the host that the verdict names

DAY_S = 86400


def plan_view(report: Report, detail: Detail) -> View | None:
    plan = report.get(Plan)
    if plan is None:
        return None
    tables = [_layouts(plan)]
    if plan.layouts:
        first = plan.layouts[0]
        tables += [_memory(first, plan), _time(first), _transfers(first)]
    if plan.dropped:
        tables.append(_dropped(plan, detail.top))
    if detail.full:
        tables.append(Table.of("plan assumptions", (Column("assumed"),),
                               [(a,) for a in plan.assumptions]
                               + [(f"link bandwidths: {plan.link_source}",)]))
    return View("plan", "Plan (many GPUs)", tuple(tables))


def _layouts(plan: Plan) -> Table:
    """One row per layout; a whole run (``--tokens``) trades throughput and MFU (both in the
    headline) for days and cost, so the table stays readable at 80 columns. A column every row
    agrees on (the GPU count of a fixed ``--gpus``, "fits" when all fit) moves to the title."""
    run = plan.tokens is not None
    cost = plan.price_per_gpu_hour is not None
    counts = {layout.gpus for layout in plan.layouts}
    all_fit = all(layout.fits for layout in plan.layouts)
    heads = (["GPUs"] if len(counts) > 1 else []) + ([] if all_fit else ["fits"])
    heads += ["peak/GPU", "step"]
    heads += (["run days", "cost" if cost else "GPU-hours"] if run else
              ["tokens/s" if plan.micro_batch_tokens else "samples/s", "MFU"])
    rows = []
    for layout in plan.layouts:
        t = layout.time
        row: list[str | Cell] = [layout.strategy]
        if len(counts) > 1:
            row.append(str(layout.gpus))
        if not all_fit:
            row.append(Cell("yes", Tone.GOOD) if layout.fits else Cell("no", Tone.BAD))
        row += [binary_bytes(layout.memory.peak_bytes), seconds(t.step_s)]
        if run:
            days = f"{layout.run.wall_s / DAY_S:.1f}" if layout.run else "-"
            money = (f"${si(layout.run.cost)}" if layout.run and layout.run.cost is not None
                     else si(layout.run.gpu_hours) if layout.run else "-")
            row += [days, money]
        else:
            rate = t.tokens_per_s if plan.micro_batch_tokens else (
                t.samples_per_step / t.step_s if t.step_s else 0.0)
            row += [si(rate), f"{t.mfu:.1%}"]
        rows.append(tuple(row))
    what = ("requested layout" if plan.ranked_by == "requested"
            else f"best of {plan.considered} layouts by {plan.ranked_by}")
    agreed = ([f"{counts.pop()} GPUs"] if len(counts) == 1 else []) + (
        ["all fit"] if all_fit and plan.layouts else [])
    what += "".join(f" · {part}" for part in agreed)
    caption = (f"{plan.gpus_per_node} GPUs per node; links per GPU "
               f"{si(plan.intra_node_bytes_per_s, 'B/s')} in a node, "
               f"{si(plan.inter_node_bytes_per_s, 'B/s')} across. "
               + (f"{plan.blocks} repeated blocks, {plan.tensor_parallel_pairs} tensor-"
                  f"parallel pairs per block found in the graph" if plan.blocks else
                  "no repeated blocks, so no pipeline stages")
               + (f", {plan.experts} experts per MoE layer" if plan.experts else "")
               + f". {plan.assumptions[0]}"
               + ("; no run: the inputs hold no token tensor" if plan.tokens is not None
                  and not plan.micro_batch_tokens else "")
               + "; every assumption under --full and in the JSON.")
    return Table.of(f"plan · {plan.device} ({binary_bytes(plan.device_bytes)} usable) · {what}",
                    columns(("layout",), tuple(heads)), rows, caption=caption)


def _memory(layout: PlanLayout, plan: Plan) -> Table:
    m = layout.memory
    rows: list[tuple[str | Cell, ...]] = [
        (label, binary_bytes(value)) for label, value in (
            ("weights", m.weights_bytes), ("gradients", m.gradients_bytes),
            ("master weights", m.master_bytes), ("optimizer state", m.optimizer_bytes),
            ("buffers", m.buffers_bytes), ("saved activations", m.activations_bytes),
            ("temporaries", m.temporaries_bytes), ("unsharded weights and gradients (ZeRO-3)",
                                                   m.gathered_bytes),
            ("communication buffers", m.communication_bytes)) if value]
    rows.append((Cell("peak", Tone.STRONG), Cell(binary_bytes(m.peak_bytes), Tone.STRONG)))
    if m.host_bytes:
        rows.append(("in host memory (offloaded)", binary_bytes(m.host_bytes)))
    verdict = (f"fits, {binary_bytes(layout.headroom_bytes)} free" if layout.fits else
               f"{binary_bytes(-layout.headroom_bytes)} over")
    return Table.of(f"memory per GPU · {layout.strategy} · stage {m.stage} "
                    f"({verdict} of {binary_bytes(plan.device_bytes)} usable)",
                    (Column("what"), Column("bytes", right=True)), rows)


def _time(layout: PlanLayout) -> Table:
    t = layout.time
    tp_hidden = t.tensor_parallel_exposed_s is not None
    rows: list[tuple[str | Cell, ...]] = [
        (label, seconds(value)) for label, value in (
            ("compute (all micro-batches)", t.compute_s),
            ("tensor-parallel transfers" + (", exposed" if tp_hidden else ""),
             t.tensor_parallel_s if t.tensor_parallel_exposed_s is None
             else t.tensor_parallel_exposed_s),
            ("context-parallel transfers, exposed (cp)", t.context_parallel_s),
            ("expert all-to-alls, exposed", t.expert_parallel_exposed_s),
            ("compute slowed by hidden transfers' SMs", t.overlap_slowdown_s),
            ("GPUs waiting for the host's kernel launches", t.host_wait_s),
            ("pipeline transfers", t.pipeline_s), ("pipeline bubble", t.bubble_s),
            ("gradient / ZeRO transfers, exposed", t.data_parallel_exposed_s),
            ("optimizer step", t.optimizer_s)) if value]
    rows.append((Cell("step", Tone.STRONG), Cell(seconds(t.step_s), Tone.STRONG)))
    caption = (f"{layout.micro_batches} micro-batches per step, {si(t.samples_per_step)} "
               f"samples ({si(t.tokens_per_step)} tokens); gradient/ZeRO transfers take "
               f"{seconds(t.data_parallel_s)} in all, hidden behind compute where they can be"
               + (f"; expert all-to-alls {seconds(t.expert_parallel_s)} in all"
                  if t.expert_parallel_s > t.expert_parallel_exposed_s else "")
               + (f"; tensor-parallel transfers {seconds(t.tensor_parallel_s)} in all, "
                  "beside their GEMMs (tp-overlap)" if tp_hidden else "")
               + _host_note(t) + _compression_note(t) + _recompute_note(layout))
    return Table.of(f"step time · {layout.strategy}", (Column("what"),
                    Column("time", right=True)), rows, caption=caption)


def _host_bound(t: PlanTime) -> str:
    """The verdict's word on a step the host's launches decide (a tenth of it or more)."""
    if t.step_s <= 0 or t.host_wait_s < HOST_BOUND * t.step_s:
        return ""
    return f"; host-bound, {t.host_wait_s / t.step_s:.0%} waits for launches (graphs)"


def _host_note(t: PlanTime) -> str:
    """The host's launches, said where they set the pace (a floor under each micro-batch)."""
    if t.host_wait_s <= 0:
        return ""
    return (f"; the host launches the kernels in {seconds(t.host_s)}, longer than the GPUs "
            "run them: CUDA graphs (graphs, graphs=attn+…) or larger micro-batches lift it")


def _recompute_note(layout: PlanLayout) -> str:
    """The compute's forward, backward and recompute, and what ckpt=auto chose."""
    t = layout.time
    parts = []
    if t.forward_s > 0:
        parts += [f"{seconds(t.forward_s)} forward",
                  f"{seconds(t.compute_s - t.forward_s - t.recompute_s)} backward"]
    chosen = "; what ckpt=auto chose, the least that fits" if layout.recompute_auto else ""
    if t.recompute_s > 0:
        parts.append(f"{seconds(t.recompute_s)} recompute ({t.recompute_s / t.step_s:.1%} of "
                     f"the step{chosen})")
    note = f". Compute: {', '.join(parts)}" if parts else ""
    if layout.recompute_auto and t.recompute_s <= 0:
        note += ". ckpt=auto: nothing recomputed, it fits as it is"
    return note


def _compression_note(t: PlanTime) -> str:
    if t.uncompressed_exposed_s is None or t.uncompressed_data_parallel_s is None:
        return ""
    if t.uncompressed_exposed_s <= 0:
        return (f". Compression does not pay here: uncompressed, the gradient/ZeRO transfers "
                f"({seconds(t.uncompressed_data_parallel_s)}) were already hidden behind "
                f"compute; it only adds its buffers and its error")
    return (f". Compression cuts the exposed gradient/ZeRO transfers from "
            f"{seconds(t.uncompressed_exposed_s)} to {seconds(t.data_parallel_exposed_s)}")


def _transfers(layout: PlanLayout) -> Table:
    rows = [(c.cause, c.kind, f"{c.group} {'across nodes' if c.across_nodes else 'in a node'}",
             binary_bytes(c.bytes), str(c.calls), seconds(c.time_s),
             "yes" if c.overlapped else "no")
            for c in layout.collectives]
    return Table.of(f"transfers per step per GPU · {layout.strategy}",
                    columns(("cause", "kind", "GPUs"), ("per call", "calls", "time", "hidden")),
                    rows, caption="hidden: overlapped with compute, up to the compute's length")


def _dropped(plan: Plan, top: int) -> Table:
    rows = [(d.strategy, d.reason if d.needed_bytes is None else
             f"needs {binary_bytes(d.needed_bytes)} per GPU of "
             f"{binary_bytes(plan.device_bytes)} usable") for d in plan.dropped[:top]]
    reasons = ", ".join(f"{n} {reason}" for reason, n in plan.dropped_by_reason.items())
    return Table.of(f"dropped layouts ({sum(plan.dropped_by_reason.values())}: {reasons})",
                    (Column("layout"), Column("why")), rows)


def plan_verdict(plan: Plan) -> Figure:
    """Does it fit, on how many GPUs, how fast: the first layout, or why none fits."""
    if not plan.layouts:
        return Figure(f"plan on {plan.device}", "no layout fits",
                      f"{plan.considered} layouts tried; more GPUs, a larger device "
                      f"(--device) or a smaller micro-batch (--batch)", Tone.BAD)
    first = plan.layouts[0]
    t = first.time
    run = (f"; run {first.run.wall_s / DAY_S:.1f} days, {si(first.run.gpu_hours)} GPU-hours"
           + (f", ${si(first.run.cost)}" if first.run.cost is not None else "")
           if first.run is not None else "")
    summary = (f"{first.strategy}: {binary_bytes(first.memory.peak_bytes)} per GPU of "
               f"{binary_bytes(plan.device_bytes)} usable; step {seconds(t.step_s)}, MFU "
               f"{t.mfu:.1%}{run}{_host_bound(t)}")
    label = f"plan: {first.gpus}× {plan.device}"
    if first.fits:
        return Figure(label, "fits", summary, Tone.GOOD)
    better = next((layout for layout in plan.layouts[1:] if layout.fits), None)
    fix = (f"; fits as {better.strategy} ({binary_bytes(better.memory.peak_bytes)} per GPU, "
           f"step {seconds(better.time.step_s)})" if better is not None else
           f"; nothing fits on {first.gpus} GPUs: more GPUs (--search --max-gpus)")
    return Figure(label, "does not fit", summary + fix, Tone.BAD)
