"""A training step recorded as ``torch.autocast`` runs it: fp32 weights, casts per op.

`autocast_forward(policy)` opens ``torch.autocast("cpu", dtype=...)`` around the forward, on
the fake CPU tensors the step is recorded on, so the graph carries the ``_to_copy`` casts and
the dtypes autocast gives: matmuls, linears, convolutions and attention in the lower dtype,
everything else in the dtype of its inputs (an fp32 residual stream plus a bf16 linear output
promotes to fp32). The backward is recorded outside autocast, as PyTorch's AMP recipe asks
("exiting autocast before backward() is recommended") and as the HF Trainer, Accelerate and
Lightning run it: each backward op runs in the dtypes its forward saved, and autograd runs the
casts' backward (a bf16 weight gradient cast back to the fp32 parameter's dtype), so every
parameter's gradient is fp32.

CPU's op lists are not CUDA's. `autocast_kernels(policy)` fills the gap for a GPU target: for
each op of ``policy.casts`` that CPU autocast has no policy for, a Python kernel at the
``AutocastCPU`` dispatch key casts as CUDA's does (the key sits above autograd, so its casts
are recorded with their backward, as autocast's own), registered only while the recording
runs. Found in torch 2.13's dispatcher (an ``AutocastCUDA`` kernel and no ``AutocastCPU``
one), the ones that change a transformer's memory: ``layer_norm``/``native_layer_norm``,
``group_norm``, ``pow``, ``exp``, ``log``, ``rsqrt`` (fp32 on CUDA, the input's dtype on
CPU: GPT-2's tanh-GELU, ``0.5·x·(1 + tanh(√(2/π)(x + 0.044715·x³)))``, turns fp32 at
``pow``, so its 4·C-wide MLP activations are fp32 on a GPU), and ``softmax``,
``log_softmax``, ``sum``, ``cumsum`` (computed in fp32, a ``dtype`` argument set). The tables
are knowledge and live in `fxlens.rules.autocast`. Where the analysis targets a CPU, no casts
are added: the step is CPU autocast's as it is.

Measured on an H200 (hf:gpt2, batch 8 × 1024 tokens, AdamW, autocast bf16, backward inside
autocast): the step peaks at 8.81 GiB (first step) / 9.75 GiB (steady); recorded here,
8.67 / 9.59 GiB (amp-bf16's all-bf16 recording: 6.68 / 7.60). Recording the backward inside
autocast too gave the same peaks.

Limitations. NB: autocast's cast cache (a leaf fp32 weight cast once per autocast region) is
CPU autocast's own for the ops on its lists; the casts added here are not cached (a weight
fed twice to an op on CUDA's list alone, ``einsum`` say, is cast twice). Ops on CPU's lists
and not CUDA's keep CPU's policy: ``cat``/``stack`` (promote; eager promotes anyway),
``cross_entropy_loss`` (fp32; CUDA reaches fp32 through ``log_softmax`` and ``nll_loss``),
FFTs, linear algebra and 3-D pooling (fp32 on CPU, the input's dtype on CUDA).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.utils._pytree as pytree

from fxlens.analyzer.capture.types import Autocast, Cast

log = logging.getLogger(__name__)

CPU_KEY = "AutocastCPU"


@contextmanager
def autocast_forward(policy: Autocast | None) -> Iterator[None]:
    """While open, CPU autocast in ``policy.dtype``; a no-op without a policy."""
    if policy is None:
        yield
        return
    with torch.autocast("cpu", dtype=getattr(torch, policy.dtype)):
        yield


@contextmanager
def autocast_kernels(policy: Autocast | None) -> Iterator[None]:
    """While open, the ops of ``policy.casts`` that CPU autocast leaves alone cast as the
    policy says whenever CPU autocast is on (checkpoint recomputes in the backward too)."""
    if policy is None or not policy.casts:
        yield
        return
    library = torch.library.Library("aten", "IMPL")
    try:
        lower = getattr(torch, policy.dtype)
        for name, cast in sorted(policy.casts.items()):
            op = aten_overload(name)
            if op is None or torch._C._dispatch_has_kernel_for_dispatch_key(
                    op.name(), CPU_KEY):
                continue              # unknown to this torch, or CPU autocast has its own
            library.impl(name, _kernel(op, cast, lower), CPU_KEY)
        yield
    finally:
        library._destroy()


def aten_overload(name: str) -> torch._ops.OpOverload | None:
    """``"pow.Tensor_Scalar"`` → ``aten.pow.Tensor_Scalar``; None when torch has none."""
    base, _, overload = name.partition(".")
    try:
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
    except AttributeError:
        log.debug("autocast: no aten op %s in this torch", name)
        return None
    return op if isinstance(op, torch._ops.OpOverload) else None


def _kernel(op: torch._ops.OpOverload, cast: Cast, lower: torch.dtype
            ) -> Callable[..., Any]:
    """An autocast kernel: cast the arguments, then run `op` with CPU autocast off below it,
    as ``WrapFunction_`` in PyTorch's ``autocast_mode.h`` does."""
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(
                torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)):
            if cast is Cast.FP32_DTYPE:
                args, kwargs = _fp32_dtype(op, args, kwargs)
            else:
                target = _target(cast, lower, (args, kwargs))
                args, kwargs = pytree.tree_map_only(
                    torch.Tensor, lambda t: t.to(target) if _eligible(t) else t,
                    (args, kwargs))
            return op(*args, **kwargs)

    return kernel


def _eligible(t: Any) -> bool:
    """Autocast casts floating CPU tensors, never float64 (``is_eligible``)."""
    return (isinstance(t, torch.Tensor) and t.is_floating_point()
            and t.dtype != torch.float64 and t.device.type == "cpu")


def _target(cast: Cast, lower: torch.dtype, arguments: Any) -> torch.dtype:
    if cast is Cast.LOWER:
        return lower
    if cast is Cast.FP32:
        return torch.float32
    target = lower                    # promote: the widest of the lower dtype and the inputs
    for t in pytree.tree_leaves(arguments):
        if _eligible(t):
            target = torch.promote_types(target, t.dtype)
    return target


def _fp32_dtype(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
                ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``fp32_set_opt_dtype``: when the first argument is eligible, an unset ``dtype``
    argument becomes float32 (the op computes and returns fp32)."""
    first = args[0] if args else next(iter(kwargs.values()), None)
    if not _eligible(first):
        return args, kwargs
    index = [a.name for a in op._schema.arguments].index("dtype")
    if index < len(args):
        if args[index] is None:
            args = (*args[:index], torch.float32, *args[index + 1:])
    elif kwargs.get("dtype") is None:
        kwargs = {**kwargs, "dtype": torch.float32}
    return args, kwargs
