"""Measure what this machine achieves: large-GEMM FLOP/s per dtype, copy bandwidth, launch cost.

`calibrate(device)` returns a `Calibration` of figures a roofline can use instead of a
datasheet's (with achievable factors of 1.0: they are achieved). Per dtype key:

- fp32, bf16, fp16: ``a @ b`` on square (n, n) matrices; tf32 the same in fp32 with
  ``allow_tf32`` on (CUDA only: on CPU it is the fp32 figure, and ``0`` is saved so the
  roofline falls back to fp32); fp8 ``torch._scaled_mm`` (e4m3, bf16 out); int8
  ``torch._int_mm``. A dtype the backend refuses is recorded as 0 (no such path) with the
  reason in `skipped`.
- n doubles from `START_N` until n reaches the device's `MIN_N` and the fastest of three calls
  takes `TARGET_CALL_S`, or n reaches the device's cap; then the median of `REPEATS` calls is
  taken. (The fastest call decides the size, so one slow call on a busy machine does not stop
  the growth at a small matrix.) This keeps the CPU run to a few seconds even
  where a dtype is emulated (fp16 on CPUs without AVX512-FP16 runs at a few GFLOP/s).
- misaligned GEMMs: a bf16 ``F.linear`` at the size the bf16 GEMM was measured at, with
  N = n − 1 (rows of the output not 16-byte aligned), its rate over the aligned one: the
  share of the peak such products reach (the ``gemm-misaligned`` kernel class of
  `fxlens.rules.hardware`; 0.13 on an H200, whose cuBLAS falls back to Turing-era kernels;
  about 1 on CPUs).
- bandwidth: ``dst.copy_(src)`` of `COPY_BYTES` (read + written = 2 × size) per call.
- launch: the median time of a one-element ``aten.add.Tensor`` overload call (`LAUNCH_CALLS`
  in a row, synchronised once): the per-op overhead a tiny kernel pays.
- host costs of an eager run (`fxlens.analyzer.time.host`): a view from Python (a free op,
  no kernel), and an ``nn.Linear`` module call less the same ``F.linear`` call (what a module
  call adds around its ops), timed the same way.

NB: the machine may be shared: figures measured under load are lower than the hardware's;
the profile records the thread count and torch version, not the load.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

START_N = 128
TARGET_CALL_S = 0.01
REPEATS = 5
MIN_N = {"cpu": 512, "cuda": 2048}
MAX_N = {"cpu": 2048, "cuda": 8192}
COPY_BYTES = {"cpu": 128 * 2**20, "cuda": 1024 * 2**20}
LAUNCH_CALLS = 200


@dataclass(frozen=True)
class Calibration:
    device: str                               # "cpu" or "cuda"
    device_name: str                          # e.g. "NVIDIA H100 80GB HBM3", or the CPU's
    peak_flops: dict[str, float]              # measured FLOP/s per dtype key (0: no path)
    bandwidth_bytes_per_s: float
    launch_s: float
    sizes: dict[str, int] = field(default_factory=dict)     # n of the GEMM measured
    skipped: dict[str, str] = field(default_factory=dict)   # dtype key → why not measured
    misaligned_gemm_share: float | None = None   # bf16, N = n − 1, over the aligned rate
    host_free_s: float | None = None              # a view from Python
    host_module_s: float | None = None            # an nn.Module call around its op
    details: dict[str, Any] = field(default_factory=dict)   # threads, torch version


def _timer(device: torch.device) -> Callable[[Callable[[], Any]], float]:
    cuda = device.type == "cuda"

    def timed(fn: Callable[[], Any]) -> float:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start
    return timed


def _gemm(key: str, n: int, device: torch.device) -> Callable[[], Any]:
    """One (n, n) @ (n, n) product in the dtype of `key`."""
    generator = torch.Generator().manual_seed(0)
    if key == "int8":
        a = torch.randint(-8, 8, (n, n), dtype=torch.int8, generator=generator).to(device)
        return lambda: torch._int_mm(a, a)
    if key == "fp8":
        a = torch.randn(n, n, generator=generator).to(device=device, dtype=torch.float8_e4m3fn)
        b = a.t()   # _scaled_mm wants the second operand column-major
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
             "fp16": torch.float16}[key]
    m = torch.randn(n, n, generator=generator).to(device=device, dtype=dtype)
    return lambda: torch.matmul(m, m)


def gemm_flops(key: str, device: torch.device) -> tuple[float, int]:
    """Measured FLOP/s of a large GEMM in dtype `key`, and the n it was measured at."""
    timed = _timer(device)
    n = START_N
    while True:
        fn = _gemm(key, n, device)
        timed(fn)   # warm-up
        fastest = min(timed(fn) for _ in range(3))
        large = n >= MIN_N[device.type] and fastest >= TARGET_CALL_S
        if large or n >= MAX_N[device.type]:
            break
        n *= 2
    seconds = statistics.median(timed(fn) for _ in range(REPEATS))
    return 2 * n**3 / seconds, n


def misaligned_share(n: int, aligned_flops: float, device: torch.device) -> float:
    """Rate of a bf16 (n, n) @ (n, n−1) product over `aligned_flops` (the (n, n) one's)."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=generator).to(device=device, dtype=torch.bfloat16)
    w = a[: n - 1].contiguous()               # an nn.Linear weight (N, K) with N = n − 1
    timed = _timer(device)
    timed(lambda: torch.nn.functional.linear(a, w))
    seconds = statistics.median(timed(lambda: torch.nn.functional.linear(a, w))
                                for _ in range(REPEATS))
    return min(1.0, 2 * n * n * (n - 1) / seconds / aligned_flops)


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of ``dst.copy_(src)``, read plus written."""
    size = COPY_BYTES[device.type]
    src = torch.ones(size // 4, device=device)
    dst = torch.empty_like(src)
    timed = _timer(device)
    timed(lambda: dst.copy_(src))
    seconds = statistics.median(timed(lambda: dst.copy_(src)) for _ in range(REPEATS))
    return 2 * size / seconds


def launch_overhead(device: torch.device) -> float:
    """Seconds per tiny op (a one-element add), dispatch and launch included."""
    x = torch.ones(1, device=device)
    add = torch.ops.aten.add.Tensor   # called as an executor calls an aten overload
    return per_call(lambda: add(x, x), device)


def per_call(fn: Callable[[], Any], device: torch.device) -> float:
    """Median seconds per call of `fn`, `LAUNCH_CALLS` in a row, synchronised once."""
    timed = _timer(device)

    def burst() -> None:
        for _ in range(LAUNCH_CALLS):
            fn()
    timed(burst)
    return statistics.median(timed(burst) for _ in range(REPEATS)) / LAUNCH_CALLS


def host_costs(device: torch.device) -> tuple[float, float]:
    """Seconds of the host per free op (a view) and per module call around its op."""
    x = torch.ones(4, 4, device=device)
    linear = torch.nn.Linear(4, 4, device=device)
    weight, bias = linear.weight.detach(), linear.bias.detach()
    free = per_call(lambda: x.view(16), device)
    with torch.no_grad():
        module = per_call(lambda: linear(x), device)
        functional = per_call(lambda: torch.nn.functional.linear(x, weight, bias), device)
    return free, max(module - functional, 0.0)


def calibrate(device: str = "cpu") -> Calibration:
    """Measure `device` ("cpu" or "cuda"): see the module docstring."""
    target = torch.device(device)
    peaks: dict[str, float] = {}
    sizes: dict[str, int] = {}
    skipped: dict[str, str] = {}
    for key in ("fp32", "tf32", "bf16", "fp16", "fp8", "int8"):
        if key == "tf32" and target.type != "cuda":
            peaks[key], skipped[key] = 0.0, "no TF32 on CPU: fp32 GEMMs run at the fp32 rate"
            continue
        try:
            with allow_tf32(key == "tf32"):
                peaks[key], sizes[key] = gemm_flops(key, target)
        except (RuntimeError, NotImplementedError, TypeError) as error:
            peaks[key], skipped[key] = 0.0, f"{type(error).__name__}: {error}"[:200]
    misaligned = (misaligned_share(sizes["bf16"], peaks["bf16"], target)
                  if peaks.get("bf16") else None)
    free_s, module_s = host_costs(target)
    return Calibration(
        device=target.type, device_name=_device_name(target), peak_flops=peaks,
        bandwidth_bytes_per_s=copy_bandwidth(target), launch_s=launch_overhead(target),
        sizes=sizes, skipped=skipped, misaligned_gemm_share=misaligned,
        host_free_s=free_s, host_module_s=module_s,
        details={"threads": torch.get_num_threads(), "torch_version": torch.__version__},
    )


class allow_tf32:
    """Allow (or forbid) TF32 matmuls on CUDA inside the block."""

    def __init__(self, on: bool) -> None:
        self.on, self.before = on, torch.backends.cuda.matmul.allow_tf32

    def __enter__(self) -> None:
        torch.backends.cuda.matmul.allow_tf32 = self.on

    def __exit__(self, *_: Any) -> None:
        torch.backends.cuda.matmul.allow_tf32 = self.before


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "cpu"
