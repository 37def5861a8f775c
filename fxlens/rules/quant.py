"""Quantization knowledge: which layers carry quantizable weights, the number formats, what a
default random initialisation looks like, the precision plans and the structural risk rules.

Layers: ``nn.Linear``, ``nn.Conv{1,2,3}d``, ``nn.ConvTranspose{1,2,3}d``, ``nn.Embedding``,
``nn.EmbeddingBag`` and `transformers`' ``Conv1D`` (GPT-2, weight stored ``(in, out)``). The
*channel axis* is the weight axis of output channels (one scale per entry along it): dim 0 for
linear, conv and embedding rows, dim 1 for transposed convs and ``Conv1D``.
Every other weight matrix is a candidate too (`weight_matrices`): the recurrent matrices of
``nn.GRU``/``nn.LSTM``/``nn.RNN`` (``weight_ih_l0``, ``weight_hh_l0``, ``weight_hr_l0``, gates
stacked along dim 0), ``nn.MultiheadAttention``'s ``in_proj_weight``, and any parameter of two
or more dimensions a custom module holds (position tables, class tokens), rows on dim 0.

Formats (`fxlens.rules.quant_formats`; weights, symmetric, round to nearest, scales stored in
fp16 = 2 bytes):
- ``int8_per_channel``: one scale per output channel, ``Δ = max|w_c| / 127``;
- ``int8_per_tensor``: one scale for the tensor;
- ``int4_g128``: one scale per group of ``group_size`` (128, configurable) consecutive weights
  along the reduction dimension of each output channel (a channel shorter than a group is one
  group); ``Δ = max|w_g| / 7``;
- ``fp8_e4m3``: cast to ``float8_e4m3fn`` after a per-tensor scale mapping ``max|w|`` to 448
  (the format's largest finite value), scale in fp32;
- ``bf16``: the 16-bit reference a plan keeps sensitive layers in (no scale).

NB: symmetric integer grids use ``[-(2^(b-1) - 1), 2^(b-1) - 1]`` (no zero point, as most
weight-only kernels); asymmetric grids would gain about a bit on skewed channels.

Activations (``--activations``): int8 per tensor, static scale from the calibration absmax
(fp8 e4m3 for the fp8 format).

Risk rules (``@risk_rule("QNT00n")``) read a `LayerView` and return a `RiskMatch` (with what
matched for this layer) or None; their docstrings (title: what; then why; then ``Fix:``) are
the only text reports and ``analyze explain QNT00n`` show. `RISK_RULES` maps this module's
codes to their handlers; `knowledge(registry=...)` applies a registry's (with any pack's).

Rule-facing API used: `fxlens.analyzer.core` and `fxlens.analyzer.quant.types`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from fxlens.analyzer.core.costs import CostRegistry, declared_coded
from fxlens.analyzer.quant.types import (
    FAMILY,
    LayerView,
    PlanRequest,
    QuantKnowledge,
    Risk,
    RiskHandler,
    RiskMatch,
    RiskRule,
    WeightStats,
    risk,
    risk_rule,
)
from fxlens.rules.quant_formats import (
    BF16,
    DEFAULT_GROUP_SIZE,
    activation_format,
    formats,
)
from fxlens.rules.task_metrics import TASK_TOLERANCE, lower_is_better

# --- layers ----------------------------------------------------------------------------------

_AXIS_BY_TYPE: tuple[tuple[type[nn.Module], int], ...] = (
    (nn.Linear, 0), (nn.Conv1d, 0), (nn.Conv2d, 0), (nn.Conv3d, 0),
    (nn.ConvTranspose1d, 1), (nn.ConvTranspose2d, 1), (nn.ConvTranspose3d, 1),
    (nn.Embedding, 0), (nn.EmbeddingBag, 0),
)
_AXIS_BY_NAME = {"Conv1D": 1}   # transformers.pytorch_utils.Conv1D: y = x @ W, W (in, out)
EMBEDDING_TYPES = ("Embedding", "EmbeddingBag")
# NB: a model output that is the very tensor one of these returned (a classifier or LM head,
# class axis last) is read as logits by calibration's ``auto`` metric (KL of the softmax).
# Convolutions are left out: their class axis (dim 1) is not the last.
LOGIT_LAYER_TYPES = ("Linear", "Conv1D")


def channel_axis(module: nn.Module) -> int | None:
    """The output-channel axis of `module`'s weight, or None if it is not a quantizable layer."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() < 2:
        return None
    for kind, axis in _AXIS_BY_TYPE:
        if isinstance(module, kind):
            return axis
    return _AXIS_BY_NAME.get(type(module).__name__)


def weight_matrices(module: nn.Module) -> list[tuple[str, int]]:
    """(parameter name, output-channel axis) of every weight matrix `module` holds itself (its
    children's are theirs): its ``weight`` when it is a known layer, else every floating
    parameter of two or more dimensions, rows on the first axis longer than 1."""
    axis = channel_axis(module)
    if axis is not None:
        return [("weight", axis)]
    if any(isinstance(module, kind) for kind, _ in _AXIS_BY_TYPE):
        return []                 # a known layer whose weight is not a matrix (none today)
    out = []
    for name, param in module.named_parameters(recurse=False):
        if param.dim() >= 2 and param.is_floating_point():
            out.append((name, next((i for i, n in enumerate(param.shape) if n > 1), 0)))
    return out


_INPUT_AXIS_BY_TYPE: tuple[tuple[type[nn.Module], int], ...] = (
    (nn.Linear, 1), (nn.Conv1d, 1), (nn.Conv2d, 1), (nn.Conv3d, 1),
    (nn.ConvTranspose1d, 0), (nn.ConvTranspose2d, 0), (nn.ConvTranspose3d, 0),
)


def input_axis(module: nn.Module) -> int | None:
    """The input-channel axis of `module`'s weight (conv groups: `groups` blocks along it), or
    None where the layer has no input channels to weight (embeddings, recurrent matrices)."""
    if channel_axis(module) is None:
        return None
    for kind, axis in _INPUT_AXIS_BY_TYPE:
        if isinstance(module, kind):
            return axis
    return {"Conv1D": 0}.get(type(module).__name__)


BATCH_NORM_TYPES = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm")
# NB: a batch norm directly after one of these folds into its weight (per output channel)
FOLDABLE_TYPES = ("Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
                  "ConvTranspose3d")


# --- op sets the structure walk looks for (overload packets; attention args as "op:arg") ------

SOFTMAX_OPS = frozenset({
    "aten._softmax", "aten.softmax", "aten._safe_softmax", "aten._log_softmax",
    "aten.log_softmax",
    "aten.scaled_dot_product_attention:query", "aten.scaled_dot_product_attention:key",
    "aten._scaled_dot_product_flash_attention_for_cpu:query",
    "aten._scaled_dot_product_flash_attention_for_cpu:key",
})
NORM_OPS = frozenset({
    "aten.layer_norm", "aten.native_layer_norm", "aten.rms_norm", "aten._fused_rms_norm",
    "aten.group_norm", "aten.native_group_norm", "aten.batch_norm",
    "aten._native_batch_norm_legit_no_training", "aten.native_batch_norm",
    "aten.instance_norm",
})
EXP_DIV_OPS = frozenset({
    "aten.exp", "aten.exp2", "aten.expm1", "aten.div", "aten.reciprocal", "aten.rsqrt",
    "aten.log", "aten.pow", "aten.sigmoid", "aten.tanh",
})
RESIDUAL_OPS = frozenset({"aten.add", "aten.add_", "aten.sub"})
STOP_OPS = SOFTMAX_OPS | NORM_OPS   # the walk records them and does not look past them
# NB: positively homogeneous and channel by channel, f(s·x) = s·f(x) for s > 0: scaling a
# layer's output channel by s scales what the next layer reads on that channel by s, so the
# weights-only prior weights the next layer's input channels by the feeding layer's scales
# through them (and function-preserving rescaling across them is possible). GELU, SiLU, tanh,
# norms and anything with a shift are not (`fxlens.analyzer.quant.links`).
POSITIVELY_HOMOGENEOUS_OPS = frozenset(f"aten.{name}" for name in (
    "relu", "relu_", "leaky_relu", "leaky_relu_", "prelu", "_prelu_kernel", "dropout",
    "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices",
    "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d", "avg_pool3d",
    "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
    "_adaptive_avg_pool2d", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "adaptive_max_pool3d",
))
# shape ops a channel keeps its identity through (the link checks the channel's position)
LAYOUT_OPS = frozenset(f"aten.{name}" for name in (
    "view", "_unsafe_view", "reshape", "flatten", "unsqueeze", "squeeze", "clone",
    "contiguous", "alias", "detach",
))

# --- precision plans -------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanSpec:
    """A plan: the ladder of formats from the cheapest up; sensitive layers climb it."""

    name: str
    ladder: tuple[str, ...]       # format names, cheapest first; "bf16" is the top
    activations: str              # "int8" or "16-bit"


def plan_spec(name: str, group_size: int = DEFAULT_GROUP_SIZE) -> PlanSpec:
    g = f"int4_g{group_size}"
    plans = {
        "w8a8": PlanSpec("w8a8", ("int8_per_channel", "bf16"), "int8"),
        "w4a16": PlanSpec("w4a16", (g, "int8_per_channel", "bf16"), "16-bit"),
        "auto": PlanSpec("auto", (g, "fp8_e4m3", "int8_per_channel", "bf16"), "16-bit"),
    }
    try:
        return plans[name]
    except KeyError:
        raise ValueError(f"unknown quantization plan {name!r}; known: "
                         f"{', '.join(plans)}") from None


# Risks whose fix says "at least 8 bits": a plan starts such a layer at its first 8-bit rung.
KEEP_8_BITS = frozenset({"QNT001", "QNT003", "QNT004", "QNT005"})

# NB: a layer whose predicted output SQNR is below this is kept higher even without a budget;
# 30 dB (error power 0.1 % of the signal) is about where one layer starts moving top-1 results.
KEEP_BELOW_DB = 30.0
# NB: below this a format is not just risky but a layer to keep higher (1 % error power).
KEEP_HIGHER_DB = 20.0

# --- random initialisation -------------------------------------------------------------------

# NB: default inits. nn.Linear/Conv: kaiming_uniform(a=√5) = U(±1/√fan_in), kurtosis 1.8;
# nn.Embedding: N(0, 1); transformers: N(0, 0.02) (initializer_range). A Gaussian has
# kurtosis 3; trained weights drift to heavier tails (MiniLM: 4–30).
INIT_STD_TOLERANCE = 0.05
# NB: below this many weights the sample kurtosis is too noisy (se √(24/n) > 0.1) to tell a
# Gaussian init from trained weights; a small trained stem matched Xavier's std by chance.
GAUSSIAN_TEST_MIN_NUMEL = 2048


def default_gaussian_stds(module_type: str, initializer_range: float | None
                          ) -> dict[str, float]:
    """The Gaussian inits a freshly built layer of this type has: N(0, 1) for an embedding
    (PyTorch's default) and N(0, initializer_range) inside a `transformers` model (its
    ``_init_weights``). PyTorch's linear and conv layers default to a uniform, tested apart;
    Lecun, He or Xavier are no module's default, so a trained weight near them is not refused.
    """
    stds = {"N(0,1)": 1.0} if module_type in ("Embedding", "EmbeddingBag") else {}
    if initializer_range:
        stds[f"N(0,{initializer_range:g})"] = float(initializer_range)
    return stds


def random_init_reason(stats: WeightStats, fan_in: int, fan_out: int, module_type: str = "",
                       initializer_range: float | None = None) -> str | None:
    """Why the weight looks like the layer's own default initialisation, or None if it does not.

    Test: kurtosis within 4 standard errors (√(24/n)) of a uniform's 1.8 with ``max|w|`` at
    most ``1/√fan_in`` (PyTorch's default for linear and conv layers), or of a Gaussian's 3.0
    with a mean near 0 and a std within 5 % of the layer type's default Gaussian
    (`default_gaussian_stds`), for weights of at least `GAUSSIAN_TEST_MIN_NUMEL` elements.
    """
    tolerance = max(0.1, 4 * math.sqrt(24 / max(stats.numel, 1)))
    bound = 1 / math.sqrt(max(fan_in, 1))
    if abs(stats.kurtosis - 1.8) <= tolerance and stats.absmax <= bound * 1.0001:
        return f"uniform ±1/√fan_in (kurtosis {stats.kurtosis:.2f}, max {stats.absmax:.3g})"
    if (stats.numel < GAUSSIAN_TEST_MIN_NUMEL or abs(stats.kurtosis - 3.0) > tolerance
            or abs(stats.mean) > 0.1 * stats.std):
        return None
    for name, std in default_gaussian_stds(module_type, initializer_range).items():
        if abs(stats.std / std - 1) <= INIT_STD_TOLERANCE:
            return f"Gaussian {name} (kurtosis {stats.kurtosis:.2f}, std {stats.std:.3g})"
    return None


# --- structural risk rules -------------------------------------------------------------------

# NB: a residual stream whose max|x| exceeds this many stds holds outlier features (LLM.int8
# reports 6σ-plus features from 6.7B parameters on); per-tensor activation scales then fail.
RESIDUAL_OUTLIER_RATIO = 20.0


@risk_rule("QNT001")
def feeds_softmax(layer: LayerView) -> RiskMatch | None:
    """Feeds a softmax (attention scores): errors are exponentiated.

    Softmax turns additive logit errors into multiplicative ones, and query/key projections set
    the scores' scale.

    Fix: Keep these layers at 8 bits, or quantize with per-channel scales.
    """
    hits = sorted(layer.feeds & SOFTMAX_OPS)
    return RiskMatch(", ".join(hits)) if hits else None


@risk_rule("QNT002")
def feeds_norm(layer: LayerView) -> RiskMatch | None:
    """Feeds a normalisation: its statistics shift with the error.

    A norm divides by the statistics of its input, so a biased error moves every output.

    Fix: Prefer per-channel scales; check its calibrated SQNR before going below 8 bits.
    """
    hits = sorted(layer.feeds & NORM_OPS)
    return RiskMatch(", ".join(hits)) if hits else None


@risk_rule("QNT003")
def feeds_exp_or_division(layer: LayerView) -> RiskMatch | None:
    """Feeds an exponential, a division or a saturating function.

    exp, division and rsqrt amplify relative errors where their input is large (exp) or small
    (division).

    Fix: Keep the layer at 8 bits or measure it with --calibrate.
    """
    hits = sorted(layer.feeds & EXP_DIV_OPS)
    return RiskMatch(", ".join(hits)) if hits else None


@risk_rule("QNT004")
def first_layer(layer: LayerView) -> RiskMatch | None:
    """First layer: it sees raw inputs, and its error reaches every later layer.

    First layers (stems, embeddings) have few weights and wide input ranges;

    Fix: keeping them in 8 or 16 bits costs little memory.
    """
    return RiskMatch() if layer.is_first else None


@risk_rule("QNT005")
def last_layer(layer: LayerView) -> RiskMatch | None:
    """Last layer (head): its error goes straight to the output.

    Classifier and LM heads write the logits with nothing after them to average the error out.

    Fix: Keep the head at 8 bits at least.
    """
    return RiskMatch() if layer.is_last else None


@risk_rule("QNT006")
def writes_residual(layer: LayerView) -> RiskMatch | None:
    """Writes into a residual stream with a large range.

    Residual streams carry outlier features (max/std well above 20) that per-tensor activation
    scales clip or waste; the layers writing them are the first to suffer.

    Fix: Use per-channel or per-token activation scales, or keep activations in 16 bits
    (W4A16, W8A16).
    """
    ratio = layer.residual_max_over_std
    if not layer.feeds_residual or (ratio is not None and ratio < RESIDUAL_OUTLIER_RATIO):
        return None
    detail = f"max/std {ratio:.0f}" if ratio is not None else "range unknown without --calibrate"
    return RiskMatch(detail)


BUILTIN_RISK_RULES: tuple[RiskRule, ...] = declared_coded(FAMILY, __name__)
RISK_RULES: Mapping[str, RiskHandler] = {r.code: r.handler for r in BUILTIN_RISK_RULES}


def risk_rules(registry: CostRegistry) -> tuple[RiskRule, ...]:
    """The risk rules of `registry` (built-in and rule packs')."""
    return registry.coded.of(FAMILY)


def assess(layer: LayerView, rules: Sequence[RiskRule] = BUILTIN_RISK_RULES
           ) -> tuple[Risk, ...]:
    """Every risk rule's finding for `layer`, by code."""
    found = ((rule, rule.handler(layer)) for rule in sorted(rules, key=lambda r: r.code))
    return tuple(risk(rule, match) for rule, match in found if match is not None)


def risks(layer: LayerView) -> tuple[Risk, ...]:
    """The built-in risk rules' findings for `layer`, by code."""
    return assess(layer)


# NB: the weights-only prior (used when no forward can run) subtracts this per structural risk
# (dB) from the weight SQNR. Measured (bench/README.md, before issue 16): with 0 dB the digits
# MLP ranked at ρ 0.03 and MiniLM at 0.70; with 1 dB at 0.89 and 0.60.
RISK_PENALTY_DB = 1.0
# NB: the weights-only prior's propagation: an error made early passes through every later
# layer. Damage measured one layer at a time on trained models spreads over 19–39 dB between
# layers (issue 16), and ranking by depth alone reached ρ 0.60 there; so the first layer gets
# PROPAGATION_DB more than the last, linearly in execution order, and first layers,
# embeddings and heads ROLE_DB more. Guesses of that size, not fitted.
PROPAGATION_DB = 10.0
ROLE_DB = 6.0


# NB: typical weight SQNR of trained transformer layers (all-MiniLM-L6-v2, median over its
# layers), used to size a plan for a model without real weights (meta device, random init).
NOMINAL_SQNR_DB = {"int8_per_channel": 40.0, "int8_per_tensor": 30.0, "fp8_e4m3": 31.0}
NOMINAL_INT4_DB = 18.0


def knowledge(group_size: int = DEFAULT_GROUP_SIZE, registry: CostRegistry | None = None
              ) -> QuantKnowledge:
    """Everything the quantization engine needs from this module; the risk rules are
    `registry`'s when one is given (rule packs included), else the built-in ones."""
    rules = risk_rules(registry) if registry is not None else BUILTIN_RISK_RULES
    return QuantKnowledge(
        formats=formats(group_size), channel_axis=channel_axis,
        risks=functools.partial(assess, rules=rules),
        random_init_reason=random_init_reason, activation_format=activation_format,
        stop_ops=STOP_OPS, residual_ops=RESIDUAL_OPS, embedding_types=EMBEDDING_TYPES,
        risk_penalty_db=RISK_PENALTY_DB, extra_formats={"bf16": BF16},
        logit_layer_types=LOGIT_LAYER_TYPES, keep_8_bits=KEEP_8_BITS,
        verdict_db=(KEEP_BELOW_DB, KEEP_HIGHER_DB), weight_matrices=weight_matrices,
        batch_norm_types=BATCH_NORM_TYPES, foldable_types=FOLDABLE_TYPES,
        propagation_db=PROPAGATION_DB, role_db=ROLE_DB, input_axis=input_axis,
        homogeneous_ops=POSITIVELY_HOMOGENEOUS_OPS, layout_ops=LAYOUT_OPS,
        lower_is_better=lower_is_better, task_tolerance=TASK_TOLERANCE,
    )


def plan_request(name: str, budget_bytes: int | None,
                 group_size: int = DEFAULT_GROUP_SIZE) -> PlanRequest:
    spec = plan_spec(name, group_size)
    nominal = {**NOMINAL_SQNR_DB, f"int4_g{group_size}": NOMINAL_INT4_DB}
    return PlanRequest(name=spec.name, ladder=spec.ladder, activations=spec.activations,
                       budget_bytes=budget_bytes, keep_below_db=KEEP_BELOW_DB,
                       fill_budget=spec.name == "auto", nominal_sqnr_db=nominal)
