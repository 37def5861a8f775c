"""The small types the quantization engine shares with `fxlens.rules.quant`.

Only types live here (no torch maths), so rules can import them without importing the engine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WeightStats:
    """Statistics of one weight tensor; kurtosis is Pearson's (a Gaussian has 3)."""

    numel: int
    mean: float
    std: float
    absmax: float
    max_over_std: float
    kurtosis: float
    outlier_channel_share: float   # channels whose max|w| exceeds OUTLIER_RATIO × the median


@dataclass(frozen=True)
class LayerView:
    """What the risk rules see of one quantizable layer: where its output goes in the graph.

    `feeds` holds the op packets (``aten.softmax``; attention arguments as
    ``aten.scaled_dot_product_attention:query``) its output reaches before the next weighted
    layer, a softmax or a norm. `residual_max_over_std` is known only after calibration.
    """

    name: str
    module_type: str
    feeds: frozenset[str] = frozenset()
    is_first: bool = False
    is_last: bool = False
    feeds_residual: bool = False
    residual_max_over_std: float | None = None


@dataclass(frozen=True)
class Risk:
    """A structural risk rule's finding for one layer."""

    code: str
    message: str        # what and why (the rule's docstring summary)
    fix: str
    detail: str = ""    # what matched for this layer
