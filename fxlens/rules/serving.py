"""What serving engines run at reduced precision (`fxlens.serve_pass`, `fxlens.analyzer.serve`).

- FP8 (``--precision fp8`` with ``--serve``): the linear layers' weights are stored in FP8
  (1 byte) and their GEMMs run at the FP8 peak, as TensorRT-LLM's and vLLM's FP8 checkpoints
  (NVIDIA ModelOpt) do; the vocabulary projection (``lm_head``) and the embeddings stay at
  16 bits (ModelOpt's default quantization config excludes ``*lm_head*``), so do norms and
  attention. NB: the GEMMs' activations are FP8 too in those engines; they are counted at 16
  bits here (an over-estimate of decode bytes below 1 % at batch 1).
- KV cache dtype (``--kv-dtype``): the bytes per cached element; attention reads the cache at
  that width (FP8 KV attention kernels dequantize in registers).
- Weight-only formats (``--precision w8a16|w4a16``): the same linear layers' weights stored in
  8 or 4 bits with one 16-bit scale per group of `WEIGHT_GROUP` = 128 weights (AWQ's and
  GPTQ's default group size; zero points, where a format has them, left out), read packed by
  every decode step and dequantized in the GEMM's main loop, which runs at the activations'
  16 bits (TensorRT-LLM's weight-only GEMMs, Marlin): 0.516 bytes per weight at 4 bits, 1.016
  at 8. NB: the dequantization is taken as hidden under the weight reads.
- FP8 dense layers with 16-bit experts (``--precision fp8-dense``): the linear layers as
  ``fp8`` stores them, a MoE model's experts left at 16 bits (their grouped GEMMs at the
  16-bit peak). TensorRT-LLM served Mixtral this way until 0.10.0 ("Added FP8 quantization
  support for Mixtral" in its 0.10.0 release notes, NVIDIA/TensorRT-LLM docs/source/
  release-notes.md); for a dense model it is ``fp8``.
- Routed experts (`moe_routing`): the experts a MoE layer has and how many each token picks,
  read from the model's config.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Torch-free at import (the CLI's option checks read the tables below before torch loads).
WEIGHT_GEMMS = frozenset({"aten.linear", "aten.addmm", "aten.mm"})
KEPT_16_BIT = ("lm_head",)          # module names whose weights stay at 16 bits under FP8

WEIGHT_GROUP = 128                  # weights per 16-bit scale of a weight-only format
SCALE_BYTES = 2


@dataclass(frozen=True)
class WeightFormat:
    """How serving stores the linear layers' weights: `bits` per weight, one 16-bit scale per
    `group` weights (0: one per tensor, negligible), the GEMMs run at the device's `compute`
    figure (None: the activations' 16 bits); `experts`: whether a MoE model's experts are
    stored so too (else they stay at 16 bits)."""

    bits: int
    group: int
    compute: str | None
    experts: bool = True

    @property
    def bytes_per_weight(self) -> float:
        return self.bits / 8 + (SCALE_BYTES / self.group if self.group else 0.0)


WEIGHT_FORMATS: Mapping[str, WeightFormat] = {
    "fp8": WeightFormat(8, 0, "fp8"),
    "w8a16": WeightFormat(8, WEIGHT_GROUP, None),
    "w4a16": WeightFormat(4, WEIGHT_GROUP, None),
    "fp8-dense": WeightFormat(8, 0, "fp8", experts=False),
}
WEIGHT_ONLY = ("w8a16", "w4a16")
# serving-only --precision values (cli.args.SERVE_ONLY)
SERVE_ONLY = (*WEIGHT_ONLY, "fp8-dense")
# bf16: the model's own 16-bit weights, as loaded
SERVE_PRECISIONS = ("bf16", *WEIGHT_FORMATS)
KV_DTYPE_BYTES: Mapping[str, int] = {"fp8": 1, "int8": 1, "fp16": 2, "bf16": 2}
# NB: the in-flight batcher's caps (`fxlens.analyzer.serve.inflight`) default to TensorRT-LLM's
# engine defaults: tensorrt_llm/builder.py `BuildConfig` (NVIDIA/TensorRT-LLM@008b2b8d)
# ``max_num_tokens = 8192`` tokens per step and ``max_batch_size = 2048`` requests.
MAX_NUM_TOKENS = 8192
MAX_NUM_SEQS = 2048
EXPERT_GEMMS = frozenset({"aten._grouped_mm"})


def op_packet(target: str) -> str:
    """``aten.linear.default`` → ``aten.linear``."""
    return target.rsplit(".", 1)[0] if target.count(".") >= 2 else target


def weight_gemm(target: str, module: str) -> bool:
    """Whether a kernel is a linear layer's GEMM whose weight FP8 serving stores in FP8."""
    return op_packet(target) in WEIGHT_GEMMS and not any(
        module == name or module.endswith("." + name) for name in KEPT_16_BIT)


def expert_weight(name: str, dims: int) -> bool:
    """Whether a parameter is a MoE layer's stacked expert weight (experts × rows × columns,
    under a module named ``experts``), which reduced formats store like the linear layers'."""
    return dims == 3 and ".experts." in f".{name}"


def routed_experts(target: str) -> bool:
    """Whether a kernel is a MoE layer's grouped expert GEMM, whose weights a decode step
    reads only for the experts its tokens route to."""
    return op_packet(target) in EXPERT_GEMMS


def moe_routing(config: Any) -> tuple[int, int] | None:
    """(experts per MoE layer, experts each token picks) from a transformers config, None for
    a dense model."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    experts = next((getattr(text, key) for key in ("num_local_experts", "num_experts",
                                                    "n_routed_experts")
                    if isinstance(getattr(text, key, None), int)), 0)
    top_k = getattr(text, "num_experts_per_tok", None)
    return (experts, top_k) if experts > 1 and isinstance(top_k, int) and top_k > 0 else None


def cache_attention(target: str) -> bool:
    """Whether a kernel is fused attention, which reads the KV cache in a decode step."""
    return op_packet(target) in _fused_attention()


@functools.cache
def _fused_attention() -> frozenset[str]:
    from fxlens.rules.attention import FUSED_FORWARD

    return frozenset(str(op) for op in FUSED_FORWARD)
