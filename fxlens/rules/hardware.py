"""Named accelerators and their specifications, from the vendors' datasheets.

One frozen `DeviceSpec` per device name as users type it (``--device-mem h100``); only the
memory capacity today, more fields (peak FLOP/s per dtype, bandwidth) are to come with the
roofline.

Units: vendors print GPU memory as "GB", but the DRAM behind it comes in power-of-two
sizes, and what the driver reports is more than the decimal reading allows (an RTX 4090
"24 GB" shows "23.68 GiB total capacity" in PyTorch's out-of-memory message,
zai-org/CogVideo#36, where 24·10⁹ B would be only 22.35 GiB). So every figure here is the
datasheet number read as GiB (2³⁰ bytes).
NB: the capacity a program can use is smaller: the driver and ECC reserve some (≈ 79.1 GiB
of an "80 GB" H100 or A100, ≈ 14.7 GiB of a T4 with ECC on, as torch reports them), and a
CUDA context takes a few hundred MiB more. Keep some of the headroom `fits` reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator model. ``source`` names the datasheet the figures come from."""

    name: str
    memory_bytes: int
    source: str


def _spec(name: str, memory_gib: int, source: str) -> DeviceSpec:
    return DeviceSpec(name, memory_gib * GIB, source)


DEVICES: Mapping[str, DeviceSpec] = {d.name: d for d in (
    # H100 SXM5 and PCIe both 80 GB (H100 NVL: 94 GB)
    _spec("h100", 80, "NVIDIA H100 Tensor Core GPU Datasheet (H100 SXM, 80 GB HBM3)"),
    _spec("h200", 141, "NVIDIA H200 Tensor Core GPU Datasheet (141 GB HBM3e)"),
    _spec("a100-40gb", 40, "NVIDIA A100 Tensor Core GPU Datasheet (40 GB HBM2)"),
    _spec("a100-80gb", 80, "NVIDIA A100 Tensor Core GPU Datasheet (80 GB HBM2e)"),
    _spec("l4", 24, "NVIDIA L4 Tensor Core GPU Datasheet (24 GB GDDR6)"),
    # AWS's variant of the A10; same memory as the NVIDIA A10 datasheet
    _spec("a10g", 24, "Amazon EC2 G5 instance specifications (NVIDIA A10G, 24 GB GDDR6)"),
    _spec("t4", 16, "NVIDIA T4 Tensor Core GPU Datasheet (16 GB GDDR6)"),
    _spec("rtx4090", 24, "NVIDIA GeForce RTX 4090 specifications (24 GB GDDR6X)"),
    _spec("mi300x", 192, "AMD Instinct MI300X Accelerator Data Sheet (192 GB HBM3)"),
)}


def device(name: str) -> DeviceSpec:
    """The device called `name` (case-insensitive), or a ValueError listing the known ones."""
    try:
        return DEVICES[name.strip().lower()]
    except KeyError:
        known = ", ".join(sorted(DEVICES))
        raise ValueError(f"unknown device {name!r}; known devices: {known}") from None
