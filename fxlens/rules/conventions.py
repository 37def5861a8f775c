"""FLOP conventions shared by several rule families, stated once.

- One multiply-add = 2 FLOPs (as ``torch.utils.flop_counter``); MACs = FLOPs / 2.
- Bias adds folded into a GEMM or convolution epilogue are not counted, as FlopCounterMode.
- A special function (exp, log, tanh, erf, sin…) costs ``SPECIAL_FUNCTION_FLOPS`` = 4 per
  element, the same figure wherever it appears: alone, inside sigmoid, softmax or an RNN gate.
- Softmax costs ``SOFTMAX_FLOPS_PER_ELEMENT`` = 8 per element: max 1, subtract 1, exp 4, sum 1,
  divide 1 (the numerically stable form every kernel uses), so a softmax written by hand from
  primitives costs the same as the fused op. Fused attention kernels pay it on every score
  they compute.
- Causal attention counts the work actually done: only the scores a fused kernel computes
  (query i sees keys j <= i, top-left aligned as ``is_causal`` in SDPA), not the dense square.
"""

FLOPS_PER_MAC = 2
SPECIAL_FUNCTION_FLOPS = 4
SIGMOID_FLOPS = 1 + SPECIAL_FUNCTION_FLOPS + 1 + 1   # negate, exp, add 1, divide
TANH_FLOPS = SPECIAL_FUNCTION_FLOPS
RELU_FLOPS = 1
SOFTMAX_FLOPS_PER_ELEMENT = 1 + 1 + SPECIAL_FUNCTION_FLOPS + 1 + 1
