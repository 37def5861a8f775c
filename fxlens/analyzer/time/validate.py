"""Run a captured graph for real, time every node, and compare with the roofline's predictions.

The captured `Graph` is a faithful op list, so it is interpreted node by node: each call node's
aten overload (`resolve_op`) runs on real tensors, its schema-bound arguments read from the
outputs of earlier nodes (`TensorRef`s), device arguments redirected to the run device. Graph
inputs are bound to the example inputs by name, then by shape and dtype; parameters and
buffers by qualified name from the module. A tensor no longer needed is dropped after its
last reader, as an executor would.

Timing: `warmup` whole passes, then `repeat` passes, each node timed on its own (wall clock
on CPU; CUDA events around each node on a GPU, read after the pass synchronises); a node's
figure is the median over the passes. The total is the sum of node medians; the median wall
time of a whole pass (interpreter overhead included) and of the module's own eager forward are
kept beside it. Peak memory comes from the eager forward: the storage tracker of
`fxlens.analyzer.memory.measure` on CPU, ``torch.cuda.max_memory_allocated`` on a GPU.

Known limitations: inference graphs only (no joint training graph); no higher-order ops
(FlexAttention: a `ValidationError` says so); random ops draw other
numbers than the eager run did; an in-place op on a graph input or buffer repeats on every
pass (eval-mode graphs have none in the test zoo); an input the example inputs cannot fill
(a lifted constant whose value capture did not keep) is made up (zeros or normal noise) and
listed in `GraphRun.made_up`.
NB: a node's time covers only its op call (building the arguments is the interpreter's cost,
left out); on CPU that includes the dispatcher's overhead, a few µs, which is what the
per-kernel launch cost of the roofline models; a real executor pays it too.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from fxlens.analyzer.capture.chain import plain_outputs
from fxlens.analyzer.capture.fake_runs import on_meta, random_weights, real_like
from fxlens.analyzer.core.aten import resolve_op
from fxlens.analyzer.core.errors import ValidationError
from fxlens.analyzer.core.graph import (
    Graph,
    Node,
    NodeKind,
    TensorRef,
    TensorSpec,
    ancestors,
    packet,
)
from fxlens.analyzer.core.report import Report
from fxlens.analyzer.core.sections import (
    Memory,
    MemoryValidation,
    ModuleValidation,
    NodeValidation,
    OpClassValidation,
    ProfileInfo,
    Roofline,
    RunSettingsInfo,
    TotalValidation,
    Validation,
)
from fxlens.analyzer.memory.measure import measure_memory

Values = dict[int, tuple[Any, ...]]


@dataclass(frozen=True)
class RunSettings:
    device: str = "cpu"
    warmup: int = 2
    repeat: int = 5


@dataclass(frozen=True)
class GraphRun:
    """What running the graph measured."""

    node_s: Mapping[int, float]          # median time per call node
    pass_s: float                        # median wall time of one whole interpreted pass
    eager_s: float                       # median wall time of the module's eager forward
    peak_bytes: int                      # peak bytes of the eager forward's new tensors
    outputs: tuple[Any, ...]             # the graph's outputs from the first pass
    made_up: tuple[str, ...]             # inputs the example inputs could not fill


def prepare(module: torch.nn.Module, inputs: Any, device: str, dtype: torch.dtype | None = None
            ) -> tuple[torch.nn.Module, Any]:
    """A module and inputs ready for a real run on `device`: random weights for a meta-device
    model, made on `device` itself (no CPU copy, so a GPU-sized model need not fit in host
    memory), floating tensors cast to `dtype` when given."""
    real = random_weights(module, device) if on_meta(module) else module
    real = real.to(device=device, dtype=dtype) if dtype is not None else real.to(device)

    def leaf(t: torch.Tensor) -> torch.Tensor:
        t = real_like(t)
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        return t.to(device)
    return real.eval(), pytree.tree_map_only(torch.Tensor, leaf, inputs)


# --- binding inputs ---------------------------------------------------------------------------

def bind_inputs(graph: Graph, module: torch.nn.Module, inputs: Any,
                device: torch.device) -> tuple[Values, tuple[str, ...]]:
    """Real tensors for the graph's input, parameter and buffer nodes."""
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    named = _named_leaves(inputs)
    unused = list(named)
    values: Values = {}
    made_up: list[str] = []
    for node in graph.nodes:
        if node.kind is NodeKind.CALL:
            continue
        tensor = node.value.to(device) if node.value is not None else None   # kept by capture
        if tensor is None and node.kind is not NodeKind.INPUT:
            tensor = state.get(node.target)
            tensor = _attribute(module, node.target) if tensor is None else tensor
        if tensor is None and node.kind is NodeKind.INPUT:
            tensor = _take_input(node, named, unused)
        if tensor is None:
            tensor = _made_up(node.outputs[0], device)
            made_up.append(f"{node.kind.value} {node.target}")
        values[node.id] = (tensor,)
    return values, tuple(made_up)


def _named_leaves(inputs: Any) -> dict[str, torch.Tensor]:
    """Example input tensors by name: dict keys where there are some, ``input{i}`` by leaf
    position in any case (the recorder's and make_fx's names)."""
    leaves, spec = pytree.tree_flatten(inputs)
    named = {f"input{i}": t for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)}
    if isinstance(inputs, dict):
        named.update({k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)})
    return named


def _take_input(node: Node, named: dict[str, torch.Tensor], unused: list[str]
                ) -> torch.Tensor | None:
    spec = node.outputs[0]
    if node.target in named:
        chosen = node.target
    else:
        chosen = next((n for n in unused if spec is not None and _fits(named[n], spec)), "")
    if not chosen:
        return None
    tensor = named[chosen]
    for name, other in named.items():  # one tensor has up to two names
        if other is tensor and name in unused:
            unused.remove(name)
    return tensor


def _fits(tensor: torch.Tensor, spec: TensorSpec) -> bool:
    return tuple(tensor.shape) == spec.shape and str(tensor.dtype).endswith(spec.dtype)


def _attribute(module: torch.nn.Module, path: str) -> torch.Tensor | None:
    value: Any = module
    for part in path.split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def _made_up(spec: TensorSpec | None, device: torch.device) -> torch.Tensor:
    if spec is None:
        return torch.zeros((), device=device)
    dtype = getattr(torch, spec.dtype)
    if dtype.is_floating_point:
        generator = torch.Generator().manual_seed(0)
        return torch.randn(spec.shape, generator=generator, dtype=dtype).to(device)
    return torch.zeros(spec.shape, dtype=dtype, device=device)


# --- interpreting -----------------------------------------------------------------------------

Call = tuple[Callable[..., Any], list[Any], dict[str, Any]]


def node_call(node: Node, values: Values, device: torch.device) -> Call:
    """The aten overload of a call node and its real arguments, read from `values`."""
    op = resolve_op(node.target)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    positional = True
    for argument in op._schema.arguments:
        if argument.name not in node.args:
            positional = False
            continue
        value = _real(node.args[argument.name], values, device)
        if positional and not argument.kwarg_only:
            args.append(value)
        else:
            kwargs[argument.name] = value
    return op, args, kwargs


def call_node(node: Node, values: Values, device: torch.device) -> tuple[Any, ...]:
    """Run one call node on the real tensors in `values`; its outputs as a tuple."""
    op, args, kwargs = node_call(node, values, device)
    return _as_tuple(op(*args, **kwargs))


def _as_tuple(out: Any) -> tuple[Any, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _real(value: Any, values: Values, device: torch.device) -> Any:
    if isinstance(value, TensorRef):
        return values[value.node][value.index]
    if isinstance(value, torch.device):
        return device
    if isinstance(value, (list, tuple)):
        return type(value)(_real(v, values, device) for v in value)
    return value


def last_uses(graph: Graph) -> dict[int, list[int]]:
    """For each call node, the nodes whose outputs nobody reads after it (graph outputs stay)."""
    last: dict[int, int] = {}
    for node in graph.calls():
        for ref in node.input_refs():
            last[ref.node] = node.id
    kept = {ref.node for ref in graph.outputs}
    freed: dict[int, list[int]] = defaultdict(list)
    for producer, reader in last.items():
        if producer not in kept and graph.nodes[producer].kind is NodeKind.CALL:
            freed[reader].append(producer)
    return freed


Reading = Callable[[], float]           # seconds, read once the pass has synchronised
Clock = Callable[[], Callable[[], Reading]]   # start a timer; the returned stop() ends it


def interpret(graph: Graph, bound: Values, device: torch.device, clock: Clock
              ) -> tuple[dict[int, Reading], tuple[Any, ...]]:
    """One pass: every call node run and timed; the graph outputs."""
    values: Values = dict(bound)
    freed = last_uses(graph)
    timers: dict[int, Reading] = {}
    for node in graph.calls():
        op, args, kwargs = node_call(node, values, device)
        stop = clock()   # only the op call: building its arguments is the interpreter's cost
        out = op(*args, **kwargs)
        timers[node.id] = stop()
        values[node.id] = _as_tuple(out)
        for producer in freed.get(node.id, ()):
            values.pop(producer, None)
    outputs = tuple(values[ref.node][ref.index] for ref in graph.outputs)
    return timers, outputs


def _cpu_clock() -> Callable[[], Reading]:
    start = time.perf_counter()

    def stop() -> Reading:
        elapsed = time.perf_counter() - start
        return lambda: elapsed
    return stop


def _cuda_clock() -> Callable[[], Reading]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()

    def stop() -> Reading:
        end.record()
        return lambda: start.elapsed_time(end) / 1e3   # ms → s, after the pass synchronised
    return stop


def run_graph(graph: Graph, module: torch.nn.Module, inputs: Any,
              settings: RunSettings = RunSettings()) -> GraphRun:
    """Interpret `graph` on the real `module` and `inputs` (already on `settings.device`)."""
    device = torch.device(settings.device)
    cuda = device.type == "cuda"
    clock: Clock = _cuda_clock if cuda else _cpu_clock
    _check_runnable(graph)
    with torch.no_grad():
        bound, made_up = bind_inputs(graph, module, inputs, device)
        samples: dict[int, list[float]] = defaultdict(list)
        passes: list[float] = []
        outputs: tuple[Any, ...] = ()
        for i in range(settings.warmup + settings.repeat):
            start = time.perf_counter()
            timers, out = interpret(graph, bound, device, clock)
            _sync(cuda)
            passes.append(time.perf_counter() - start)
            outputs = outputs or out
            if i >= settings.warmup:
                for node_id, read in timers.items():
                    samples[node_id].append(read())
    return GraphRun(
        node_s={n: statistics.median(s) for n, s in samples.items()},
        pass_s=statistics.median(passes[settings.warmup:]),
        eager_s=eager_time(module, inputs, settings),
        peak_bytes=peak_memory(module, inputs, cuda),
        outputs=outputs, made_up=made_up,
    )


def _check_runnable(graph: Graph) -> None:
    """Every call node is an op overload; a higher-order op (FlexAttention) is not: its
    functions are kept in the graph as the ops they run, not as code to call."""
    node = next((n for n in graph.calls() if n.target.startswith("higher_order.")), None)
    if node is not None:
        raise ValidationError(
            f"cannot run {node.target} (node {node.id}, module {node.module or '<root>'}) "
            "node by node: the graph keeps which ops its functions run, not the functions; "
            "validate runs graphs of aten ops only")


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def _call(module: torch.nn.Module, inputs: Any) -> Any:
    return module(**inputs) if isinstance(inputs, dict) else module(*inputs)


def eager_time(module: torch.nn.Module, inputs: Any, settings: RunSettings) -> float:
    cuda = settings.device.startswith("cuda")
    times = []
    with torch.no_grad():
        for _ in range(settings.warmup + settings.repeat):
            _sync(cuda)
            start = time.perf_counter()
            _call(module, inputs)
            _sync(cuda)
            times.append(time.perf_counter() - start)
    return statistics.median(times[settings.warmup:])


def peak_memory(module: torch.nn.Module, inputs: Any, cuda: bool) -> int:
    """Peak bytes of new tensors during one eager forward."""
    if not cuda:
        return measure_memory(module, inputs).peak_bytes
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.no_grad():
        out = _call(module, inputs)
    torch.cuda.synchronize()
    del out
    return int(torch.cuda.max_memory_allocated() - base)


# --- comparing --------------------------------------------------------------------------------

def error(predicted: float, measured: float) -> float | None:
    """Relative error of a prediction, (predicted − measured) / measured; None if unmeasured."""
    return (predicted - measured) / measured if measured > 0 else None


def validation_section(report: Report, run: GraphRun, settings: RunSettings) -> Validation:
    """The report's ``validation`` section: predicted (its ``roofline`` section) beside
    measured, per node, op class, module and in total, with relative errors."""
    roofline = report.require(Roofline)
    predicted = roofline.node_times()
    nodes = tuple(NodeValidation(id=n.id, target=n.target, module=n.module, status=n.status,
                                 predicted_s=predicted[n.id],
                                 measured_s=run.node_s.get(n.id, 0.0))
                  for n in report.nodes)
    total_p = sum(n.predicted_s for n in nodes)
    total_m = sum(n.measured_s for n in nodes)
    memory = report.get(Memory)
    predicted_peak = memory.peak_activation_bytes if memory is not None else 0
    op_classes = _grouped(nodes, lambda n: packet(n.target))
    modules = _grouped(nodes, lambda n: n.module, roll_up=True)
    return Validation(
        settings=RunSettingsInfo(settings.device, settings.warmup, settings.repeat),
        profile=ProfileInfo(roofline.device.name, roofline.device.source,
                            roofline.device.calibrated),
        timed_nodes=len(run.node_s),
        made_up_inputs=tuple(run.made_up),
        nodes=nodes,
        op_classes=tuple(OpClassValidation(op, c, p, m, error(p, m))
                         for op, (p, m, c) in sorted(op_classes.items(),
                                                     key=lambda kv: (-kv[1][1], kv[0]))),
        modules=tuple(ModuleValidation(path, c, p, m, error(p, m))
                      for path, (p, m, c) in modules.items()),   # execution order
        total=TotalValidation(total_p, total_m, error(total_p, total_m), run.pass_s,
                              run.eager_s),
        memory=MemoryValidation(predicted_peak, run.peak_bytes,
                                error(predicted_peak, run.peak_bytes)),
    )


def _grouped(nodes: Sequence[NodeValidation], key: Callable[[NodeValidation], str],
             roll_up: bool = False) -> dict[str, tuple[float, float, int]]:
    """(predicted s, measured s, calls) per group, in first-seen order."""
    sums: dict[str, tuple[float, float, int]] = {}
    for node in nodes:
        for group in (ancestors(key(node)) if roll_up else [key(node)]):
            p, m, c = sums.get(group, (0.0, 0.0, 0))
            sums[group] = (p + node.predicted_s, m + node.measured_s, c + 1)
    return sums


def flat_tensors(value: Any) -> Iterator[torch.Tensor]:
    """Tensors of a model output in pytree order (for comparing with the graph's outputs)."""
    for leaf in pytree.tree_leaves(plain_outputs(value)):
        if isinstance(leaf, torch.Tensor):
            yield leaf
