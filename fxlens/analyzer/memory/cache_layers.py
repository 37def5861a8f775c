"""What each layer of a `transformers` decoder keeps between decode steps, read from the cache
the library itself builds.

A hybrid model's layers cache different things: softmax attention keeps K and V for every
context token (capped at the window in sliding-window and chunked layers); linear attention
(gated DeltaNet, lightning attention), Mamba's scans and short convolutions keep a state of
fixed size per sequence — a recurrent state and a convolution's last inputs — however long the
context; a layer that reuses another's K and V (Gemma 3n's shared layers) keeps nothing.

`layers_from_cache` lets the library answer: it runs one token of one sequence through the
model with ``use_cache=True`` on fake tensors (small real ones where fake tensors cannot go),
so the model builds the cache its eager generation uses (per layer the class for that layer's
kind), and reads each layer of the returned cache: K and V of one token give the bytes per token
(heads × (d_k + d_v)), a sliding layer's ``sliding_window`` its cap, a state layer's tensors
(``conv_states``, ``recurrent_states``, in the dtype the model keeps them) its bytes per
sequence. None when the model has no such cache or the run fails; the caller then reads the
config (`fxlens.rules.kv_layouts`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from fxlens.analyzer.capture.as_eager import libraries_as_eager
from fxlens.analyzer.capture.fake_runs import fake_then_real
from fxlens.analyzer.memory.types import KVLayer

log = logging.getLogger(__name__)

STATE_ATTRIBUTES = ("conv_states", "recurrent_states")
CACHE_OUTPUTS = ("cache", "past_key_values", "cache_params")   # new name first


def layers_from_cache(module: torch.nn.Module, token_ids: torch.Tensor) -> list[KVLayer] | None:
    """Each decoder layer's cache as `KVLayer`s (see the module docstring); `token_ids` a
    (batch, seq) id tensor of the example inputs, cut here to one token of one sequence."""
    def run(real_or_fake: torch.nn.Module, state: dict[str, torch.Tensor],
            args: tuple[Any, ...], kwargs: dict[str, Any], fake_mode: Any) -> Any:
        with torch.no_grad(), libraries_as_eager():
            out = torch.func.functional_call(real_or_fake, state, args, kwargs)
        return next((getattr(out, name) for name in CACHE_OUTPUTS
                     if getattr(out, name, None) is not None), None)

    try:
        cache, _ = fake_then_real(module, (), {"input_ids": token_ids[:1, :1],
                                               "use_cache": True}, run)
    except Exception as error:  # the report falls back to the config; say why in the log
        log.info("one cached decode token did not run: %s", error)
        return None
    cached = getattr(cache, "layers", None)
    if not cached:
        log.info("the model returned no layered cache (%s)", type(cache).__name__)
        return None
    extra = _per_layer_states(cache, len(cached))
    layers = [_layer(f"layer {i}", layer, extra[i]) for i, layer in enumerate(cached)]
    return layers if any(layer.kind != "none" for layer in layers) else None


def _per_layer_states(cache: Any, count: int) -> list[int]:
    """Bytes of the states a cache holds beside its layers, in lists indexed by layer
    (MiniMax keeps its lightning attention's K·V state so: ``linear_cache``)."""
    extra = [0] * count
    for value in vars(cache).values():
        if isinstance(value, list) and 0 < len(value) <= count and any(
                _tensors(v) for v in value):
            for i, item in enumerate(value):
                extra[i] += _bytes(_tensors(item))
    return extra


def token_ids_in(inputs: Any) -> torch.Tensor | None:
    """The example inputs' (batch, seq) token ids: ``input_ids`` when named so, else the
    first 2-D integer tensor."""
    if isinstance(inputs, dict) and isinstance(inputs.get("input_ids"), torch.Tensor):
        return inputs["input_ids"]
    leaves = list(inputs.values()) if isinstance(inputs, dict) else list(inputs)
    return next((t for t in leaves if isinstance(t, torch.Tensor) and t.dim() == 2
                 and not t.is_floating_point() and t.dtype != torch.bool), None)


def _layer(name: str, layer: Any, extra_state: int) -> KVLayer:
    """K and V of one token (attention), the state tensors (a scan's), or both (Zamba2's
    hybrid layers); nothing when the layer keeps nothing of its own."""
    state = extra_state + _bytes([t for attribute in STATE_ATTRIBUTES
                                  for t in _tensors(getattr(layer, attribute, None))])
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.numel():
        window = getattr(layer, "sliding_window", None)
        return KVLayer(name, keys.shape[1], keys.shape[-1], values.shape[-1],
                       int(window) if window else None, state_bytes=state)
    return KVLayer(name, 0, 0, 0, kind="state" if state else "none", state_bytes=state)


def _bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []
