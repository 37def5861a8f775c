"""The memory sections: the eager forward's activations (``memory``), the KV cache
(``kv_cache``) and whether inference fits a device (``inference_fit``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fxlens.analyzer.core.codec import optional
from fxlens.analyzer.core.section import Section, section
from fxlens.analyzer.core.sections.training import FixOption

# --- memory ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveTensor:
    """One storage live at the peak, described by the output that allocated it."""

    node: int
    module: str
    target: str
    bytes: int
    shape: tuple[int, ...]
    dtype: str
    category: str = "activation"


@dataclass(frozen=True)
class EagerPeak:
    """The eager forward's activation peak, simulated on fake tensors (None: it failed)."""

    peak_bytes: int | None
    peak_op: str | None = optional()
    error: str | None = optional()


@section("memory")
@dataclass(frozen=True)
class Memory(Section):
    """Liveness of the captured graph: resident bytes, the activation peak and its make-up."""

    lifetimes: str
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    peak_activation_bytes: int
    peak_node: int | None
    peak_module: str
    timeline: tuple[int, ...]
    live_at_peak: tuple[LiveTensor, ...]
    live_at_peak_count: int
    peak_by_category: Mapping[str, int] = field(default_factory=dict)
    at_peak_by_category: Mapping[str, int] = field(default_factory=dict)
    peak_by_phase: Mapping[str, int] = field(default_factory=dict)
    allocated_by_module: Mapping[str, int] = field(default_factory=dict)
    live_at_peak_by_module: Mapping[str, int] = field(default_factory=dict)
    eager: EagerPeak | None = optional()

    @property
    def activation_peak_bytes(self) -> int:
        """The peak a user running PyTorch eagerly sees: the simulated eager peak when there
        is one, else the graph executor's (tensors freed at their last use)."""
        if self.eager is not None and self.eager.peak_bytes is not None:
            return self.eager.peak_bytes
        return self.peak_activation_bytes

# --- KV cache ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVLayerBytes:
    name: str
    kv_heads: int
    k_head_dim: int
    v_head_dim: int
    tokens: int
    bytes: int
    kind: str = "attention"      # "state": a fixed state per sequence; "none": shares K, V
    state_bytes: int = 0         # of `bytes`, the fixed state of every sequence in the batch


@dataclass(frozen=True)
class DecodeStep:
    """Memory of one decode step: weights + the whole cache + one token's activations."""

    weights_bytes: int
    kv_cache_bytes: int
    activation_bytes: int
    total_bytes: int


@section("kv_cache")
@dataclass(frozen=True)
class KVCache(Section):
    batch: int
    context: int
    dtype_bytes: float
    source: str
    total_bytes: int
    layers: tuple[KVLayerBytes, ...]
    decode_step: DecodeStep


@section("inference_fit")
@dataclass(frozen=True)
class InferenceFit(Section):
    """Whether the inference forward fits the roofline device: weights + the activation peak
    (+ the KV cache of the whole batch) against `device_bytes`; when it does not, `fixes`
    that do (`fxlens.analyzer.fixes.inference`), and with a KV cache the decode step's total
    (`decode_bytes`), which serving the batch holds once its prompts are in."""

    device: str
    device_bytes: int
    needed_bytes: int
    weights_bytes: int
    batch: int | None = optional()
    fixes: tuple[FixOption, ...] = ()
    decode_bytes: int | None = optional()

    @property
    def judged(self) -> bool:
        """Whether there is a verdict: the device has a memory figure."""
        return self.device_bytes > 0

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.device_bytes
