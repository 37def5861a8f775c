"""Training-state policies as data: what each precision and optimizer keeps per parameter.

`Precision` and `Optimizer` are the closed sets the CLI offers (``--precision``,
``--optimizer``); ``.spec`` gives the frozen policy record, whose methods the accounting in
`fxlens.analyzer.memory.training_state` calls per parameter (no op knowledge lives there).

Precision, bytes per floating-point parameter (``Ψ`` = parameters):

    precision      working weights  master (fp32)  gradients  optimizer-state dtype
    fp32           4                -              4          float32
    bf16           2                -              2          bfloat16
    amp-bf16       2                4              2          float32
    amp-fp16       2                4              2          float32
    autocast-bf16  4                -              4          float32
    autocast-fp16  4                -              4          float32
    fp8            2 (+1 fp8 copy)  4              2          float32

Which mixed precision is yours:
- ``amp-*`` is Megatron / apex-O2 style mixed precision: the model itself holds 16-bit working
  weights, the optimizer an fp32 master copy (Micikevicius et al., "Mixed Precision
  Training", ICLR 2018; ZeRO, Rajbhandari et al. 2020, §3.1: "2Ψ + 2Ψ + KΨ" with K = 12 for
  Adam): with Adam 2 + 4 + 2 + 8 = 16 B/param, as pure fp32 with Adam (4 + 4 + 8). The step
  is recorded with every weight cast to the 16-bit dtype, so every activation is 16-bit.
  Megatron-LM, NeMo, DeepSpeed's bf16/fp16 engines, ``model.half()`` + a master copy.
- ``autocast-*`` is plain ``torch.autocast(device_type="cuda", dtype=...)`` over an fp32 model
  (what the HF Trainer's ``bf16=True``/``fp16=True``, Accelerate's and Lightning's
  ``*-mixed`` run): fp32 weights, fp32 gradients, fp32 states, no master copy (4 + 4 + 8 =
  16 B/param with Adam, the same total split differently). The step is recorded under
  autocast (`fxlens.analyzer.capture.autocast`): matmuls, linears and convolutions run in
  16 bits, norms, softmax and anything fed an fp32 tensor in fp32 (a GPT-2 residual stream
  stays fp32), so activations are larger than amp's. NB: autocast's bf16 copies of the
  weights, made per forward, are activations of the recorded step, not persistent state.
- fp16's loss scaler is one scalar: not counted.
- bf16 is pure half precision: the optimizer state takes the parameter dtype
  (``torch.optim`` creates it with ``zeros_like(param)``), so Adam needs 2 + 2 + 4 = 8 B.
- fp8 assumes Transformer-Engine-style training (NVIDIA Transformer Engine docs, "Low
  precision training — Introduction" and ``fp8_model_init``): parameters stay bf16 (working
  weights, 2 B) with an fp32 master copy in the optimizer (4 B); each weight matrix (≥ 2-D)
  also keeps an fp8 (E4M3) copy cached between steps (1 B) for the fp8 GEMMs; gradients are
  bf16 (2 B); optimizer states fp32. With Adam: 2 + 1 + 4 + 2 + 8 = 17 B per matrix
  parameter, 16 B per vector. NB: Hopper's fp8 GEMMs also want a transposed fp8 copy in the
  backward (+1 B, not counted); ``fp8_model_init`` (fp8 primary weights) drops the bf16
  copy (−2 B); Megatron's fp32 ``main_grad`` accumulation would make gradients 4 B.

Integer and other non-castable parameters keep their declared dtype; the policy sets the
dtype of every real floating-point parameter (float16/32/64, bfloat16).

Optimizer state, per trainable parameter of ``n`` elements (``s`` = bytes of the state dtype):

    sgd        none                                         torch.optim.SGD
    momentum   1 copy: n·s (momentum buffer)                torch.optim.SGD(momentum>0)
    adam       2 copies: 2·n·s (m, v)                       torch.optim.Adam
    adamw      2 copies: 2·n·s (m, v)                       torch.optim.AdamW
    adafactor  factored v: (n/C + n/R)·s for a (…, R, C) parameter, n·s for a vector; no
               first moment (torch.optim.Adafactor has none; transformers' Adafactor
               defaults to beta1=None)
    adamw-bf16 2 copies in bf16: 2·n·2 B, whatever the precision's state dtype, the master
               copy as the precision keeps it: DeepSeek-V3's recipe (technical report,
               arXiv:2412.19437, §3.3.3, low-precision optimizer states: both moments in
               BF16, the master weights in FP32), Megatron-core's precision-aware optimizer with
               ``exp_avg_dtype``/``exp_avg_sq_dtype`` bf16 (Megatron-Bridge's DeepSeek-V3,
               Moonlight and OLMoE recipes)
    adam8bit   bitsandbytes Adam8bit: per moment 1 B/element + one fp32 absmax per block of
               256 elements (2 · (1 + 4/256) ≈ 2.03 B/param); tensors under 4096 elements
               keep fp32 states (``min_8bit_size``). Source: bitsandbytes
               ``optim/optimizer.py`` ``Optimizer2State.init_state``; the block was 2048
               before v0.44 (bitsandbytes PR #1365), ``ADAM8BIT_LEGACY_BLOCK``.

NB: a per-tensor step counter (one scalar) and bitsandbytes' shared 256-entry code maps are
not counted.

Optimizer-step FLOPs per element (counted as ``pointwise.py`` counts the ops of each
optimizer's single-tensor implementation in ``torch.optim``, defaults: no weight decay for
SGD/Adam, 1e-2 decoupled for AdamW and Adafactor):

    sgd        2   p.add_(g, alpha=-lr): mul, add
    momentum   4   buf.mul_(μ).add_(g): 2; p.add_(buf, alpha=-lr): 2
    adam       13  m.lerp_(g) 3; v.mul_(β2).addcmul_(g, g, value) 1 + 3;
                   denom = v.sqrt() / bc2 + eps 3; p.addcdiv_(m, denom, value) 3
    adamw      14  adam + decoupled weight decay p.mul_(1 - lr·wd) 1
    adafactor  18  matrices: ‖p‖ 2, decay 1, row and column ‖g‖ 2 + 2, row ⊗ col 2 (a K=1
                   matmul), ÷ row mean 1, clamp 1, rsqrt 2, ·g 1, ‖update‖ 2, p.add_ 2
               15  vectors: ‖p‖ 2, decay 1, g·g 1, lerp 3, clamp 1, rsqrt 2, ·g 1,
                   ‖update‖ 2, p.add_ 2
    adam8bit   21  adam 13 + per moment: dequantise 1 (code × absmax), requantise 3 (|x|,
                   block max, ÷ absmax); tensors kept in fp32 states: 13
NB: per-row/column/tensor terms (O(R + C)) are left out; the search for the nearest of the
256 codes when requantising is not counted.

Optimizer-step memory traffic (`OptimizerSpec.step_accesses`): on a GPU ``torch.optim``'s
default is the multi-tensor ("foreach") step, one kernel per ``torch._foreach_*`` call, each
reading and writing whole state-sized tensors. Full-size tensor accesses per parameter element
(reads + writes), from ``_multi_tensor_adam`` and ``_multi_tensor_sgd`` (torch 2.13):

    sgd        3   add_(p, g)
    momentum   8   mul_(buf) 2, add_(buf, g) 3, add_(p, buf) 3
    adam       19  lerp_(m, g) 3, mul_(v) 2, addcmul_(v, g, g) 4, d = sqrt(v) 2, div_(d) 2,
                   add_(d, eps) 2, addcdiv_(p, m, d) 4
    adamw      21  adam + mul_(p, 1 − lr·wd) 2
Each access moves one element of the updated copy (the master copy where there is one), and a
master copy is then written to the working weights (read master, write weights). The foreach
step also allocates its temporaries for every parameter at once (`foreach_temporaries`): Adam's
and AdamW's ``d = sqrt(v)`` is a state-sized copy of all of them (5.5 GiB for 1.5 B fp32
parameters), where a single-tensor step holds one parameter's. Measured on an
H200 (bench/gpu, 2026-11-27): AdamW's foreach kernels on a 1.5 B-parameter fp32 model were the
three largest non-GEMM kernels of the step. ``fused=True`` steps (one pass) and the
optimizers without a foreach path here (adafactor, adam8bit) read and write each state once:
``None``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from fxlens.analyzer.core.graph import TensorSpec, dtype_bytes

CASTABLE_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})


@dataclass(frozen=True)
class PrecisionSpec:
    """Dtypes a precision policy keeps per parameter; ``None`` when a copy is not kept."""

    weight_dtype: str                 # working weights used by forward and backward
    master_dtype: str | None          # the optimizer's high-precision copy
    grad_dtype: str
    state_dtype: str                  # default dtype of optimizer states
    matrix_cache_dtype: str | None = None   # extra low-precision copy of each ≥ 2-D weight
    source: str = ""
    autocast_dtype: str | None = None       # the step runs under torch.autocast in this dtype

    def _cast(self, spec: TensorSpec, dtype: str) -> int:
        """Bytes of `spec` held in `dtype`, or in its own dtype when it is not castable."""
        own = spec.dtype not in CASTABLE_DTYPES
        return int(spec.numel * dtype_bytes(spec.dtype if own else dtype))

    def weight_bytes(self, spec: TensorSpec) -> int:
        """Working copies of one parameter that live across steps (frozen ones included)."""
        cache = self.matrix_cache_dtype
        extra = (self._cast(spec, cache)
                 if cache and len(spec.shape) >= 2 and spec.dtype in CASTABLE_DTYPES else 0)
        return self._cast(spec, self.weight_dtype) + extra

    def master_bytes(self, spec: TensorSpec) -> int:
        if self.master_dtype is None or spec.dtype not in CASTABLE_DTYPES:
            return 0
        return self._cast(spec, self.master_dtype)

    def grad_bytes(self, spec: TensorSpec) -> int:
        return self._cast(spec, self.grad_dtype)


class Precision(str, Enum):
    FP32 = "fp32"
    BF16 = "bf16"
    AMP_BF16 = "amp-bf16"
    AMP_FP16 = "amp-fp16"
    AUTOCAST_BF16 = "autocast-bf16"
    AUTOCAST_FP16 = "autocast-fp16"
    FP8 = "fp8"

    @property
    def spec(self) -> PrecisionSpec:
        return PRECISIONS[self]


PRECISIONS: dict[Precision, PrecisionSpec] = {
    Precision.FP32: PrecisionSpec("float32", None, "float32", "float32"),
    Precision.BF16: PrecisionSpec("bfloat16", None, "bfloat16", "bfloat16",
                                  source="torch.optim states: zeros_like(param)"),
    Precision.AMP_BF16: PrecisionSpec("bfloat16", "float32", "bfloat16", "float32",
                                      source="ZeRO (Rajbhandari et al. 2020) §3.1"),
    Precision.AMP_FP16: PrecisionSpec("float16", "float32", "float16", "float32",
                                      source="Micikevicius et al. 2018; ZeRO §3.1"),
    Precision.AUTOCAST_BF16: PrecisionSpec("float32", None, "float32", "float32",
                                           source="torch.autocast (AMP recipe)",
                                           autocast_dtype="bfloat16"),
    Precision.AUTOCAST_FP16: PrecisionSpec("float32", None, "float32", "float32",
                                           source="torch.autocast (AMP recipe)",
                                           autocast_dtype="float16"),
    Precision.FP8: PrecisionSpec("bfloat16", "float32", "bfloat16", "float32",
                                 matrix_cache_dtype="float8_e4m3fn",
                                 source="NVIDIA Transformer Engine, low precision training"),
}


@dataclass(frozen=True)
class BlockQuantization:
    """Optimizer states stored in `bytes_per_element` with one fp32 scale per block."""

    block_size: int
    bytes_per_element: int = 1
    stats_dtype: str = "float32"      # one absmax per block and per moment
    min_numel: int = 4096             # smaller tensors keep `fallback_dtype` states
    fallback_dtype: str = "float32"
    codec_flops_per_element: int = 4  # dequantise 1 + requantise 3, per moment


ADAM8BIT_BLOCK = 256
ADAM8BIT_LEGACY_BLOCK = 2048          # bitsandbytes < 0.44


@dataclass(frozen=True)
class OptimizerSpec:
    """The state an optimizer keeps per parameter and its step's FLOPs per element."""

    full_moments: int                         # full-size state copies (momentum, m, v)
    step_flops_per_element: int
    factored_second_moment: bool = False      # Adafactor: rows + columns for ≥ 2-D
    factored_step_flops_per_element: int | None = None
    quantization: BlockQuantization | None = None
    source: str = ""
    step_accesses: int | None = None          # per element, foreach step; None: one pass
    foreach_temporaries: int = 0              # state-sized copies of *all* parameters
    moments_dtype: str | None = None          # its states' own dtype (None: the precision's)

    def _quantized(self, spec: TensorSpec) -> BlockQuantization | None:
        q = self.quantization
        return q if q is not None and spec.numel >= q.min_numel else None

    def state_elements(self, spec: TensorSpec) -> int:
        """Elements of state kept for one trainable parameter (quantised ones included)."""
        n = spec.numel
        moments = self.full_moments * n
        if self.factored_second_moment:
            moments += factored_elements(spec.shape)
        return moments

    def state_bytes(self, spec: TensorSpec, state_dtype: str) -> int:
        """Bytes of state for one trainable parameter when states default to `state_dtype`."""
        q = self._quantized(spec)
        if q is not None:
            blocks = math.ceil(spec.numel / q.block_size)
            per_moment = spec.numel * q.bytes_per_element + blocks * dtype_bytes(q.stats_dtype)
            return int(self.full_moments * per_moment)
        dtype = self.quantization.fallback_dtype if self.quantization else state_dtype
        return int(self.state_elements(spec) * dtype_bytes(self.moments_dtype or dtype))

    def step_flops(self, spec: TensorSpec) -> int:
        """FLOPs of one optimizer step on one trainable parameter."""
        per_element = self.step_flops_per_element
        if self.factored_second_moment and len(spec.shape) >= 2:
            per_element = self.factored_step_flops_per_element or per_element
        q = self._quantized(spec)
        if q is not None:
            per_element += self.full_moments * q.codec_flops_per_element
        return per_element * spec.numel


def factored_elements(shape: tuple[int, ...]) -> int:
    """Adafactor's second moment: row and column statistics over the last two dims.

    A (…, R, C) parameter keeps ``n/C`` row and ``n/R`` column entries (the leading dims
    batch both, as torch.optim.Adafactor and transformers' Adafactor); a vector keeps ``n``.
    """
    n = math.prod(shape)
    if len(shape) < 2 or n == 0:
        return n
    return n // shape[-1] + n // shape[-2]


class Optimizer(str, Enum):
    SGD = "sgd"
    MOMENTUM = "momentum"
    ADAM = "adam"
    ADAMW = "adamw"
    ADAFACTOR = "adafactor"
    ADAM8BIT = "adam8bit"
    ADAMW_BF16 = "adamw-bf16"

    @property
    def spec(self) -> OptimizerSpec:
        return OPTIMIZERS[self]


SGD_STEP_FLOPS = 2
MOMENTUM_STEP_FLOPS = 4
ADAM_STEP_FLOPS = 13
ADAMW_STEP_FLOPS = ADAM_STEP_FLOPS + 1
ADAFACTOR_STEP_FLOPS = 15
ADAFACTOR_FACTORED_STEP_FLOPS = 18
SGD_STEP_ACCESSES = 3
MOMENTUM_STEP_ACCESSES = 8
ADAM_STEP_ACCESSES = 19
ADAMW_STEP_ACCESSES = ADAM_STEP_ACCESSES + 2

OPTIMIZERS: dict[Optimizer, OptimizerSpec] = {
    Optimizer.SGD: OptimizerSpec(0, SGD_STEP_FLOPS, source="torch.optim.SGD",
                                 step_accesses=SGD_STEP_ACCESSES),
    Optimizer.MOMENTUM: OptimizerSpec(1, MOMENTUM_STEP_FLOPS,
                                      source="torch.optim.SGD(momentum>0)",
                                      step_accesses=MOMENTUM_STEP_ACCESSES),
    Optimizer.ADAM: OptimizerSpec(2, ADAM_STEP_FLOPS, source="torch.optim.Adam",
                                  step_accesses=ADAM_STEP_ACCESSES, foreach_temporaries=1),
    Optimizer.ADAMW: OptimizerSpec(2, ADAMW_STEP_FLOPS, source="torch.optim.AdamW",
                                   step_accesses=ADAMW_STEP_ACCESSES, foreach_temporaries=1),
    Optimizer.ADAFACTOR: OptimizerSpec(
        0, ADAFACTOR_STEP_FLOPS, factored_second_moment=True,
        factored_step_flops_per_element=ADAFACTOR_FACTORED_STEP_FLOPS,
        source="torch.optim.Adafactor; transformers.optimization.Adafactor (beta1=None)"),
    Optimizer.ADAM8BIT: OptimizerSpec(
        2, ADAM_STEP_FLOPS, quantization=BlockQuantization(ADAM8BIT_BLOCK),
        source="bitsandbytes.optim.Adam8bit (block-wise, v0.44+)"),
    Optimizer.ADAMW_BF16: OptimizerSpec(
        2, ADAMW_STEP_FLOPS, step_accesses=ADAMW_STEP_ACCESSES, foreach_temporaries=1,
        moments_dtype="bfloat16",
        source="AdamW with bf16 moments (DeepSeek-V3, arXiv:2412.19437 §3.3.3; Megatron-core "
               "--exp-avg-dtype/--exp-avg-sq-dtype bf16)"),
}


# --loss-dtype: "fp32", the model's own loss (transformers casts a causal LM's logits to
# float32); "logits", its cross-entropy in the logits' dtype (`fxlens.analyzer.capture.hf_loss`)
LOSS_DTYPES = ("fp32", "logits")
