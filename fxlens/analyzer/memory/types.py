"""The small types the memory room shares with `fxlens.rules` (KV cache layouts).

Only types live here, so rules can import them without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVLayer:
    """What one decoder layer keeps between decode steps: K and V per context token
    (``kind`` "attention"), a state of fixed size per sequence ("state": linear attention,
    a scan, a short convolution), or nothing ("none": it reuses another layer's K and V)."""

    name: str
    kv_heads: int
    k_head_dim: int
    v_head_dim: int
    window: int | None = None      # sliding window: at most this many tokens are cached
    kind: str = "attention"
    state_bytes: int = 0           # "state": bytes per sequence, in the dtype the model keeps


@dataclass(frozen=True)
class KVLayout:
    layers: tuple[KVLayer, ...]
    dtype_bytes: float
    source: str                    # "config" or "graph"
