"""The links between GPUs a device model carries (`fxlens.rules.hardware.DeviceSpec`): their
bandwidth per GPU and the fixed latency of a collective call over them.

Bandwidth: `Links.intra_gb_s` is one GPU's bandwidth to its node's peers in one direction
(NVLink, Infinity Fabric, or PCIe where there is none: the datasheets' bidirectional totals
halved); `Links.inter_gb_s` one GPU's share of its node's network in one direction (one
400 Gb/s NIC per GPU on DGX H100/H200 and MI300X platforms, 200 Gb/s on DGX A100; cloud
instances share one NIC between all GPUs). Gigabits are divided by 8.
NB: `LINK_EFFICIENCY` = 0.8: NCCL's bus bandwidth in nccl-tests reaches ≈ 75–90 % of the link
rate for large messages.

Latency: a collective call costs a fixed time before its bytes move — the launch and the
synchronisation of the ranks — plus a hop latency per step of its ring (an all-reduce over n
GPUs takes 2(n − 1) steps, a reduce-scatter or all-gather n − 1). The figures are the ones
the communication library itself times collectives with when it picks an algorithm: NCCL
2.20.3's cost model (NVIDIA/nccl@b6475625, ``src/graph/tuning.cc``: ring, low-latency "LL"
protocol, the fastest for small messages) has a base of 6.6 µs per call and 0.6 µs per step
over NVLink, 1.0 µs over PCIe and 2.7 µs over the network; RCCL's (ROCm/rccl@0023b9b0, the
same file) 20.5 µs and 2.3 µs per step over Infinity Fabric (xGMI), 2.0 µs over the network.
So a 2-GPU all-reduce of a few KiB over NVLink costs 7.8 µs, an 8-GPU one 15 µs: what a
decode step's tensor-parallel all-reduces are made of. A collective's time is its latency
plus its ring bytes at the link bandwidth (`fxlens.analyzer.plan.transfers.collective_s`).
NB: the latency model's α (the LL protocol's) and the bandwidth's β (the bulk protocol's) are
each the best the library has; near the size where it switches protocols the sum is a little
optimistic. Engines' own one-shot all-reduce kernels for small messages (TensorRT-LLM's,
vLLM's custom all-reduce) are not modelled separately.

Protocols (`RING_PROTOCOLS`, what serving's tensor-parallel all-reduces are timed with): the
same cost model prices each of NCCL's three ring protocols and runs the fastest for the size
at hand. LL (the latency above) moves its data at a quarter of the bus bandwidth for an
all-reduce (half of each 8-byte line is a flag, and it cannot use the full link), capped at
87.7 GB/s in one node (``llMaxBws``, Ampere and Hopper); LL128 costs 14 µs a call and 1.9 µs a
ring step over NVLink at 0.92 of the bus bandwidth (120 of 128 bytes are data; enabled over
NVLink only); Simple 8.4 µs and 3.4 µs a step (5.7 over PCIe) at the full bus bandwidth. So
a 4 MiB all-reduce over 4 NVLink GPUs costs 44 µs (LL128), not the 28 µs of LL's latency with
Simple's bandwidth; a few KiB still cost LL's 10 µs. `link_kind` says which hop figures a
node's links take ("nvlink", "pcie"; "" where NCCL's table does not apply — RCCL's Infinity
Fabric keeps the single figure above).
NB: within one node only, ring algorithm only (NCCL's tree and NVLS are not priced: at the
sizes of a decode step's all-reduces its model picks a ring).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GB = 1e9
US = 1e-6
LINK_EFFICIENCY = 0.8

# NCCL 2.20.3's cost model (src/graph/tuning.cc): ring/LL base latency and per-step hop
# latencies by link kind; RCCL's for AMD's Infinity Fabric platforms.
NCCL_BASE_US = 6.6
NVLINK_HOP_US = 0.6
PCIE_HOP_US = 1.0
NCCL_NET_HOP_US = 2.7
RCCL_BASE_US = 20.5
XGMI_HOP_US = 2.3
RCCL_NET_HOP_US = 2.0


@dataclass(frozen=True)
class RingProtocol:
    """One of NCCL's ring protocols (2.20.3's ``src/graph/tuning.cc``): µs per call, µs per
    ring step by link kind (a kind left out: the protocol is off there), the share of the bus
    bandwidth an all-reduce moves its data at, and a cap on that in GB/s."""

    name: str
    base_us: float
    hop_us: Mapping[str, float]
    bandwidth_share: float
    max_gb_s: float = float("inf")


RING_PROTOCOLS = (
    RingProtocol("LL", NCCL_BASE_US, {"nvlink": NVLINK_HOP_US, "pcie": PCIE_HOP_US}, 1 / 4,
                 87.7),
    RingProtocol("LL128", 14.0, {"nvlink": 1.9}, 0.92),
    RingProtocol("Simple", 8.4, {"nvlink": 3.4, "pcie": 5.7}, 1.0),
)


def ring_all_reduce_options(link_kind: str, n: int, bus_bytes_per_s: float
                            ) -> tuple[tuple[float, float], ...]:
    """(fixed seconds, bytes/s) of one all-reduce call over `n` GPUs of one node per
    protocol NCCL can run over `link_kind` (() where its table does not apply): a call of
    S bytes takes ``seconds + 2(n − 1)/n · S / bytes_per_s`` and NCCL runs the fastest."""
    steps = 2 * (n - 1)
    return tuple(((p.base_us + steps * p.hop_us[link_kind]) * US,
                  min(bus_bytes_per_s * p.bandwidth_share, p.max_gb_s * GB))
                 for p in RING_PROTOCOLS if link_kind in p.hop_us and n > 1)


@dataclass(frozen=True)
class Links:
    """A GPU's links: GPUs per node, GB/s per GPU in one direction inside and across nodes,
    and the latency of a collective (µs per call, µs per ring step inside and across)."""

    gpus_per_node: int
    intra_gb_s: float
    inter_gb_s: float
    source: str
    base_us: float = NCCL_BASE_US
    intra_hop_us: float = NVLINK_HOP_US
    inter_hop_us: float = NCCL_NET_HOP_US
    kind: str = "nvlink"                 # the node's links, for `RING_PROTOCOLS`
    collective_sms: int = 0        # SMs an NCCL collective holds at full speed; 0: unknown


_NCCL = "; collective latency from NCCL 2.20.3's cost model"
_PCIE: dict[str, Any] = {"intra_hop_us": PCIE_HOP_US, "kind": "pcie"}

# NVLink totals on the datasheets are bidirectional: halved. PCIe Gen4 x16 ≈ 32 GB/s and Gen5
# x16 ≈ 64 GB/s per direction; Gen3 x16 ≈ 16.
# NCCL on a DGX (8 NICs) runs a collective on 16 SMs, one CTA per channel, none shared with
# compute kernels (NCCL's maintainer, NVIDIA/nccl#689)
_DGX_SMS: dict[str, Any] = {"collective_sms": 16}
DGX_H100 = Links(8, 450, 50, "NVLink 4: 900 GB/s bidirectional per GPU (H100/H200 SXM "
                 "datasheets); DGX H100: one 400 Gb/s ConnectX-7 per GPU" + _NCCL, **_DGX_SMS)
DGX_A100 = Links(8, 300, 25, "NVLink 3: 600 GB/s bidirectional per GPU (A100 datasheet); "
                 "DGX A100: one 200 Gb/s HDR InfiniBand per GPU" + _NCCL, **_DGX_SMS)
PCIE5_NODE = Links(8, 64, 50, "PCIe Gen5 x16 (the NVLink bridge joins pairs only); one "
                   "400 Gb/s NIC per GPU" + _NCCL, **_PCIE)
CLOUD_G2 = Links(8, 32, 100 / 8 / 8, "PCIe Gen4 x16; 8 GPUs sharing 100 Gb/s (GCP "
                 "g2-standard-96)" + _NCCL, **_PCIE)
CLOUD_G5 = Links(8, 32, 100 / 8 / 8, "PCIe Gen4 x16; 8 GPUs sharing 100 Gb/s (AWS "
                 "g5.48xlarge)" + _NCCL, **_PCIE)
CLOUD_G6E = Links(8, 32, 400 / 8 / 8, "PCIe Gen4 x16; 8 GPUs sharing 400 Gb/s (AWS "
                  "g6e.48xlarge)" + _NCCL, **_PCIE)
CLOUD_G4DN = Links(4, 16, 50 / 8 / 4, "PCIe Gen3 x16; 4 GPUs sharing 50 Gb/s (AWS "
                   "g4dn.12xlarge)" + _NCCL, **_PCIE)
WORKSTATION = Links(4, 32, 10 / 8, "PCIe Gen4 x16, no NVLink; 10 Gb Ethernet between "
                    "machines" + _NCCL, **_PCIE)
# Blackwell: NVLink 5 moves 1.8 TB/s bidirectional per GPU. HGX/DGX B200: 8 GPUs per NVLink
# domain, one 400 Gb/s ConnectX-7 per GPU; B300: ConnectX-8 at 800 Gb/s. GB200/GB300 NVL72:
# the NVLink switch system joins all 72 GPUs of a rack in one domain (a "node" here is that
# domain), ConnectX-7 (GB200) or ConnectX-8 (GB300) per GPU to the rest of the cluster.
DGX_B200 = Links(8, 900, 50, "NVLink 5: 1.8 TB/s bidirectional per GPU (HGX B200 "
                 "datasheet); DGX B200: one 400 Gb/s ConnectX-7 per GPU" + _NCCL, **_DGX_SMS)
DGX_B300 = Links(8, 900, 100, "NVLink 5: 1.8 TB/s bidirectional per GPU (HGX B300 "
                 "datasheet); one 800 Gb/s ConnectX-8 per GPU" + _NCCL, **_DGX_SMS)
GB200_NVL72 = Links(72, 900, 50, "NVLink 5 switch system: 72 GPUs in one NVLink domain, "
                    "1.8 TB/s bidirectional per GPU (GB200 NVL72 datasheet: 130 TB/s); one "
                    "400 Gb/s ConnectX-7 per GPU between racks" + _NCCL, **_DGX_SMS)
GB300_NVL72 = Links(72, 900, 100, "NVLink 5 switch system: 72 GPUs in one NVLink domain, "
                    "1.8 TB/s bidirectional per GPU (GB300 NVL72 datasheet: 130 TB/s); one "
                    "800 Gb/s ConnectX-8 per GPU between racks" + _NCCL, **_DGX_SMS)
MI300X_PLATFORM = Links(8, 448, 50, "Infinity Fabric: 7 links × 128 GB/s bidirectional per GPU "
                        "(MI300X data sheet); one 400 Gb/s NIC per GPU; collective latency "
                        "from RCCL's cost model", RCCL_BASE_US, XGMI_HOP_US, RCCL_NET_HOP_US,
                        kind="")
