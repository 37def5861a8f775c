"""Structured-pruning knowledge: how each op carries channels from its inputs to its outputs
(axis rules), and how a module whose weights were sliced is told its new sizes.

Axis rules (one per op packet) read the layouts of their arguments through
`fxlens.analyzer.prune.types.AxisCall` and give their outputs' layouts. They live by what they
touch: `shapes` (pointwise and broadcasting ops, views, slices, concatenation, reductions,
padding, tensors made from sizes) and `layers` (contractions, embeddings, norms, convolutions,
pooling, attention); `modules` fixes the modules after slicing. An op without a rule pins every
axis it touches: never pruned, named in the report. In-place variants (``add_``, ``relu_``,
``dropout_``) follow their functional op: the output is ``self``, re-shaped alike.

Rule-facing API used: `fxlens.analyzer.core` and `fxlens.analyzer.prune.types`.
"""

from __future__ import annotations

from collections.abc import Mapping

from fxlens.analyzer.prune.types import AxisRule, PruneKnowledge
from fxlens.rules.hardware import MISALIGNED_GEMM
from fxlens.rules.matmul import TENSOR_CORE_ALIGNMENT_BYTES
from fxlens.rules.pointwise import POINTWISE
from fxlens.rules.prune.layers import (
    attention,
    batch_norm,
    convolution,
    embedding,
    layer_norm,
    linear,
    matmul,
    pooling,
)
from fxlens.rules.prune.modules import attribute_fixes, resize_args
from fxlens.rules.prune.shapes import (
    along,
    cat,
    created,
    expand,
    gather,
    index,
    index_add,
    like,
    pad,
    pinned_all,
    pointwise,
    reduction,
    reshape,
    select,
    slice_,
    split,
    stack,
    topk,
    transpose,
)
from fxlens.rules.quant import BATCH_NORM_TYPES, RESIDUAL_OPS
from fxlens.rules.views import METADATA_OPS

KERNEL_ALIGNMENTS = (128, 64, 8)    # tensor-core tiles (128, 64) and the 16-byte vector width

_ACTIVATIONS = ("gelu silu relu relu6 tanh sigmoid hardswish hardsigmoid mish elu selu celu "
                "leaky_relu softplus dropout native_dropout to _to_copy clone contiguous "
                "detach alias lift_fresh_copy softmax _softmax log_softmax _log_softmax "
                "where masked_fill pow rsqrt exp neg abs fill")

_TABLE: tuple[tuple[str, AxisRule], ...] = (
    (_ACTIVATIONS, pointwise),
    ("view _unsafe_view reshape flatten unflatten squeeze unsqueeze view_as", reshape),
    ("t transpose permute numpy_T", transpose), ("expand expand_as broadcast_to", expand),
    ("slice narrow", slice_), ("split split_with_sizes chunk unsafe_split", split),
    ("select unbind", select), ("cat concat", cat), ("stack", stack),
    ("linear", linear), ("mm bmm matmul addmm baddbmm", matmul),
    ("embedding", embedding), ("layer_norm native_layer_norm rms_norm", layer_norm),
    ("batch_norm native_batch_norm _native_batch_norm_legit_no_training "
     "_native_batch_norm_legit", batch_norm),
    ("convolution _convolution conv1d conv2d conv3d conv_transpose1d conv_transpose2d "
     "conv_transpose3d", convolution),
    ("max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d "
     "adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool2d "
     "max_pool2d_with_indices _adaptive_avg_pool2d upsample_nearest1d upsample_nearest2d "
     "upsample_nearest3d _upsample_nearest_exact1d _upsample_nearest_exact2d "
     "_upsample_nearest_exact3d upsample_linear1d upsample_bilinear2d upsample_trilinear3d "
     "upsample_bicubic2d _upsample_bilinear2d_aa _upsample_bicubic2d_aa", pooling),
    ("scaled_dot_product_attention _scaled_dot_product_flash_attention_for_cpu "
     "_scaled_dot_product_efficient_attention _scaled_dot_product_flash_attention",
     attention),
    ("sum mean amax amin prod var std min max", reduction), ("topk sort", topk),
    ("cumsum cumprod logcumsumexp", along("summed along the axis")),
    ("index", index), ("index_add", index_add), ("gather", gather),
    ("zeros_like ones_like empty_like full_like rand_like randn_like", like),
    ("pad constant_pad_nd", pad),
    ("arange zeros ones full empty new_ones new_zeros new_full new_empty scalar_tensor",
     created),
    ("repeat roll flip tile repeat_interleave", pinned_all("entries moved across the axis")),
)


def _aten(names: str) -> list[str]:
    return [f"aten.{name}" for name in names.split()]


def _table() -> dict[str, AxisRule]:
    rules: dict[str, AxisRule] = {k: pointwise for k in POINTWISE if k.count(".") == 1}
    for names, rule in _TABLE:
        rules.update(dict.fromkeys(_aten(names), rule))
    in_place = {f"{name}_": rules[name] for name in rules if rules[name] is pointwise}
    return {**in_place, **rules}


AXIS_RULES: Mapping[str, AxisRule] = _table()


def knowledge() -> PruneKnowledge:
    return PruneKnowledge(
        axis_rules=AXIS_RULES,
        ignored_ops=frozenset(METADATA_OPS),
        attribute_fixes=attribute_fixes,
        scale_types=BATCH_NORM_TYPES,
        residual_ops=frozenset(RESIDUAL_OPS),
        alignments=KERNEL_ALIGNMENTS,
        aligned_bytes=TENSOR_CORE_ALIGNMENT_BYTES,
        misaligned_kernel=MISALIGNED_GEMM,
        resize_args=resize_args,
    )
