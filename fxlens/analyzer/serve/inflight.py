"""In-flight (continuous) batching in its steady state: how an engine serves requests of
`input_len` + `output_len` tokens when `requests` of them are in flight, and at maximum load.

The engine (TensorRT-LLM's in-flight batcher; vLLM's scheduler with chunked prefill) runs one
step after another; each step decodes one token for every request past its prefill and
prefills new prompts, or chunks of them, with what is left of two caps (`Engine`):
``max_num_tokens`` tokens per step (decode and prompt tokens together) and ``max_num_seqs``
requests in flight. A request is in flight for O steps: the step that prefills its prompt
(and gives its first token) and O − 1 decode steps. In the steady state, with r requests
admitted per step, Little's law gives R = r·O requests in flight, r·(O − 1) decode tokens and
r·I prompt tokens per step, so

    r = min(R_asked / O, max_num_seqs / O, max_num_tokens / (I + O − 1))

(R_asked: the requests the client keeps in flight, or at maximum load the most the KV cache
holds, each with its whole I + O reserved as TensorRT-LLM's "guaranteed no evict" policy
does). Prompts come whole while they fit the step's token budget — one every 1/r steps when
r < 1, r per step otherwise — and in chunks when they do not: a share f of the steps runs
``c`` prompt tokens with the decodes (`mixed.mixed_s`, the shared weights read once), the
rest decode only. Decoding requests sit at every point of their output: their mean context is
I + (O − 2)/2, and attention's work is linear in it, so the mean step is exact.
Throughput = r·O tokens per step over the mean step time; the time per output token is the
mean step time.
NB: no scheduler or sampling time between steps; requests all of one length. A sliding-window
layer's kernels see min(mean context, window), not the mean of min(context, window): exact
unless the requests' contexts straddle the window (`fxlens.analyzer.serve.windows`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fxlens.analyzer.serve.mixed import mixed_s
from fxlens.analyzer.serve.steps import Steps
from fxlens.analyzer.time.roofline import Device


@dataclass(frozen=True)
class Engine:
    """The in-flight batcher's caps: tokens per step, requests in flight (the defaults users
    get are TensorRT-LLM's: `fxlens.rules.serving.MAX_NUM_TOKENS`)."""

    max_num_tokens: float = math.inf
    max_num_seqs: float = math.inf


@dataclass(frozen=True)
class SteadyState:
    requests: float            # in flight
    decodes: float             # decode tokens per step (mean)
    prompt_tokens: float       # prompt tokens per step (mean)
    step_s: float              # mean step: the time per output token
    output_tokens_per_s: float
    bound: str                 # the cap: "requests", "max_num_seqs" or "max_num_tokens"


def steady_state(steps: Steps, device: Device, input_len: int, output_len: int,
                 requests: float, engine: Engine) -> SteadyState:
    """The steady state with at most `requests` in flight (the module docstring)."""
    i, o = input_len, output_len
    caps = {"requests": requests / o, "max_num_seqs": engine.max_num_seqs / o,
            "max_num_tokens": engine.max_num_tokens / (i + o - 1)}
    bound = min(caps, key=lambda k: caps[k])
    rate = caps[bound]
    if rate <= 0:
        return SteadyState(0.0, 0.0, 0.0, 0.0, 0.0, bound)
    decodes = rate * (o - 1)
    context = i + max(o - 2, 0) / 2
    chunk = min(max(rate, 1.0) * i, engine.max_num_tokens - decodes)   # prompt tokens
    share = rate * i / chunk                       # of the steps that run prompt tokens
    decode_only = float(steps.decode_s(device, decodes, [context])[0]) if decodes else 0.0
    mixed = mixed_s(steps, device, decodes, context, chunk / i, i)
    step = share * mixed + (1 - share) * decode_only
    return SteadyState(rate * o, decodes, rate * i, step, rate * o / step if step else 0.0,
                       bound)
