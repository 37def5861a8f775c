"""The roofline: per-node time estimates from a report's FLOPs and bytes and a device's figures.

No op knowledge lives here and no device either: the device comes in as data (any object
with the `Device` protocol, e.g. `fxlens.rules.hardware.DeviceSpec`). Per costed node:

    time_s = max(flops / achievable peak of the node's dtype, bytes / achievable bandwidth)
             + serial steps × ⌈programs / multiprocessors⌉ × the device's recurrence step
             + one kernel launch                          (a CPU: the host is the device)
    time_s = what the kernel adds to the GPU's timeline   (a GPU: the host issues kernels
             while earlier ones run, `fxlens.analyzer.time.host`)

Free nodes (views, metadata) cost nothing; unsupported or failed ones are counted apart
(`uncosted_nodes`) and cost nothing either. Arithmetic intensity is FLOPs per byte moved;
``bound`` says which term of the max won, or ``launch`` when the launch outweighs both. The
serial term is a recurrence's latency (a kernel that walks a sequence's chunks in order, each
step waiting on the last, `fxlens.rules.gdn`): the work of a step does not hide it, so it adds;
0 on a device whose step is unmeasured. ``bound`` is ``latency`` where it outweighs the work
(more sequences or heads in flight shorten it, less traffic does not).
Nodes roll up per module (each ancestor too), per phase (forward/backward of a training step)
and in total, and the section adds throughput at the captured batch, the MFU it implies and
the top time hotspots beside the top FLOPs ones.

Which peak applies: the dtype of the node's first floating-point input (what feeds the
multipliers), else of its first output; ``float32`` uses the ``tf32`` peak only when the user
allows TF32 (`tf32=True`), as PyTorch does (``torch.backends.cuda.matmul.allow_tf32`` is off
by default).
NB: one peak per dtype for every op: an elementwise or reduction op in bf16 is rated at the
bf16 tensor-core peak, which it never reaches; such ops are memory-bound at realistic sizes,
so the bandwidth term decides them anyway. float64, int64 and bool ops use the fp32 peak.
NB: a training step adds the optimizer step: its FLOPs at the fp32 peak or the bytes its
policy moves (`Training.optimizer_step_bytes`: torch.optim's multi-tensor step reads and writes
the states several times, `fxlens.rules.training`), whichever takes longer, one launch per
trainable tensor.
NB: MFU = model FLOPs (the graph's, optimizer excluded) / predicted time / the *datasheet*
peak of the dtype carrying most FLOPs; a roofline prediction therefore never exceeds the
device's achievable factor (e.g. 0.7).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from fxlens.analyzer.core.costs import Recurrence, waves
from fxlens.analyzer.core.graph import Graph, Node, TensorSpec, ancestors
from fxlens.analyzer.core.report import NodeReport, Report
from fxlens.analyzer.core.sections import (
    DeviceFigures,
    Hotspots,
    ModuleTiming,
    NodeTiming,
    OpTiming,
    Roofline,
    RooflineSettings,
    RooflineTotals,
    Throughput,
    Training,
)
from fxlens.analyzer.time.host import HostCosts, Issue, gpu_timeline

HOTSPOTS = 10
FLOAT_KEYS: Mapping[str, str] = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class Device(Protocol):
    """What the roofline reads of a device (`fxlens.rules.hardware.DeviceSpec` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def launch_s(self) -> float: ...
    @property
    def graph_launch_s(self) -> float: ...
    @property
    def recurrence_step_s(self) -> float: ...
    @property
    def multiprocessors(self) -> int: ...
    @property
    def calibrated(self) -> bool: ...
    @property
    def kind(self) -> str: ...
    @property
    def host_free_s(self) -> float: ...
    @property
    def host_module_s(self) -> float: ...

    def peak(self, key: str) -> tuple[float, str]: ...
    def achievable_flops(self, key: str, kernel: str = "") -> float: ...
    @property
    def achievable_bandwidth(self) -> float: ...
    def figures(self) -> DeviceFigures: ...


@dataclass(frozen=True)
class NodeTime:
    id: int
    time_s: float
    bound: str           # "compute", "memory", "latency" (a recurrence's serial steps
                         # outweigh the work), "launch" (the launch outweighs the work),
                         # "free" or "uncosted"
    intensity: float     # FLOPs per byte moved; 0 when nothing moves
    dtype_key: str
    compute_s: float = 0.0
    memory_s: float = 0.0
    serial_s: float = 0.0    # a recurrence's dependent steps (`serial_seconds`)

    @property
    def work_s(self) -> float:
        """What the kernel keeps the GPU busy for: its roofline and its recurrence's steps."""
        return max(self.compute_s, self.memory_s) + self.serial_s

    @property
    def work_bound(self) -> str:
        """Which part of the work is largest: "compute", "memory" or "latency"."""
        if self.serial_s > max(self.compute_s, self.memory_s):
            return "latency"
        return "compute" if self.compute_s > self.memory_s else "memory"


def serial_seconds(recurrence: Recurrence | None, device: Device) -> float:
    """The latency of a recurrence on `device`: its dependent steps, once per wave of its
    programs over the multiprocessors; 0 where the device's step is unmeasured."""
    if recurrence is None or recurrence.steps <= 0 or device.recurrence_step_s <= 0:
        return 0.0
    return (recurrence.steps * waves(recurrence.programs, device.multiprocessors)
            * device.recurrence_step_s)


def dtype_key(dtype: str, tf32: bool = False) -> str:
    """The `DTYPE_KEYS` figure a tensor of torch dtype `dtype` is computed at."""
    if dtype == "float32":
        return "tf32" if tf32 else "fp32"
    if dtype.startswith("float8"):
        return "fp8"
    if dtype in ("int8", "uint8"):
        return "int8"
    return FLOAT_KEYS.get(dtype, "fp32")


def node_dtype(node: Node, graph: Graph) -> str:
    """The first floating-point input's dtype, else the first output's, else float32."""
    specs = [graph.spec(ref) for ref in node.input_refs()]
    floating = [s for s in specs if s is not None and _is_float(s)]
    if floating:
        return floating[0].dtype
    outputs = [s for s in node.outputs if s is not None]
    return outputs[0].dtype if outputs else "float32"


def _is_float(spec: TensorSpec) -> bool:
    return spec.dtype.startswith(("float", "bfloat"))


def node_time(node: NodeReport, key: str, device: Device) -> NodeTime:
    """The roofline time of one reported node at dtype figure `key`."""
    if node.status == "free":
        return NodeTime(node.id, 0.0, "free", 0.0, key)
    if node.status != "costed":
        return NodeTime(node.id, 0.0, "uncosted", 0.0, key)
    moved = node.bytes_read + node.bytes_written
    flops_rate = device.achievable_flops(key, node.kernel)
    compute_s = node.flops / flops_rate if flops_rate > 0 else 0.0
    memory_s = moved / device.achievable_bandwidth if device.achievable_bandwidth > 0 else 0.0
    serial_s = serial_seconds(node.recurrence, device)
    timed = NodeTime(node.id, max(compute_s, memory_s) + serial_s + device.launch_s, "",
                     node.flops / moved if moved else 0.0, key, compute_s, memory_s, serial_s)
    bound = "launch" if device.launch_s >= timed.work_s else timed.work_bound
    return replace(timed, bound=bound)


def node_times(report: Report, graph: Graph, device: Device, tf32: bool = False,
               keys: Mapping[int, str] | None = None) -> list[NodeTime]:
    """Per node: on a CPU its work plus its launch; on a GPU what it adds to the GPU's
    timeline while the host issues the kernels (`fxlens.analyzer.time.host`). `keys`: the
    `DTYPE_KEYS` figure some nodes compute at instead of their dtype's (fp8 GEMMs)."""
    keys = keys or {}
    times = [node_time(n, keys.get(n.id) or _key(graph, n.id, tf32), device)
             for n in report.nodes]
    return on_gpu_timeline(report, times, device) if device.kind == "gpu" else times


def compute_seconds(report: Report, graph: Graph, device: Device, tf32: bool = False
                    ) -> Callable[[int, int], float]:
    """Seconds of some FLOPs at a node's rate on `device` (its dtype, its kernel class):
    what work a fix skips there is worth (`fxlens.analyzer.fusion.kernels.run_rules`)."""
    kernels = {n.id: n.kernel for n in report.nodes}

    def seconds(node_id: int, flops: int) -> float:
        rate = device.achievable_flops(_key(graph, node_id, tf32), kernels.get(node_id, ""))
        return flops / rate if rate > 0 else 0.0

    return seconds


def _key(graph: Graph, node_id: int, tf32: bool) -> str:
    return dtype_key(node_dtype(graph.nodes[node_id], graph), tf32)


def on_gpu_timeline(report: Report, times: list[NodeTime], device: Device) -> list[NodeTime]:
    kernels = [t.bound not in ("free", "uncosted") for t in times]
    issues = [Issue(t.work_s if kernel else None, n.module, n.phase)
              for n, t, kernel in zip(report.nodes, times, kernels, strict=True)]
    host = HostCosts(device.launch_s, device.host_free_s, device.host_module_s)
    placed = []
    for t, kernel, (time_s, wait) in zip(times, kernels, gpu_timeline(issues, host),
                                          strict=True):
        if not kernel:
            placed.append(t)
            continue
        bound = "launch" if wait >= t.work_s else t.work_bound
        placed.append(replace(t, time_s=time_s, bound=bound))
    return placed


def roofline_section(report: Report, graph: Graph, device: Device, tf32: bool = False,
                     top: int = HOTSPOTS) -> Roofline:
    """The report's ``roofline`` section (see the module docstring)."""
    times = node_times(report, graph, device, tf32)
    by_id = {t.id: t for t in times}
    phases: dict[str, float] = defaultdict(float)
    for node in report.nodes:
        phases[node.phase] += by_id[node.id].time_s
    graph_s = sum(t.time_s for t in times)
    step_s, optimizer_s = graph_s, None
    training = report.get(Training)
    if training is not None and "backward" in phases:
        optimizer_s = optimizer_time(training, graph, device)
        step_s = graph_s + optimizer_s
    totals = RooflineTotals(
        time_s=graph_s,
        compute_bound_s=sum(t.time_s for t in times if t.bound == "compute"),
        memory_bound_s=sum(t.time_s for t in times if t.bound == "memory"),
        launch_bound_s=sum(t.time_s for t in times if t.bound == "launch"),
        latency_bound_s=sum(t.time_s for t in times if t.bound == "latency") or None,
        launch_s=device.launch_s * sum(1 for t in times if t.bound not in ("free", "uncosted")),
        by_phase=dict(sorted(phases.items())),
        uncosted_nodes=sum(1 for t in times if t.bound == "uncosted"),
        optimizer_s=optimizer_s,
        step_time_s=step_s if optimizer_s is not None else None,
    )
    basis = throughput_basis(graph)
    mfu_key = dominant_key(report, by_id)
    peak = device.peak(mfu_key)[0]
    return Roofline(
        device=device.figures(),
        settings=RooflineSettings(tf32=tf32, dtype_rule=_dtype_rule(times, mfu_key, tf32)),
        nodes=tuple(NodeTiming(t.id, t.time_s, t.bound, t.intensity, t.dtype_key)
                    for t in times),
        modules=module_times(report, by_id),
        totals=totals,
        throughput=throughput(basis, step_s, report.totals.flops, peak),
        mfu=report.totals.flops / step_s / peak if step_s > 0 and peak > 0 else 0.0,
        mfu_dtype=mfu_key,
        hotspots=hotspots(report, by_id, top),
    )


def _dtype_rule(times: Sequence[NodeTime], mfu_key: str, tf32: bool) -> str:
    """Which peak the ops ran at, in words: their inputs' dtype, most FLOPs at `mfu_key`;
    float32 matmuls at FP32 unless TF32 is allowed, said only where some op is float32."""
    rule = f"each op at its inputs' dtype's peak; most FLOPs at {mfu_key}"
    if any(t.dtype_key in ("fp32", "tf32") for t in times):
        rule += ("; float32 at TF32 (--tf32)" if tf32 else
                 "; float32 at FP32 (--tf32 allows TF32)")
    return rule


def module_times(report: Report, by_id: Mapping[int, NodeTime]) -> tuple[ModuleTiming, ...]:
    """Time per module (its nodes and its submodules'), in the report's module order."""
    sums: dict[str, float] = defaultdict(float)
    for node in report.nodes:
        for path in ancestors(node.module):
            sums[path] += by_id[node.id].time_s
    total = sums.get("", 0.0)
    return tuple(ModuleTiming(m.path, sums.get(m.path, 0.0),
                              sums.get(m.path, 0.0) / total if total else 0.0)
                 for m in report.modules)


def optimizer_time(training: Training, graph: Graph, device: Device) -> float:
    """One optimizer step: its FLOPs or its memory traffic (`Training.optimizer_step_bytes`,
    sized by the optimizer's policy), whichever takes longer, and a launch per tensor."""
    moved = training.optimizer_step_bytes
    tensors = sum(1 for p in graph.params if not p.is_buffer and p.requires_grad)
    compute_rate = device.achievable_flops("fp32")
    compute_s = training.optimizer_flops / compute_rate if compute_rate > 0 else 0.0
    bandwidth = device.achievable_bandwidth
    memory_s = moved / bandwidth if bandwidth > 0 else 0.0
    return max(compute_s, memory_s) + tensors * device.launch_s


@dataclass(frozen=True)
class Basis:
    """What one run processes: samples (the batch) and tokens (0 when not a token model)."""

    samples: int
    tokens: int


def throughput_basis(graph: Graph) -> Basis:
    """Samples: the leading dimension of the first graph input. Tokens: the elements of the
    first 2-D integer input (batch × sequence), when there is one."""
    inputs = [spec for _, spec in graph.example_inputs()]
    samples = inputs[0].shape[0] if inputs and inputs[0].shape else 1
    tokens = next((s.numel for s in inputs
                   if len(s.shape) == 2 and s.dtype.startswith(("int", "uint"))), 0)
    return Basis(samples, tokens)


def throughput(basis: Basis, time_s: float, flops: int, peak: float) -> Throughput:
    """Samples/s and tokens/s at the captured batch, and the tokens/s bound of the domain
    (`peak / FLOPs per token`)."""
    samples_per_s = basis.samples / time_s if time_s > 0 else 0.0
    if not basis.tokens:
        return Throughput(basis.samples, basis.tokens, samples_per_s)
    per_token = flops / basis.tokens
    return Throughput(basis.samples, basis.tokens, samples_per_s,
                      tokens_per_s=basis.tokens / time_s if time_s > 0 else 0.0,
                      tokens_per_s_bound=peak / per_token if per_token > 0 else 0.0)


def dominant_key(report: Report, by_id: Mapping[int, NodeTime]) -> str:
    """The dtype figure that carries most of the report's FLOPs (fp32 for an empty graph)."""
    flops: Counter[str] = Counter()
    for node in report.nodes:
        flops[by_id[node.id].dtype_key] += node.flops
    ranked = sorted(flops.items(), key=lambda kv: (-kv[1], kv[0]))
    return ranked[0][0] if ranked and ranked[0][1] > 0 else "fp32"


def hotspots(report: Report, by_id: Mapping[int, NodeTime], top: int) -> Hotspots:
    """The top ops (grouped by aten overload) by predicted time and by FLOPs, side by side."""
    calls: Counter[str] = Counter()
    time_s: dict[str, float] = defaultdict(float)
    flops: Counter[str] = Counter()
    for node in report.nodes:
        calls[node.target] += 1
        time_s[node.target] += by_id[node.id].time_s
        flops[node.target] += node.flops
    total_s, total_flops = sum(time_s.values()), sum(flops.values())
    rows = {target: OpTiming(target=target, calls=calls[target], time_s=time_s[target],
                             flops=flops[target],
                             time_share=time_s[target] / total_s if total_s else 0.0,
                             flops_share=flops[target] / total_flops if total_flops else 0.0)
            for target in calls}
    return Hotspots(
        by_time=tuple(rows[t] for t in sorted(calls, key=lambda t: (-time_s[t], t))[:top]),
        by_flops=tuple(rows[t] for t in sorted(calls, key=lambda t: (-flops[t], t))[:top]),
    )
