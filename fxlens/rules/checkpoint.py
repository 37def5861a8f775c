"""Op families for selective activation checkpointing: what a saved or recomputed op is, in words.

A selective-checkpointing policy (`fxlens.analyzer.checkpoint`) decides per op of a block's
forward; a reader wants it said by kind — "matmuls and attention kept; norms, activations and
dropout recomputed". `op_family(target)` names the kind of an aten overload by its packet;
anything not listed is "other ops" (elementwise, reductions, copies). The families follow the
cost rules' own grouping (`fxlens.rules.matmul`, `conv`, `attention`, `norm`, `pointwise`).
"""

from __future__ import annotations

from collections.abc import Mapping

from fxlens.analyzer.core.graph import packet

OTHER = "other ops"

_FAMILIES: Mapping[str, tuple[str, ...]] = {
    "matmuls": ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.addbmm",
                "aten.matmul", "aten.linear", "aten._scaled_mm", "aten._grouped_mm",
                "aten.mv", "aten.addmv", "aten.dot", "transformers.grouped_mm_fallback"),
    "convolutions": ("aten.convolution", "aten._convolution", "aten.conv1d", "aten.conv2d",
                     "aten.conv3d"),
    "attention": ("aten.scaled_dot_product_attention",
                  "aten._scaled_dot_product_flash_attention",
                  "aten._scaled_dot_product_flash_attention_for_cpu",
                  "aten._scaled_dot_product_efficient_attention",
                  "aten._scaled_dot_product_cudnn_attention", "aten._flash_attention_forward",
                  "aten._efficient_attention_forward", "higher_order.flex_attention"),
    "softmax": ("aten._softmax", "aten._log_softmax", "aten.softmax", "aten.log_softmax"),
    "norms": ("aten.native_layer_norm", "aten.layer_norm", "aten.rms_norm",
              "aten._fused_rms_norm", "aten.native_group_norm", "aten.native_batch_norm",
              "aten._native_batch_norm_legit", "aten._native_batch_norm_legit_functional",
              "aten._batch_norm_with_update", "aten._batch_norm_with_update_functional"),
    "activations": ("aten.gelu", "aten.silu", "aten.relu", "aten.sigmoid", "aten.tanh",
                    "aten.hardtanh", "aten.leaky_relu", "aten.elu", "aten.mish",
                    "aten.softplus", "aten.glu", "aten.threshold", "aten.hardswish",
                    "aten.hardsigmoid", "aten.relu6", "aten.celu", "aten.selu"),
    "dropout": ("aten.native_dropout", "aten.bernoulli", "aten.dropout"),
}
_BY_PACKET = {p: family for family, packets in _FAMILIES.items() for p in packets}
# The order families are named in: what a policy usually keeps first.
FAMILY_ORDER = (*_FAMILIES, OTHER)


def op_family(target: str) -> str:
    """The family of an aten overload (``aten.addmm.default`` → "matmuls")."""
    return _BY_PACKET.get(packet(target), OTHER)


# The fused attention kernels one ``scaled_dot_product_attention`` call may dispatch to: the
# backend is picked at run time (dtype, GPU, masks), so a policy saving attention names them all.
ATTENTION_KERNELS = (
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
)


def runtime_ops(target: str) -> tuple[str, ...]:
    """The overloads a policy should name to catch the op the graph recorded as `target` at
    run time: every attention kernel for a fused attention forward, else `target` itself."""
    return ATTENTION_KERNELS if target in ATTENTION_KERNELS else (target,)
