"""NF4 dequantization (``fxlens_nf4::dequantize``, the capture's `fxlens.analyzer.capture.nf4`):
one kernel per use of a QLoRA base weight, as bitsandbytes' ``dequantize_4bit`` runs it.

It reads the packed codes (half a byte per weight), the 8-bit absmaxes and their float32
scales, and writes the bf16 weight: the op's own inputs and output, so the default bytes.
FLOPs: one multiply per weight (its code's level by its block's absmax) and one per absmax
(by its scale); the table lookup is not arithmetic.
"""

from __future__ import annotations

from fxlens.analyzer.core.costs import Cost, OpCall, cost_rule, numel


@cost_rule("fxlens_nf4.dequantize")
def dequantize(call: OpCall) -> Cost:
    weights = int(call.arg("rows")) * int(call.arg("cols"))
    return Cost(flops=weights + numel(call.shape("absmax")),
                note="NF4 weight dequantized to bf16 (bitsandbytes' dequantize_4bit)")
