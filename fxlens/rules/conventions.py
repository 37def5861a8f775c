"""FLOP conventions shared by several rule families, stated once.

- One multiply-add = 2 FLOPs (as ``torch.utils.flop_counter``); MACs = FLOPs / 2.
- Bias adds folded into a GEMM or convolution epilogue are not counted, as FlopCounterMode.
- Softmax costs 5 FLOPs per element: max, subtract, exp, sum, divide (the numerically stable
  form every kernel uses). Fused attention kernels pay it on every score they compute.
- Causal attention counts the work actually done: only the scores a fused kernel computes
  (query i sees keys j <= i, top-left aligned as ``is_causal`` in SDPA), not the dense square.
"""

SOFTMAX_FLOPS_PER_ELEMENT = 5
FLOPS_PER_MAC = 2
