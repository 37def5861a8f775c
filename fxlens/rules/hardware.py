"""Named devices and their specifications, from the vendors' datasheets (user files and calibrated
profiles: `fxlens.rules.device_files`).

One frozen `DeviceSpec` per device name as users type it (``--device h100``,
``--device-mem h100``): memory capacity, dense peak FLOP/s per dtype key (`DTYPE_KEYS`), memory
bandwidth, the share of those peaks real kernels reach, and a per-kernel launch cost. The
roofline (`fxlens.analyzer.time.roofline`) reads these as data; nothing here knows a model.

Units: vendors print GPU memory as "GB", but the DRAM behind it comes in power-of-two
sizes, and what the driver reports is more than the decimal reading allows (an RTX 4090
"24 GB" shows "23.68 GiB total capacity" in PyTorch's out-of-memory message,
zai-org/CogVideo#36, where 24·10⁹ B would be only 22.35 GiB). So every capacity here is the
datasheet number read as GiB (2³⁰ bytes). Bandwidths are decimal (1 TB/s = 10¹² B/s) and
FLOP/s too, as the datasheets print them.
Usable memory (`DeviceSpec.usable_bytes`): every fits verdict and memory budget compares with
what a training or inference process can allocate, not the datasheet: the driver and ECC keep
some (`reported_bytes`: the total PyTorch sees, `torch.cuda.get_device_properties().total_memory`,
printed as "total capacity" in its out-of-memory message) and each process's CUDA context and
libraries take more outside PyTorch's allocator (`context_bytes`). Reported totals, where
sourced: H100 SXM 79.11 GiB (vllm-project/vllm#27508, "NVIDIA H100 80GB HBM3"); H200 139.80
GiB (measured here: bench/gpu/runs/h200-2026-11-27-final-profile.json); A100 80 GB 79.15 GiB
(meta-pytorch/torchrec#3580: "total= 81050mb"); A100 40 GB 39.50 GiB (TianheWu/CoSeR#10);
RTX 4090 23.68 GiB (zai-org/CogVideo#36); T4 14.56 GiB with ECC on (Zheng-Chong/CatVTON#133);
B200 178.35 GiB (the CUDA device query in pytorch/ao#4002).
Others keep the datasheet figure (unsourced: `analyze calibrate` records the real one).
`CONTEXT_BYTES` = 1 GiB: nvidia-smi's per-process use less PyTorch's reserved memory was
903 and 997 MiB on the two A100 ranks of meta-pytorch/torchrec#3580 (CUDA context, cuBLAS
and NCCL buffers); a process without NCCL takes less. The caching allocator's fragmentation
(reserved but unallocated) is not modelled: the peaks are allocated bytes.

Peaks are *dense*: datasheets print tensor-core figures "with sparsity" (2:4 structured, 2×),
which dense models never get; every figure below is the sparse one halved where the datasheet
marks it so. ``fp32`` is the non-tensor (CUDA core / vector) rate; ``tf32`` is what fp32
matmuls get only when TF32 is allowed. A peak of 0 means the device has no such path
(FP8 before Hopper/Ada, BF16 and TF32 on Turing); `DeviceSpec.peak` then falls back along
`FALLBACK` and says which figure it used.

NB: achievable, not datasheet: large cuBLAS/rocBLAS GEMMs reach roughly 60–80 % of the dense
datasheet peak and streaming copies 80–90 % of the datasheet bandwidth (NVIDIA's "Matrix
Multiplication Background User's Guide" shows Hopper/Ampere GEMMs below peak; BabelStream
and NVIDIA's bandwidthTest reach ≈ 80–90 % of HBM bandwidth). `GEMM_EFFICIENCY` = 0.7 and
`BANDWIDTH_EFFICIENCY` = 0.8 are those rules of thumb; `analyze calibrate` measures the real
figures of one machine and a profile replaces both peaks and factors (factors 1.0).
Kernel classes (`KERNEL_CLASSES`): a cost rule names the class of kernel a call runs on when
it reaches a share of the peak other than `compute_efficiency` (`Cost.kernel`), and a device
lists that share in `kernel_efficiency` (a share of the *datasheet* peak, like the factors):
- ``gemm-misaligned``: a 16- or 8-bit GEMM with a leading dimension that is not a multiple of
  16 bytes (GPT-2's 50,257-token vocabulary, an odd hidden size). cuBLAS needs 16-byte aligned
  leading dimensions for its Hopper (sm90) kernels and falls back to Turing-era tensor-core
  kernels (``cutlass_75_tensorop_bf16_s1688gemm``). Measured on an H200 by bench/gpu_check.py
  (2026-11-27, torch 2.11 + CUDA 13.0): bf16 ``F.linear`` with N = 8191 or 50,257 ran at 95
  TFLOP/s, with K = 8191 at 133, where the aligned shapes ran at 705-789: 0.10-0.13 of the
  989.5 TFLOP/s dense peak; 0.1 for the Hopper entries. Other GPUs are unmeasured and keep
  `compute_efficiency` (`analyze calibrate` measures any device's own share); CPU GEMMs
  (oneDNN) showed no such cliff.
- ``attention-forward``, ``attention-backward``: fused attention kernels (flash, cuDNN,
  memory-efficient), rated on their FLOPs. Measured on an H200 by bench/gpu/attention.py
  (2026-11-27, torch 2.11 + CUDA 13.0, bf16, causal, head dim 128, one GPU's share of the
  published Llama/Qwen3 layouts: batch 1–8, 16–32 heads, 4k–8k tokens): cuDNN's fused attention
  (PyTorch's default backend there, and what Transformer Engine calls) reached 0.47–0.62 of the
  dense peak forward and 0.39–0.49 backward, FlashAttention-2 0.26–0.34 and 0.23–0.27; 0.55 and
  0.45 for the Hopper entries (cuDNN's at 8k tokens). Other GPUs are unmeasured and keep
  `compute_efficiency`; a calibrated profile measures GEMMs only, so attention runs at its
  GEMM rate there. Which fused kernel a stack runs is the user's (``--attention-kernel``,
  `DeviceSpec.with_attention`): ``cudnn`` is each device's entry above; ``flash2``
  (FlashAttention-2, PyTorch SDPA's choice on Hopper until cuDNN became its default again in
  torch 2.10 with cuDNN ≥ 9.15 — pytorch/pytorch#138522 made cuDNN opt-in after 2.5; a Dec
  2024 nightly's SDPA ran 329 TFLOP/s where cuDNN ran 631 on an H100, pytorch/pytorch#142132)
  takes the FlashAttention-2 shares measured above, 0.30 forward and 0.25 backward on the
  Hopper entries; elsewhere unmeasured, the device's entry stays.
- ``gemm-grouped``: MoE experts' grouped GEMMs (``torch._grouped_mm``). Measured on an H200 by
  bench/gpu/moe.py (2026-11-27, bf16, one GPU's experts of the published Qwen3-235B and
  DeepSeek-V3 layouts: 4 experts × 4,096 rows, hidden 4,096–7,168), the SiLU·mul and the loss
  the measured module also runs taken out by their bytes: 0.52–0.61 of the dense peak forward
  and 0.45–0.50 backward (the weight gradient reduces over the rows); Qwen3-30B's narrower
  experts about 0.3. 0.5 for the Hopper entries (forward and backward are the same op).
Dtype shares (`dtype_efficiency`): a dtype whose GEMMs reach a share of *its* peak other than
`compute_efficiency`. Hopper's fp8 GEMMs do not keep pace with their doubled peak: `analyze
calibrate` on an H200 (bench/gpu/runs/h200-2026-11-27-final-profile.json, 8192³,
``torch._scaled_mm`` e4m3 with bf16 out) reached 1,290 TFLOP/s, 0.65 of the 1,979 dense peak,
where bf16 reached 762, 0.77 of 989.5 (and aligned model GEMMs 0.71–0.80 above); 0.65 for fp8
on the Hopper entries. A kernel class's share, where it has one, comes first.
Multiprocessors (`multiprocessors`, what a plan prices overlapped communication kernels
against): 132 SMs on an H100 or H200 SXM, 114 on an H100 PCIe (NVIDIA H100 Tensor Core GPU
Architecture whitepaper), 108 on an A100 (NVIDIA A100 Tensor Core GPU Architecture
whitepaper); 0 (unknown) elsewhere.
NB: host costs of an eager run on a GPU (`fxlens.analyzer.time.host`): a CUDA kernel launch
costs ≈ 2–5 µs of CPU time and PyTorch's eager dispatch ≈ 5–10 µs per op on top. Measured
from Python on two H200 hosts (bench/gpu, 2026-11-27): 7.0–9.0 µs per ``torch.add``, 8.1–12.0
per aten overload call, 1.3–2.9 per view, and an ``nn.Linear`` call 4.4 µs over the same
``F.linear`` call. `GPU_LAUNCH_S` = 10 µs, `HOST_FREE_S` = 2 µs, `HOST_MODULE_S` = 5 µs;
`analyze calibrate` measures the machine's own. A GB200's or GB300's host is a Grace CPU
(Arm Neoverse V2), slower per call: one ``torch.nn.Linear`` forward (bf16, hidden 2,048, 8,192
tokens) cost 37.08 µs of CPU time on a GB200 against 13.48 µs on a DGX H100's Xeon Platinum
8480C (NVIDIA/TransformerEngine#2053, 2025-08-11; 33.17 µs on a GH200), so the Grace
entries' host costs are the x86 ones × 37.08 / 13.48 (`GRACE_HOST`, 2.75).
Framework launches (`framework_launch_s`, what a plan's host floor costs per kernel): a Python
training framework spends far more host time per kernel than a bare op call — its modules,
autograd, allocations, stream bookkeeping. DeepSeek-V3's published training trace
(deepseek-ai/profile-data ``train.json``, PyTorch profiler, H800, EP64, four MoE layers'
forward and backward chunks) spends 10.6 ms of host time per layer's forward and backward
outside its all-to-all waits while launching 228 kernels: 46.6 µs per kernel, its GPU busy
29.5 ms of it (bench/README.md). Grace hosts: unmeasured; the x86 figure, since a 2.75×
one (`GRACE_HOST`) would put published GB200/GB300 runs without CUDA graphs at 1.4–1.9× the
steps they ran.
Kernel boundaries (`graph_launch_s`, what a serving step pays per kernel): a decode step
replayed as one CUDA graph has no host launches, but each kernel still starts after the one
before it has drained, a gap in which nothing moves. Measured on an H100 with CUDA graphs,
about 1.3 µs per kernel (Hazy Research, "Look Ma, No Bubbles! Designing a Low-Latency
Megakernel for Llama-1B", 2025-05-27, hazyresearch.stanford.edu/blog/2025-05-27-no-bubbles,
where vLLM and SGLang reached at most half of the H100's bandwidth at batch 1 for that and
other reasons); 1.3 µs for the Hopper entries, 0 (unmeasured) for the others.
Recurrence steps (`recurrence_step_s`): one step of a chunked scan's state kernel, which walks
a sequence's chunks in order (`fxlens.rules.gdn`). Hopper entries 1.2 µs: flash-linear-
attention's kernel on an H200 took 1.17–1.27 µs per chunk and wave of programs from 2k to 32k
tokens (bench/gpu/gdn.py, 2026-11-29); Blackwell entries 1.24 µs: the slope of vLLM's B200
timings of it, roofline out (vllm-project/vllm#38981, bench/gdn_kernel.py); 0 elsewhere.

Blackwell (``b200``, ``gb200``, ``b300``, ``gb300``): peaks and memory from NVIDIA's
datasheets as the module's convention reads them — the HGX B200 column of the Blackwell
datasheet's individual GPU specifications (1,000 W: BF16 4.5, FP8 9 PFLOPS with sparsity;
180 GB at 7.7 TB/s; the figures PyTorch's inductor copied in pytorch/pytorch#193471, and the
7.7 TB/s the memory bus that the driver reports gives, pytorch/ao#4002), the GB200 NVL72
datasheet's rack figures over its 72 GPUs (1,200 W parts: BF16 360 PFLOPS with sparsity, so
2.5 dense per GPU; 13.4 TB and 576 TB/s of HBM3e, so 186 GB at 8 TB/s), and the Blackwell
Ultra datasheets' per-GPU dense figures (HGX B300 270 GB, GB300 279 GB; INT8 cut to
0.15–0.165 POPS dense). SMs: 148 on a B200 (pytorch/ao#4002's device query), 152 on a GB200's
GPU (as PyTorch reports it), 160 on Blackwell Ultra (NVIDIA technical blog "Inside NVIDIA
Blackwell Ultra", 2025). Kernel shares: attention forward 0.55 — the FlashAttention-4 paper
(Zadouri et al. 2026, arXiv:2603.05451) reaches 1,613 TFLOP/s, 0.71 of the B200's BF16 peak,
"up to 1.3×" cuDNN 9.13, which Transformer Engine calls: 0.55 for cuDNN; backward 0.45 as on
Hopper, unmeasured here — the same paper finds Blackwell's backward bound by shared-memory
traffic, whose bandwidth per SM did not grow from Hopper while the tensor cores doubled, so
its share of the peak is not above Hopper's. 16-bit GEMMs 0.65 (`BLACKWELL_DTYPES`):
measured on B200s, ``torch.mm`` in bf16 reached 0.63–0.65 of the 2.25 PFLOP/s peak at 4,096³
… 8,192³ (pytorch/ao#2427, cuBLAS), and XLA's B200 GEMM table (CUPTI kernel times,
``sm_100_B200`` in ``xla/service/gpu/model/matmul_interpolator_data.h``, ROCm/xla@d02afb4)
0.63 at 4,096³ and 0.60–0.74 over its shapes of 2³⁵ FLOPs and up. fp8 keeps
`compute_efficiency` (0.7): FlashInfer's MXFP8 GEMM reached 0.69–0.71 of the 4.5 PFLOP/s at
8,192×8,192×4,096 and 16,384³ (flashinfer-ai/flashinfer#2464), XLA's table 0.61 at 4,096³
and 0.73 batched four times. Grouped and misaligned GEMMs are unmeasured and take their
dtype's share; `analyze calibrate` on a Blackwell machine replaces them all.

Links (for plans and serving across GPUs): bandwidth per GPU inside and across nodes and the
fixed latency of a collective call, from `fxlens.rules.links` (datasheets, NCCL's and RCCL's
cost models).

The host CPU (``cpu``) has conservative defaults — a few-core laptop-class x86 — since no
datasheet describes "this machine"; `analyze calibrate --device cpu` writes a profile that
replaces them (and is used automatically when it exists: `fxlens.rules.device_files`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from fxlens.analyzer.core.sections import DeviceFigures
from fxlens.rules import links as net
from fxlens.rules.links import GB, LINK_EFFICIENCY, US, Links

GIB = 2**30
T = 1e12
DTYPE_KEYS = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")
# Where a missing (0) peak falls back to: the path the framework takes instead.
FALLBACK: Mapping[str, str] = {"tf32": "fp32", "bf16": "fp32", "fp16": "fp32", "fp8": "bf16",
                               "int8": "fp32"}
GEMM_EFFICIENCY = 0.7
BANDWIDTH_EFFICIENCY = 0.8
GPU_LAUNCH_S = 10e-6
HOST_FREE_S = 2e-6
HOST_MODULE_S = 5e-6
GRACE_HOST = 37.08 / 13.48     # a Grace host's CPU time per call over a Xeon 8480C's
FRAMEWORK_LAUNCH_S = 10.62e-3 / 228    # DeepSeek's training trace: host per kernel launched
CPU_LAUNCH_S = 5e-6
MISALIGNED_GEMM = "gemm-misaligned"
ATTENTION_FORWARD = "attention-forward"
ATTENTION_BACKWARD = "attention-backward"
GROUPED_GEMM = "gemm-grouped"
KERNEL_CLASSES = (MISALIGNED_GEMM, ATTENTION_FORWARD, ATTENTION_BACKWARD, GROUPED_GEMM)
HOPPER_KERNELS: Mapping[str, float] = {MISALIGNED_GEMM: 0.1, ATTENTION_FORWARD: 0.55,
                                       ATTENTION_BACKWARD: 0.45, GROUPED_GEMM: 0.5}
HOPPER_FLASH2: Mapping[str, float] = {ATTENTION_FORWARD: 0.30, ATTENTION_BACKWARD: 0.25}
ATTENTION_KERNELS = ("cudnn", "flash2")     # --attention-kernel; the first is every entry's
HOPPER_DTYPES: Mapping[str, float] = {"fp8": 0.65}
BLACKWELL_KERNELS: Mapping[str, float] = {ATTENTION_FORWARD: 0.55, ATTENTION_BACKWARD: 0.45}
BLACKWELL_DTYPES: Mapping[str, float] = {"bf16": 0.65, "fp16": 0.65}
HOPPER_GRAPH_LAUNCH_S = 1.3e-6
HOPPER_RECURRENCE_STEP_S = 1.2e-6
BLACKWELL_RECURRENCE_STEP_S = 1.24e-6
CONTEXT_BYTES = GIB


@dataclass(frozen=True)
class DeviceSpec:
    """One device model. ``source`` names the datasheet (or calibration) the figures come from.

    `peak_flops`: dense peak FLOP/s (OP/s for int8) per `DTYPE_KEYS` key, 0 where the device
    has no such path. `bandwidth_bytes_per_s`: memory bandwidth. The efficiencies are the
    share of those that real kernels achieve (1.0 for a calibrated profile, whose figures are
    measured). `launch_s` is added once per kernel.
    """

    name: str
    memory_bytes: int
    source: str
    peak_flops: Mapping[str, float] = field(default_factory=dict)
    bandwidth_bytes_per_s: float = 0.0
    kind: str = "gpu"                            # "gpu" or "cpu"
    compute_efficiency: float = GEMM_EFFICIENCY
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    launch_s: float = GPU_LAUNCH_S
    graph_launch_s: float = 0.0                  # per kernel of a replayed CUDA graph
    recurrence_step_s: float = 0.0               # per dependent step of a chunked scan
    framework_launch_s: float = FRAMEWORK_LAUNCH_S   # a training framework's host per kernel
    calibrated: bool = False
    gpus_per_node: int = 8
    intra_node_bytes_per_s: float = 0.0          # per GPU, one direction (NVLink, PCIe)
    inter_node_bytes_per_s: float = 0.0          # per GPU, one direction (the node's network)
    link_source: str = ""
    link_kind: str = ""                          # "nvlink", "pcie" (`links.RING_PROTOCOLS`)
    collective_base_s: float = net.NCCL_BASE_US * US     # a collective call's fixed latency
    intra_node_hop_s: float = 0.0                # per ring step inside a node
    inter_node_hop_s: float = net.NCCL_NET_HOP_US * US   # per ring step across nodes
    kernel_efficiency: Mapping[str, float] = field(default_factory=dict)   # class → share
    dtype_efficiency: Mapping[str, float] = field(default_factory=dict)    # dtype key → share
    host_free_s: float = HOST_FREE_S         # the host per free op (view), GPU timeline
    host_module_s: float = HOST_MODULE_S     # the host per module call, GPU timeline
    reported_bytes: int = 0                  # what the driver gives PyTorch; 0: memory_bytes
    multiprocessors: int = 0                 # SMs (CUs); 0: unknown
    collective_sms: int = 0                  # SMs an NCCL collective holds; 0: unknown
    context_bytes: int = 0                   # per process outside PyTorch's allocator
    flash2_efficiency: Mapping[str, float] = field(default_factory=dict)   # --attention-kernel

    @property
    def driver_bytes(self) -> int:
        """The total the driver gives a process (the datasheet's where not sourced)."""
        return self.reported_bytes or self.memory_bytes

    @property
    def usable_bytes(self) -> int:
        """What one process can allocate: the driver's total less the CUDA context (module
        docstring); every fits verdict and memory budget reads this."""
        return max(self.driver_bytes - self.context_bytes, 0)

    def with_usable(self, usable_bytes: int) -> DeviceSpec:
        """This device with exactly `usable_bytes` to allocate (a budget as given)."""
        return replace(self, memory_bytes=usable_bytes, reported_bytes=0, context_bytes=0)

    def with_attention(self, kernel: str) -> DeviceSpec:
        """This device running `kernel` (`ATTENTION_KERNELS`) as its fused attention: its
        measured FlashAttention-2 shares for ``flash2`` (unchanged where unmeasured)."""
        if kernel != "flash2" or not self.flash2_efficiency:
            return self
        return replace(self, kernel_efficiency={**self.kernel_efficiency,
                                                **self.flash2_efficiency},
                       source=f"{self.source}; attention on FlashAttention-2")

    def peak(self, key: str) -> tuple[float, str]:
        """Datasheet dense FLOP/s for dtype `key` and the key whose figure it is (after
        `FALLBACK` for a path the device lacks)."""
        seen = key
        while self.peak_flops.get(seen, 0.0) <= 0.0 and seen in FALLBACK:
            seen = FALLBACK[seen]
        return self.peak_flops.get(seen, 0.0), seen

    def achievable_flops(self, key: str, kernel: str = "") -> float:
        """FLOP/s real kernels reach at dtype `key`; a kernel class of `kernel_efficiency`
        (e.g. ``gemm-misaligned``) reaches its own share of the peak."""
        share = self.kernel_efficiency.get(
            kernel, self.dtype_efficiency.get(key, self.compute_efficiency))
        return self.peak(key)[0] * share

    @property
    def achievable_bandwidth(self) -> float:
        return self.bandwidth_bytes_per_s * self.bandwidth_efficiency

    def link_bytes_per_s(self, within_node: bool) -> float:
        """Achievable bandwidth per GPU of a collective inside one node or across nodes."""
        raw = self.intra_node_bytes_per_s if within_node else self.inter_node_bytes_per_s
        return raw * LINK_EFFICIENCY

    def collective_latency_s(self, steps_inside: int, steps_across: int = 0) -> float:
        """The fixed seconds of one collective call whose ring takes `steps_inside` steps
        over the node's links and `steps_across` over the network (`fxlens.rules.links`);
        0 for no step (a group of one)."""
        if steps_inside + steps_across <= 0:
            return 0.0
        return (self.collective_base_s + steps_inside * self.intra_node_hop_s
                + steps_across * self.inter_node_hop_s)

    def figures(self) -> DeviceFigures:
        """The figures a roofline records (the link figures go with a plan instead)."""
        known = {f.name for f in fields(DeviceFigures)}
        return DeviceFigures(**{k: v for k, v in self.to_json().items() if k in known},
                             usable_bytes=self.usable_bytes)

    def to_json(self) -> dict[str, Any]:
        return {f.name: (dict(getattr(self, f.name)) if f.name in _MAPPINGS
                         else getattr(self, f.name)) for f in fields(self)}


_MAPPINGS = ("peak_flops", "kernel_efficiency", "dtype_efficiency", "flash2_efficiency")


def _gpu(name: str, memory_gib: int, tflops: tuple[float, ...], bandwidth_tb_s: float,
         source: str, links: Links, kernels: Mapping[str, float] | None = None,
         reported_gib: float = 0.0, dtypes: Mapping[str, float] | None = None,
         multiprocessors: int = 0, graph_launch_s: float = 0.0, recurrence_step_s: float = 0.0,
         host: float = 1.0, flash2: Mapping[str, float] | None = None) -> DeviceSpec:
    """`tflops`: dense TFLOP/s in `DTYPE_KEYS` order (fp32, tf32, bf16, fp16, fp8, int8);
    `kernels`: the kernel classes' shares of the peak (`KERNEL_CLASSES`); `reported_gib`:
    the total the driver gives PyTorch where sourced (module docstring); `host`: the host
    CPU's time per call over an x86 server's (`GRACE_HOST` for Grace)."""
    assert len(tflops) == len(DTYPE_KEYS)
    peaks = {k: v * T for k, v in zip(DTYPE_KEYS, tflops, strict=True)}
    return DeviceSpec(name, memory_gib * GIB, source, peaks, bandwidth_tb_s * T,
                      reported_bytes=round(reported_gib * GIB), context_bytes=CONTEXT_BYTES,
                      multiprocessors=multiprocessors, graph_launch_s=graph_launch_s,
                      recurrence_step_s=recurrence_step_s,
                      launch_s=GPU_LAUNCH_S * host, host_free_s=HOST_FREE_S * host,
                      host_module_s=HOST_MODULE_S * host,
                      kernel_efficiency=dict(kernels or {}), dtype_efficiency=dict(dtypes or {}),
                      gpus_per_node=links.gpus_per_node,
                      intra_node_bytes_per_s=links.intra_gb_s * GB,
                      inter_node_bytes_per_s=links.inter_gb_s * GB, link_source=links.source,
                      link_kind=links.kind,
                      collective_base_s=links.base_us * US,
                      intra_node_hop_s=links.intra_hop_us * US,
                      inter_node_hop_s=links.inter_hop_us * US,
                      collective_sms=links.collective_sms, flash2_efficiency=dict(flash2 or {}))


DEVICES: Mapping[str, DeviceSpec] = {d.name: d for d in (
    # Tensor-core figures on NVIDIA datasheets are "with sparsity": halved here.
    #               fp32   tf32    bf16    fp16    fp8     int8     TB/s
    _gpu("h100", 80, (67, 494.5, 989.5, 989.5, 1979, 1979), 3.35,
         "NVIDIA H100 Tensor Core GPU Datasheet (H100 SXM5, 80 GB HBM3; dense = sparse / 2)",
         net.DGX_H100, HOPPER_KERNELS, reported_gib=79.11, dtypes=HOPPER_DTYPES,
         multiprocessors=132, graph_launch_s=HOPPER_GRAPH_LAUNCH_S, flash2=HOPPER_FLASH2,
         recurrence_step_s=HOPPER_RECURRENCE_STEP_S),
    _gpu("h100-pcie", 80, (51, 378, 756.5, 756.5, 1513, 1513), 2.0,
         "NVIDIA H100 Tensor Core GPU Datasheet (H100 PCIe, 80 GB HBM2e; dense = sparse / 2)",
         net.PCIE5_NODE, HOPPER_KERNELS, dtypes=HOPPER_DTYPES, multiprocessors=114,
         graph_launch_s=HOPPER_GRAPH_LAUNCH_S, flash2=HOPPER_FLASH2,
         recurrence_step_s=HOPPER_RECURRENCE_STEP_S),
    _gpu("h200", 141, (67, 494.5, 989.5, 989.5, 1979, 1979), 4.8,
         "NVIDIA H200 Tensor Core GPU Datasheet (H200 SXM, 141 GB HBM3e; dense = sparse / 2)",
         net.DGX_H100, HOPPER_KERNELS, reported_gib=139.80, dtypes=HOPPER_DTYPES,
         multiprocessors=132, graph_launch_s=HOPPER_GRAPH_LAUNCH_S, flash2=HOPPER_FLASH2,
         recurrence_step_s=HOPPER_RECURRENCE_STEP_S),
    # Blackwell (see the module docstring for each figure's source). INT8 on Blackwell Ultra
    # (B300, GB300) runs at a small fraction of its FP8 rate.
    _gpu("b200", 180, (75, 1125, 2250, 2250, 4500, 4500), 7.7,
         "NVIDIA Blackwell datasheet, individual GPU specifications (HGX B200, 1,000 W, 180 GB "
         "HBM3e, 7.7 TB/s; dense = sparse / 2)", net.DGX_B200, BLACKWELL_KERNELS,
         reported_gib=178.35, dtypes=BLACKWELL_DTYPES, multiprocessors=148,
         recurrence_step_s=BLACKWELL_RECURRENCE_STEP_S),
    _gpu("gb200", 186, (80, 1250, 2500, 2500, 5000, 5000), 8.0,
         "NVIDIA GB200 NVL72 datasheet (per GPU: the rack's figures / 72; 13.4 TB HBM3e, "
         "576 TB/s; dense = sparse / 2)", net.GB200_NVL72, BLACKWELL_KERNELS,
         dtypes=BLACKWELL_DTYPES, multiprocessors=152, host=GRACE_HOST,
         recurrence_step_s=BLACKWELL_RECURRENCE_STEP_S),
    _gpu("b300", 270, (75, 1100, 2250, 2250, 4500, 150), 7.7,
         "NVIDIA Blackwell Ultra datasheet, individual GPU specifications (HGX B300, 270 GB "
         "HBM3e; dense figures)", net.DGX_B300, BLACKWELL_KERNELS, dtypes=BLACKWELL_DTYPES,
         multiprocessors=160, recurrence_step_s=BLACKWELL_RECURRENCE_STEP_S),
    _gpu("gb300", 279, (80, 1250, 2500, 2500, 5000, 165), 8.0,
         "NVIDIA GB300 NVL72 datasheet (per GPU: 279 GB HBM3e, 8 TB/s; dense figures)",
         net.GB300_NVL72, BLACKWELL_KERNELS, dtypes=BLACKWELL_DTYPES, multiprocessors=160,
         host=GRACE_HOST, recurrence_step_s=BLACKWELL_RECURRENCE_STEP_S),
    # Ampere: no FP8. A100 SXM bandwidth: 1,555 GB/s (40 GB), 2,039 GB/s (80 GB).
    _gpu("a100-40gb", 40, (19.5, 156, 312, 312, 0, 624), 1.555,
         "NVIDIA A100 Tensor Core GPU Datasheet (A100 SXM 40 GB HBM2; dense figures)",
         net.DGX_A100, reported_gib=39.50, multiprocessors=108),
    _gpu("a100-80gb", 80, (19.5, 156, 312, 312, 0, 624), 2.039,
         "NVIDIA A100 Tensor Core GPU Datasheet (A100 SXM 80 GB HBM2e; dense figures)",
         net.DGX_A100, reported_gib=79.15, multiprocessors=108),
    _gpu("l4", 24, (30.3, 60, 121, 121, 242.5, 242.5), 0.3,
         "NVIDIA L4 Tensor Core GPU Datasheet (24 GB GDDR6; dense = sparse / 2)", net.CLOUD_G2),
    _gpu("l40s", 48, (91.6, 183, 362.05, 362.05, 733, 733), 0.864,
         "NVIDIA L40S GPU Datasheet (48 GB GDDR6 with ECC, 864 GB/s; dense = sparse / 2)",
         net.CLOUD_G6E),
    # NB: AWS publishes no per-dtype peaks for its A10G; these are the NVIDIA A10 datasheet's
    # (same GA102 die and 24 GB GDDR6 at 600 GB/s); calibrate an A10G for its own figures.
    _gpu("a10g", 24, (31.2, 62.5, 125, 125, 0, 250), 0.6,
         "Amazon EC2 G5 instance specifications (NVIDIA A10G, 24 GB GDDR6); peaks from the "
         "NVIDIA A10 Tensor Core GPU Datasheet (dense = sparse / 2)", net.CLOUD_G5),
    # Turing: no TF32, BF16 or FP8; 65 FP16 TFLOPS and 130 INT8 TOPS are dense.
    _gpu("t4", 16, (8.1, 0, 0, 65, 0, 130), 0.32,
         "NVIDIA T4 Tensor Core GPU Datasheet (16 GB GDDR6)", net.CLOUD_G4DN,
         reported_gib=14.56),
    # GeForce: FP16/BF16 with FP32 accumulate (what PyTorch uses) runs at half the FP16-accumulate
    # rate: 165.2 dense; FP8 and INT8 660.6 dense.
    _gpu("rtx4090", 24, (82.6, 82.6, 165.2, 165.2, 660.6, 660.6), 1.008,
         "NVIDIA GeForce RTX 4090 specifications (24 GB GDDR6X) and NVIDIA Ada GPU "
         "Architecture whitepaper, Appendix A (dense, FP32 accumulate)", net.WORKSTATION,
         reported_gib=23.68),
    # NB: fp32 is MI300X's FP32 *matrix* rate (163.4; vector 81.7): rocBLAS runs fp32 GEMMs on
    # the matrix cores. Dense = the sparsity figure halved.
    _gpu("mi300x", 192, (163.4, 653.7, 1307.4, 1307.4, 2614.9, 2614.9), 5.3,
         "AMD Instinct MI300X Accelerator Data Sheet (192 GB HBM3, 5.3 TB/s; dense figures)",
         net.MI300X_PLATFORM),
)}

ALIASES: Mapping[str, str] = {"h100-sxm": "h100", "h200-sxm": "h200", "a100": "a100-80gb",
                              "a10": "a10g", "4090": "rtx4090", "gb200-nvl72": "gb200",
                              "gb300-nvl72": "gb300"}


def host_cpu() -> DeviceSpec:
    """The host CPU with conservative defaults.

    NB: 100 GFLOP/s fp32 (≈ 2 AVX2 FMA cores at 3 GHz reach 190; MKL/oneDNN get ~70 % of
    that), bf16/fp16 at a quarter (no AMX/AVX512-FP16 assumed: converted to fp32 on the fly),
    int8 at the fp32 rate, 10 GB/s copy bandwidth (one or two cores of a dual-channel
    DDR4 system; STREAM copy on such a host is 10–20 GB/s). Calibrate to replace them.
    """
    peaks = {"fp32": 1e11, "tf32": 0.0, "bf16": 2.5e10, "fp16": 2.5e10, "fp8": 0.0,
             "int8": 1e11}
    return DeviceSpec("cpu", _host_memory_bytes(), "conservative defaults for the host CPU "
                      "(fxlens.rules.hardware.host_cpu); run `analyze calibrate --device cpu`",
                      peaks, 1e10, kind="cpu", compute_efficiency=1.0, bandwidth_efficiency=1.0,
                      launch_s=CPU_LAUNCH_S, gpus_per_node=1, inter_node_bytes_per_s=10 / 8 * GB,
                      link_source="one host per node; 10 Gb Ethernet between hosts (assumed)")


def _host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 16 * GIB


def device(name: str, extra: Mapping[str, DeviceSpec] | None = None) -> DeviceSpec:
    """The device called `name` (case-insensitive; `extra` first, e.g. from a user file), or
    a ValueError listing the known ones."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if extra and key in extra:
        return extra[key]
    if key == "cpu":
        return host_cpu()
    try:
        return DEVICES[key]
    except KeyError:
        known = ", ".join(sorted({*DEVICES, "cpu", *(extra or {})}))
        raise ValueError(f"unknown device {name!r}; known devices: {known}") from None
