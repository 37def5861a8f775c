"""Serving estimates: throughput, latency and capacity on a device (``serve``)."""

from __future__ import annotations

from dataclasses import dataclass

from fxlens.analyzer.core.codec import optional
from fxlens.analyzer.core.section import Section, section


@dataclass(frozen=True)
class ServePoint:
    """A batch of `batch` requests served together (`fxlens.analyzer.serve.estimate`)."""

    batch: int
    ttft_s: float                  # the batch's prefill: time to the first token
    tpot_s: float                  # mean decode step: time per output token after the first
    latency_s: float               # a request, first token to last
    output_tokens_per_s: float     # the batch's output tokens over its latency (all GPUs)
    fits: bool                     # its KV cache fits the memory left (≤ max_batch)
    # the same number of requests kept in flight by an in-flight batcher (steady state)
    inflight_tokens_per_s: float = 0.0
    inflight_tpot_s: float = 0.0


@dataclass(frozen=True)
class ServeMaxLoad:
    """In-flight batching at maximum load (`fxlens.analyzer.serve.inflight`): as many requests
    in flight as the KV cache and the engine's caps allow, prefills sharing steps with
    decodes."""

    requests: float                # in flight
    decodes_per_step: float
    prompt_tokens_per_step: float
    step_s: float                  # mean step: the time per output token
    output_tokens_per_s: float     # all GPUs
    bound: str                     # "requests" (the KV cache), "max_num_seqs", "max_num_tokens"
    max_num_tokens: int | None = optional()    # the engine's caps (None: no cap)
    max_num_seqs: int | None = optional()


@section("serve")
@dataclass(frozen=True)
class Serve(Section):
    """``--serve``: prefill, decode steps, capacity and the throughput-latency curve of a
    decoder LM on a device (`fxlens.analyzer.serve`). The top-level figures are those of the
    headline point (`batch`): the best under ``--tpot-slo``, else the largest asked batch that
    fits, else `max_batch`."""

    device: str
    input_len: int
    output_len: int
    batch: int
    ttft_s: float
    tpot_s: float
    latency_s: float
    output_tokens_per_s: float
    max_batch: int
    device_bytes: int
    usable_bytes: int              # the share of the device an engine plans with
    weights_bytes: int
    workspace_bytes: int           # one prompt's prefill activations
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int     # input + output tokens, rounded up to whole blocks
    block_tokens: int
    block_waste_bytes: int         # per sequence: the last block's unused tokens
    curve: tuple[ServePoint, ...]
    tpot_slo_s: float | None
    layers: int
    decode_bytes_per_step: int     # at batch 1, mid-request context: weights + cache read
    prefill_flops_per_request: float
    notes: tuple[str, ...]
    tp: int = 1                     # GPUs of the tensor-parallel group (memory figures per GPU)
    max_load: ServeMaxLoad | None = optional()
    weights_format: str = ""        # how the linear layers' weights are stored ("": as loaded)
    context_bytes: int = 0          # the process outside PyTorch's allocator (CUDA context)
    kv_window_tokens: int = 0       # sliding layers cache at most this many tokens (0: none)
    attention_dp: bool = False      # the tp GPUs run attention data-parallel, experts split
