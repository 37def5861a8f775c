"""The small types the memory room shares with `fxlens.rules` (KV cache layouts).

Only types live here, so rules can import them without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVLayer:
    """The cached layout of one attention layer."""

    name: str
    kv_heads: int
    k_head_dim: int
    v_head_dim: int
    window: int | None = None      # sliding window: at most this many tokens are cached


@dataclass(frozen=True)
class KVLayout:
    layers: tuple[KVLayer, ...]
    dtype_bytes: float
    source: str                    # "config" or "graph"
