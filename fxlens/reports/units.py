"""Formatting at the edge: SI prefixes for counts (FLOPs, params), binary for bytes, SI
sub-units for seconds, and op names shortened for tables and labels.

Reports hold integers in base units; only renderers call these.
"""

from __future__ import annotations

_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_BINARY = ((2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def si(value: float, unit: str = "") -> str:
    """``1234567`` → ``1.23 M`` (SI, powers of 1000); below 1000 a whole number stays whole
    and a fraction keeps three significant digits (``6.65``)."""
    for scale, prefix in _SI:
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    text = f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"
    return f"{text} {unit}".rstrip()


def binary_bytes(value: float) -> str:
    """``1536`` → ``1.50 KiB`` (binary, powers of 1024)."""
    for scale, unit in _BINARY:
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def seconds(value: float) -> str:
    """``0.00123`` → ``1.23 ms``; below a microsecond whole ``ns`` (zero is ``0 ns``)."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value * 1e9:.0f} ns"


def short_op(target: str) -> str:
    """``aten.addmm.default`` → ``addmm``; ``aten.add.Tensor`` → ``add.Tensor``. A kernel the
    capture took on the CPU by its CPU name (``_scaled_dot_product_flash_attention_for_cpu``)
    is shown by the kernel it stands for, which is what a GPU estimate times."""
    return target.removeprefix("aten.").removesuffix(".default").replace("_for_cpu", "")
