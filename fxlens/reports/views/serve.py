"""View of the serving section (`Serve`): the answer in one line — how many requests of
this size are served at once, at what throughput, time per token and time to first token —
then the curve over batch sizes and where the memory goes.

Throughput is output tokens per second of the whole batch (every GPU); TPOT the mean time
between a request's output tokens after the first; TTFT the batch's prefill; a batch past
`max_batch` does not fit its KV cache and is marked so.
"""

from __future__ import annotations

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Serve, ServePoint
from fxlens.reports.units import binary_bytes, seconds
from fxlens.reports.view import (
    Block,
    Cell,
    Chart,
    Column,
    Detail,
    Figure,
    Mark,
    Series,
    Table,
    Tone,
    View,
)


def serve_view(report: Report, detail: Detail) -> View | None:
    serve = report.get(Serve)
    if serve is None:
        return None
    blocks: list[Block] = [curve_table(serve), curve_chart(serve), memory_table(serve)]
    if serve.notes:
        blocks.append(Table.of("serving: notes", (Column("note"),),
                               [(note,) for note in serve.notes]))
    return View("serve", "Serving", tuple(blocks))


def serve_verdict(serve: Serve) -> Figure:
    """``serving on h100 | 1,995 tok/s | 64 requests of 2048+128 tokens at once: 12.5 ms per
    token, first token 3.0 s; up to 213 fit``."""
    head = next(p for p in serve.curve if p.batch == serve.batch)
    what = (f"{serve.batch} request{'s' * (serve.batch != 1)} of {serve.input_len}+"
            f"{serve.output_len} tokens at once: {_ms(serve.tpot_s)} per token, first token "
            f"{seconds(serve.ttft_s)}")
    if serve.tpot_slo_s is not None:
        met = head.tpot_s <= serve.tpot_slo_s
        what += (f" (the most throughput within the {_ms(serve.tpot_slo_s)} target)" if met
                 else f" — no batch meets the {_ms(serve.tpot_slo_s)} target")
    per = " per GPU" if serve.tp > 1 else ""
    room = (f"up to {serve.max_batch} fit (KV {binary_bytes(serve.kv_bytes_per_sequence)} "
            f"per request{per})" if serve.max_batch else
            "no request fits: the weights and one prefill leave no room for its KV cache")
    tone = Tone.GOOD if head.fits and serve.max_batch else Tone.BAD
    return Figure(f"serving on {_gpus(serve)}", f"{serve.output_tokens_per_s:,.0f} tok/s",
                  f"{what}; {room}", tone)


def curve_table(serve: Serve) -> Table:
    rows = [(Cell(str(p.batch), Tone.STRONG if p.batch == serve.batch else Tone.PLAIN),
             f"{p.output_tokens_per_s:,.0f}", _ms(p.tpot_s), seconds(p.ttft_s),
             seconds(p.latency_s), _fits(p, serve)) for p in serve.curve]
    return Table.of(
        f"serving · {serve.input_len}+{serve.output_len} tokens per request · {_gpus(serve)}",
        (Column("batch", right=True), Column("output tok/s", right=True),
         Column("TPOT", right=True), Column("TTFT", right=True),
         Column("request", right=True), Column("fits")), rows,
        caption="a batch's requests prefilled together, then decoded together (static "
                "batching); output tok/s: the batch's output tokens over a request's time; "
                "TPOT: mean time per output token after the first; TTFT: the batch's prefill")


def curve_chart(serve: Serve) -> Chart:
    """Throughput against time per token, one point per batch that fits (HTML)."""
    fitting = [p for p in serve.curve if p.fits] or list(serve.curve)
    head = next(p for p in serve.curve if p.batch == serve.batch)
    return Chart("throughput against time per output token", "time per output token",
                 "output tokens/s", "s", "tok/s",
                 (Series("batches that fit", tuple((p.tpot_s, p.output_tokens_per_s)
                                                   for p in fitting)),),
                 (Mark(f"batch {head.batch}", head.tpot_s, head.output_tokens_per_s),),
                 caption="each point a batch size of the table, smallest on the left: "
                         "more requests at once buy throughput with time per token")


def memory_table(serve: Serve) -> Table:
    waste = (f", {binary_bytes(serve.block_waste_bytes)} unused in the last block"
             if serve.block_waste_bytes else "")
    rows = [
        ("planned with", f"{binary_bytes(serve.usable_bytes)} of "
                         f"{binary_bytes(serve.device_bytes)} (the engine's share)"),
        ("weights", binary_bytes(serve.weights_bytes)),
        ("prefill workspace", f"{binary_bytes(serve.workspace_bytes)} (one prompt)"),
        ("KV cache per token", binary_bytes(serve.kv_bytes_per_token)),
        ("KV cache per request", f"{binary_bytes(serve.kv_bytes_per_sequence)} "
                                 f"({serve.block_tokens}-token blocks{waste})"),
        ("requests at once", str(serve.max_batch)),
        ("decode step, batch 1", f"reads {binary_bytes(serve.decode_bytes_per_step)}"),
    ]
    title = "serving memory" + (" · per GPU" if serve.tp > 1 else "")
    return Table.of(title, (Column("", strong=True), Column("")), rows,
                    show_header=False)


def _gpus(serve: Serve) -> str:
    """``h100``, or ``4× h100 (TP 4)``."""
    return f"{serve.tp}× {serve.device} (TP {serve.tp})" if serve.tp > 1 else serve.device


def _fits(point: ServePoint, serve: Serve) -> Cell:
    if point.fits:
        return Cell("yes", Tone.GOOD)
    return Cell(f"no (> {serve.max_batch})", Tone.BAD)


def _ms(value: float) -> str:
    return f"{value * 1e3:.1f} ms" if value < 1 else seconds(value)
