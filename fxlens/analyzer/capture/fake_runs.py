"""Running a model on fake tensors, and on small real ones when fake tensors cannot go: the
runs the recorder, the block proof and the memory simulation make.

`fake_then_real(module, args, kwargs, run)` runs on fake tensors; an op whose output depends
on data (``.item()``, ``nonzero``) forces a rerun on small real tensors. Meta-device weights
are then materialised with random values, which is allowed only up to `REAL_RUN_LIMIT_BYTES`.

Fake kernels stricter than the CPU kernels (`CpuFakeTensorMode`): torch 2.13's meta kernel of
``aten._grouped_mm`` copies the CUDA checks and accepts only bfloat16, while the CPU kernel
takes float32 and float16 too. `transformers` sends its MoE experts through
``torch._grouped_mm`` on CPU outside ``torch.compile``, so a float32 MoE failed on fake
tensors: torch logged an ERROR traceback ("Expected inputs of BF16 type") and we reran on real
tensors. Fake runs here (and the make_fx link) use `CpuFakeTensorMode`, which answers such
calls on CPU or meta tensors as the CPU kernel would (same shapes, the input dtype), so they
stay on fake tensors and torch stays quiet.
Higher-order ops (FlexAttention) find their fake implementations registered for this mode
too: torch looks them up by the mode's exact type.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode

from fxlens.analyzer.capture.chatter import torch_chatter_to_debug_log

REAL_RUN_LIMIT_BYTES = 2 * 2**30
CASTABLE = (torch.float64, torch.float32, torch.float16, torch.bfloat16)  # …CASTABLE_DTYPES

log = logging.getLogger(__name__)
T = TypeVar("T")


def materialise(module: torch.nn.Module) -> torch.nn.Module:
    """A CPU copy of a meta-device module with random weights, for a real run."""
    size = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
    if size > REAL_RUN_LIMIT_BYTES:
        raise MemoryError(
            f"the model needs a real run but its weights take {size / 2**30:.1f} GiB "
            f"(limit {REAL_RUN_LIMIT_BYTES / 2**30:.0f} GiB); try smaller sizes with --set"
        )
    return random_weights(module, "cpu")


def random_weights(module: torch.nn.Module, device: str) -> torch.nn.Module:
    """A copy of a meta-device module on `device`, floating weights drawn from N(0, 0.02²)
    with a fixed seed, other parameters and buffers zero.
    NB: buffers computed at construction (rotary tables, position ids) are zeros too: values
    change the numbers, not which kernels run or their shapes."""
    real = copy.deepcopy(module).to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in real.parameters():
            if p.is_floating_point():
                p.normal_(0.0, 0.02, generator=generator)
            else:
                p.zero_()
        for b in real.buffers():
            b.zero_()
    return real


def real_like(value: Any) -> Any:
    """Meta tensors become small real ones (zeros for integers, so ids stay in range)."""
    if isinstance(value, torch.Tensor) and value.is_meta:
        if value.is_floating_point():
            return torch.randn(value.shape, dtype=value.dtype,
                               generator=torch.Generator().manual_seed(0))
        return torch.zeros(value.shape, dtype=value.dtype)
    return value


class CpuFakeTensorMode(FakeTensorMode):
    """A `FakeTensorMode` whose fake kernels accept what the CPU kernels accept (see the
    module docstring); every other op is the parent's, higher-order ops (FlexAttention)
    included: their fake implementations are looked up by the mode's exact type, so each is
    registered for this one too when a mode is made."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for hop in list(getattr(torch._ops, "_higher_order_ops", {}).values()):
            table = getattr(hop, "python_key_table", {})
            if FakeTensorMode in table and CpuFakeTensorMode not in table:
                table[CpuFakeTensorMode] = table[FakeTensorMode]

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten._grouped_mm.default and _cpu_not_bf16(args):
            return self._grouped_mm_any_dtype(func, types, args, kwargs)
        return super().dispatch(func, types, args, kwargs)

    def _grouped_mm_any_dtype(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """The meta kernel's answer for bfloat16 copies, handed back in the CPU kernel's dtype
        (``out_dtype`` when given, else the inputs')."""
        dtype = kwargs.get("out_dtype") or args[0].dtype
        as_bf16 = pytree.tree_map_only(
            torch.Tensor, lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t,
            (args, {k: v for k, v in kwargs.items() if k != "out_dtype"}))
        out = super().dispatch(func, types, *as_bf16)
        assert isinstance(out, torch.Tensor)
        return out.to(dtype).contiguous()


def _cpu_not_bf16(args: Any) -> bool:
    a, b = args[0], args[1]
    return (a.device.type in ("cpu", "meta") and a.dtype in (torch.float32, torch.float16)
            and b.dtype == a.dtype)


Run = Callable[
    [torch.nn.Module, dict[str, torch.Tensor], tuple[Any, ...], dict[str, Any], Any], T
]


def fake_then_real(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], run: Run[T],
    dtype: torch.dtype | None = None,
) -> tuple[T, str]:
    """`run(module, state, args, kwargs, fake_mode)` on fake tensors; if that fails (an op
    needs real values, or a fake kernel refuses what the real one accepts), once more on
    small real tensors (the weights as `own_state`: nothing the run does reaches the module).
    Floating-point weights and inputs are cast to `dtype` when given.
    What torch logs about a failing fake run goes to the debug log
    (`fxlens.analyzer.capture.chatter`). Returns the result and which tensors it ran on."""
    try:
        with torch_chatter_to_debug_log():
            with CpuFakeTensorMode(allow_non_fake_inputs=True) as fake_mode:
                state, fake_args, fake_kwargs = pytree.tree_map_only(
                    torch.Tensor, lambda t: fake_cpu(t, fake_mode, dtype),
                    (module_state(module), args, kwargs))
            return run(module, state, fake_args, fake_kwargs, fake_mode), "fake tensors"
    except Exception as error:  # the real run below fails the same way if it is the model's
        log.info("recording on fake tensors failed (%s); rerunning on real tensors", error)
    real = materialise(module) if on_meta(module) else module
    state, real_args, real_kwargs = pytree.tree_map_only(
        torch.Tensor, lambda t: cast_leaf(real_like(t), dtype),
        (own_state(real), args, kwargs))
    return (run(real, state, real_args, real_kwargs, None),
            "real tensors: the graph follows these inputs' branches")


def fake_cpu(
    t: torch.Tensor, fake_mode: FakeTensorMode, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """A fake tensor like `t` (cast to `dtype` if floating); meta tensors become fake *CPU*
    tensors, so kernels are chosen as on a device (on meta, SDPA takes its math fallback)."""
    if not t.is_meta:
        return cast_leaf(fake_mode.from_tensor(t), dtype)
    with fake_mode:
        fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
    return cast_leaf(fake.requires_grad_(t.requires_grad and t.is_floating_point()), dtype)


def cast_leaf(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """`t` in `dtype` when it is a castable floating-point tensor (float64/32/16, bfloat16;
    an FP8 one keeps its dtype, as the precision policies keep it), still a leaf with its
    requires_grad."""
    if dtype is None or t.dtype not in CASTABLE or t.dtype == dtype:
        return t
    return t.detach().to(dtype).requires_grad_(t.requires_grad)


def own_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by qualified name, as tensors a run may change without changing
    the module: each parameter a new leaf on its storage (a backward fills its ``.grad``, not
    the parameter's), each buffer a copy (train mode updates BatchNorm's statistics)."""
    params = {n: p.detach().requires_grad_(p.requires_grad)
              for n, p in module.named_parameters()}
    return {**params, **{n: b.clone() for n, b in module.named_buffers()}}


def module_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by qualified name."""
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def on_meta(module: torch.nn.Module) -> bool:
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))
