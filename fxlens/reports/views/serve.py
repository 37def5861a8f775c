"""View of the serving section (`Serve`): the answer in one line — how many requests of
this size are served at once, at what throughput, time per token and time to first token —
then the curve over batch sizes and where the memory goes.

Throughput is output tokens per second of the whole batch (every GPU); TPOT the mean time
between a request's output tokens after the first; TTFT the batch's prefill; a batch past
`max_batch` does not fit its KV cache and is marked so. Beside each static batch, the same
number of requests kept in flight by an in-flight batcher; and the in-flight batcher at
maximum load, with the engine caps it was planned with.
"""

from __future__ import annotations

from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import Serve, ServeMaxLoad, ServePoint
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
    blocks: list[Block] = [curve_table(serve), curve_chart(serve)]
    if serve.max_load is not None:
        blocks.append(max_load_table(serve.max_load, serve))
    blocks.append(memory_table(serve))
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
    per = " on its GPU" if serve.attention_dp else " per GPU" if serve.tp > 1 else ""
    room = (f"up to {serve.max_batch} fit (KV {binary_bytes(serve.kv_bytes_per_sequence)} "
            f"per request{per})" if serve.max_batch else
            "no request fits: the weights and one prefill leave no room for its KV cache")
    tone = Tone.GOOD if head.fits and serve.max_batch else Tone.BAD
    return Figure(f"serving on {_gpus(serve)}", f"{serve.output_tokens_per_s:,.0f} tok/s",
                  f"{what}; {room}", tone)


def curve_table(serve: Serve) -> Table:
    rows = [(Cell(str(p.batch), Tone.STRONG if p.batch == serve.batch else Tone.PLAIN),
             f"{p.output_tokens_per_s:,.0f}", _ms(p.tpot_s), seconds(p.ttft_s),
             seconds(p.latency_s), f"{p.inflight_tokens_per_s:,.0f}",
             _ms(p.inflight_tpot_s), _fits(p, serve)) for p in serve.curve]
    return Table.of(
        f"serving · {serve.input_len}+{serve.output_len} tokens per request · {_gpus(serve)}",
        (Column("batch", right=True), Column("output tok/s", right=True),
         Column("TPOT", right=True), Column("TTFT", right=True),
         Column("request", right=True), Column("in flight tok/s", right=True),
         Column("in flight TPOT", right=True), Column("fits")), rows,
        caption="a batch's requests prefilled together, then decoded together (static "
                "batching); output tok/s: the batch's output tokens over a request's time; "
                "TPOT: mean time per output token after the first; TTFT: the batch's "
                "prefill; in flight: as many requests kept in flight by an in-flight "
                "batcher, prefills sharing steps with decodes (steady state)")


def max_load_table(load: ServeMaxLoad, serve: Serve) -> Table:
    """The in-flight batcher at maximum load and what bounds it."""
    caps = {"requests": "the KV cache", "max_num_seqs": "--max-num-seqs",
            "max_num_tokens": "--max-num-tokens"}
    rows = [
        ("output tokens/s", f"{load.output_tokens_per_s:,.0f}"),
        ("requests in flight",
         f"{load.requests:,.1f} (bounded by {caps.get(load.bound, load.bound)})"),
        ("per step", f"{load.decodes_per_step:,.1f} decode tokens, "
                     f"{load.prompt_tokens_per_step:,.0f} prompt tokens"),
        ("time per output token", _ms(load.step_s)),
        ("engine caps", f"{_cap(load.max_num_tokens)} tokens per step, "
                        f"{_cap(load.max_num_seqs)} requests"),
    ]
    return Table.of(f"in-flight batching at maximum load · {_gpus(serve)}",
                    (Column("", strong=True), Column("")), rows, show_header=False,
                    caption="steady state: each step decodes every request past its prefill "
                            "and prefills new prompts (chunked to the token cap) with the "
                            "weights read once; requests of one length, no scheduler time")


def _cap(value: int | None) -> str:
    return f"{value:,}" if value is not None else "no cap"


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
        ("weights", binary_bytes(serve.weights_bytes)
         + (f" ({serve.weights_format})" if serve.weights_format else "")),
        ("prefill workspace", f"{binary_bytes(serve.workspace_bytes)} (one prompt)"),
        *([("CUDA context", binary_bytes(serve.context_bytes))] if serve.context_bytes else []),
        ("KV cache per token", binary_bytes(serve.kv_bytes_per_token)),
        ("KV cache per request", f"{binary_bytes(serve.kv_bytes_per_sequence)} "
                                 f"({serve.block_tokens}-token blocks{waste}"
                                 + (f"; sliding layers hold their last "
                                    f"{serve.kv_window_tokens:,} tokens"
                                    if serve.kv_window_tokens else "") + ")"),
        ("requests at once", str(serve.max_batch)
         + (f" ({serve.max_batch // serve.tp} a GPU)" if serve.attention_dp else "")),
        ("decode step, batch 1", f"reads {binary_bytes(serve.decode_bytes_per_step)}"),
    ]
    title = "serving memory" + (" · per GPU" if serve.tp > 1 else "")
    return Table.of(title, (Column("", strong=True), Column("")), rows,
                    show_header=False)


def _gpus(serve: Serve) -> str:
    """``h100``, ``4× h100 (TP 4)``, or ``8× h200 (attention DP 8, experts EP 8)``."""
    if serve.tp <= 1:
        return serve.device
    layout = (f"attention DP {serve.tp}, experts EP {serve.tp}" if serve.attention_dp
              else f"TP {serve.tp}")
    return f"{serve.tp}× {serve.device} ({layout})"


def _fits(point: ServePoint, serve: Serve) -> Cell:
    if point.fits:
        return Cell("yes", Tone.GOOD)
    return Cell(f"no (> {serve.max_batch})", Tone.BAD)


def _ms(value: float) -> str:
    return f"{value * 1e3:.1f} ms" if value < 1 else seconds(value)
