"""The quantization room's rule-facing API: the small types the engine shares with
`fxlens.rules.quant` (and rule packs), and ``@risk_rule``.

Only types live here (no torch maths), so rules can import them without importing the engine.
A risk rule is a handler ``LayerView -> RiskMatch | None`` declared with
``@risk_rule("QNT00n")``; its docstring is the only text users see (title, why, ``Fix:``;
format: `fxlens.analyzer.core.coded`), and `risk` turns a match into the `Risk` a layer carries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fxlens.analyzer.core.coded import CodedRule
from fxlens.analyzer.core.costs import declare_coded

if TYPE_CHECKING:
    import torch
    from torch import nn


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
    position: float = 0.0      # where its first application runs: 0 first … 1 last layer


@dataclass(frozen=True)
class Risk:
    """A structural risk rule's finding for one layer."""

    code: str
    message: str        # what (the rule's docstring title)
    fix: str            # why it matters, then how to fix it (the docstring's body)
    detail: str = ""    # what matched for this layer


@dataclass(frozen=True)
class RiskMatch:
    """A risk rule's hit on one layer: what matched, in this layer's terms (may be empty)."""

    detail: str = ""


RiskHandler = Callable[[LayerView], RiskMatch | None]
RiskRule = CodedRule[RiskHandler]
FAMILY = "risk"


def risk_rule(code: str) -> Callable[[RiskHandler], RiskHandler]:
    """Declare the decorated handler as the structural risk rule `code`; a duplicate code is
    refused naming both sites. Rules are applied, and their risks listed, by code."""
    return declare_coded(FAMILY, code)


def risk(rule: RiskRule, match: RiskMatch) -> Risk:
    """The `Risk` a rule's match puts on a layer; the text is the rule's docstring.

    NB: ``fix`` is the why and the fix joined, as the reports have always shown it."""
    doc = rule.doc
    return Risk(code=rule.code, message=doc.title, fix=f"{doc.why} {doc.fix()}".strip(),
                detail=match.detail)


class NumberFormatLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def bits(self) -> int: ...

    def fake_quantize(self, weight: torch.Tensor, axis: int) -> torch.Tensor: ...

    def storage_bytes(self, shape: tuple[int, ...], axis: int) -> int: ...


@dataclass(frozen=True)
class QuantKnowledge:
    """What the engine needs from the rules."""

    formats: Mapping[str, NumberFormatLike]
    channel_axis: Callable[[nn.Module], int | None]
    risks: Callable[[LayerView], tuple[Risk, ...]]
    # (stats, fan_in, fan_out, layer type, the model's initializer_range) → reason or None
    random_init_reason: Callable[[WeightStats, int, int, str, float | None], str | None]
    activation_format: Callable[[Any], NumberFormatLike]
    stop_ops: frozenset[str]
    residual_ops: frozenset[str]
    embedding_types: tuple[str, ...]
    risk_penalty_db: float = 1.0
    extra_formats: Mapping[str, NumberFormatLike] = field(default_factory=dict)
    # layer types whose output, returned as is by the model, is read as logits (calibration)
    logit_layer_types: tuple[str, ...] = ("Linear", "Conv1D")
    # risk codes whose layers a plan keeps at 8 bits or more
    keep_8_bits: frozenset[str] = frozenset()
    # a format is "ok" for a layer at ≥ [0] dB SQNR, "risky" at ≥ [1], else "keep higher"
    verdict_db: tuple[float, float] = (30.0, 20.0)
    # (parameter name, channel axis) of each weight matrix a module holds itself
    weight_matrices: Callable[[nn.Module], Sequence[tuple[str, int]]] | None = None
    batch_norm_types: tuple[str, ...] = ()
    foldable_types: tuple[str, ...] = ()         # layer types a following batch norm folds into
    propagation_db: float = 0.0                   # weights-only prior: first vs last layer
    role_db: float = 0.0                          # weights-only prior: first, embedding, head
    # the input-channel axis of a layer's weight (None: no input channels to weight), and the
    # ops a channel's scale passes through unchanged up to its factor (`quant.links`)
    input_axis: Callable[[nn.Module], int | None] | None = None
    homogeneous_ops: frozenset[str] = frozenset()
    layout_ops: frozenset[str] = frozenset()
    # what evaluate()'s metrics mean: which fall as they improve, and how far (relative) a
    # quantized model may move them before its verdict changes (`quant.task`)
    lower_is_better: Callable[[str], bool] = lambda _: False
    task_tolerance: float = 0.01


@dataclass(frozen=True)
class PlanRequest:
    name: str
    ladder: tuple[str, ...]
    activations: str
    budget_bytes: int | None
    keep_below_db: float
    fill_budget: bool
    nominal_sqnr_db: Mapping[str, float]    # for layers without real weights
