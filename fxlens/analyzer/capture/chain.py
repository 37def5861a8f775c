"""`capture(module, inputs) -> Graph`: trace a module on fake tensors, through a fallback chain.

1. ``torch.export`` (non-strict): the training-IR graph, where ops such as ``linear``,
   ``scaled_dot_product_attention`` and ``layer_norm`` are still whole. Blocks proven
   identical by a dispatch-level fake forward are traced once and copied into their places
   (`fxlens.analyzer.capture.blocks`), so its cost grows with the model's unique structure:
   export stays first because its nodes keep the high-level ops, source lines and module
   paths the rules, fusion findings and goldens are written against; recording at dispatch
   level first would be as fast but give ``t`` + ``mm`` for ``linear`` and the backend's
   attention kernel.
2. ``make_fx`` on fake tensors (pre-dispatch): for models export refuses, e.g. outputs of types
   pytree does not know (the model's outputs are reduced to their tensors first).
3. Recording the eager run at dispatch level (`fxlens.analyzer.capture.recorder`): data-dependent
   control flow, ``.item()``, MoE routing. On fake tensors first, on small real ones if an op
   needs real values.

Each link's failure is kept as a note in the graph, so the report says what was tried. Ops no
rule knows are then decomposed until known (`fxlens.analyzer.capture.decompose`). Weights are never
materialised by links 1 and 2: a real CPU model is fakified, a meta one stays meta.

A failing link is expected and reported in the notes, so torch's chatter about it stays off
the terminal without touching the process's ``sys.stderr``: warnings, ``torch.export``'s dump
of a failed trace and the fake-tensor mode's ERROR tracebacks go to the debug log
(`fxlens.analyzer.capture.chatter`).

Known limitations: symbolic shapes are concretised; the eager recording sees only the branch
the example inputs take.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import traceback
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export.graph_signature import InputKind
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from fxlens.analyzer.capture.as_eager import libraries_as_eager
from fxlens.analyzer.capture.blocks import (
    Alongside,
    Group,
    Repeats,
    find_repeats,
    guessed_repeats,
    standing_in,
)
from fxlens.analyzer.capture.blocks_splice import splice
from fxlens.analyzer.capture.chatter import export_prints_logged, torch_chatter_to_debug_log
from fxlens.analyzer.capture.decompose import decompose_unknown
from fxlens.analyzer.capture.fake_runs import CpuFakeTensorMode, fake_then_real
from fxlens.analyzer.capture.fx_convert import FxConverter, type_name, user_frame
from fxlens.analyzer.capture.recorder import Recorder, module_tracking
from fxlens.analyzer.core.aten import known_value, spec_of
from fxlens.analyzer.core.beside import Beside, beside, can_fork, result_or_none
from fxlens.analyzer.core.costs import CostRegistry
from fxlens.analyzer.core.errors import CaptureError
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, ParamInfo, TensorRef

log = logging.getLogger(__name__)

METHODS = ("export", "make_fx", "record")
Inputs = tuple[Any, ...] | dict[str, Any]
Captured = tuple[list[Node], tuple[TensorRef, ...], str]   # nodes, graph outputs, method label
Step = Callable[[str], None]
Capturer = Callable[[torch.nn.Module, tuple[Any, ...], dict[str, Any], CostRegistry], Captured]


def capture(
    module: torch.nn.Module,
    inputs: Inputs,
    registry: CostRegistry,
    methods: tuple[str, ...] = METHODS,
    on_step: Step = lambda _: None,
    alongside: Alongside | None = None,
) -> Graph:
    """Trace `module` on `inputs` with the first method of `methods` that succeeds;
    `alongside` observes export's fake forward that proves blocks identical, if it runs."""
    args, kwargs = (tuple(inputs), {}) if isinstance(inputs, (tuple, list)) else ((), dict(inputs))
    capturers: dict[str, Capturer] = {
        **_CAPTURERS, "export": functools.partial(_by_export, alongside=alongside)}
    notes: list[str] = []
    last_error: BaseException | None = None
    for method in methods:
        on_step(f"capturing with {method}")
        try:
            with torch_chatter_to_debug_log(), libraries_as_eager():
                nodes, outputs, label = capturers[method](module, args, kwargs, registry)
        except CaptureError:
            raise
        except Exception as error:  # each link may fail in its own way; the next one tries
            log.info("%s failed: %s", method, error, exc_info=True)
            notes.append(f"{method} failed: {_first_line(error)}")
            last_error = error
            continue
        on_step("decomposing ops without a cost rule")
        nodes, outputs = decompose_unknown(nodes, registry.knows, outputs)
        return Graph(
            nodes=with_buffer_values(nodes, module), capture_method=label,
            params=param_infos(module),
            module_types={p: type_name(type(m)) for p, m in module.named_modules()},
            outputs=outputs, notes=tuple(notes), tied=tied_names(module),
        )
    raise _capture_error(last_error, notes)


# --- 1. torch.export -------------------------------------------------------------------------

def _by_export(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
               registry: CostRegistry, alongside: Alongside | None = None) -> Captured:
    """Blocks proven identical are traced once (`fxlens.analyzer.capture.blocks`); if that
    trace is refused or not what the proof expected, every block is traced.

    Where this process may fork (`fxlens.analyzer.core.beside`), the trace starts in a
    child on the groups guessed from structure while the proof runs here; it is used only if
    the proof finds exactly those groups, each returning what its traced block returned, so
    the nodes are the ones the trace after the proof gives."""
    guess = guessed_repeats(module) if can_fork() else Repeats()
    work = functools.partial(_trace, module, args, kwargs, guess)
    with beside(work if guess.groups else None) as early:
        repeats = find_repeats(module, args, kwargs, alongside)
        if repeats.groups:
            try:
                traced = _if_proven(early, repeats) or _trace(module, args, kwargs, repeats)
                return _spliced(module, traced, repeats)
            except Exception as error:  # the whole export below decides what is wrong
                log.info("tracing each repeated block once failed (%s); tracing all", error)
    return _export(module, args, kwargs, Repeats())


Traced = tuple[list[Node], tuple[TensorRef, ...], tuple[Group, ...]]  # + the groups as traced


def _if_proven(early: Beside | None, repeats: Repeats) -> Traced | None:
    """The trace started beside the proof, if its guessed groups are the proven ones."""
    traced: Traced | None = result_or_none(early, "the trace of repeated blocks")
    if traced is None:
        return None
    if traced[2] != repeats.groups:
        log.info("the trace beside the proof guessed other groups than the proof found")
        return None
    log.info("the trace made beside the proof is used")
    return traced


def _export(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
            repeats: Repeats) -> Captured:
    return _spliced(module, _trace(module, args, kwargs, repeats), repeats)


def _trace(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
           repeats: Repeats) -> Traced:
    """``torch.export`` with `repeats` standing in, as our nodes (not yet spliced)."""
    with _lazy_recompile(), export_prints_logged(), standing_in(module, repeats) as groups:
        program = torch.export.export(module, args, kwargs=kwargs, strict=False)
    kinds = {
        spec.arg.name: spec
        for spec in program.graph_signature.input_specs
        if hasattr(spec.arg, "name")
    }

    def input_kind(fx_node: torch.fx.Node) -> tuple[NodeKind, str]:
        spec = kinds.get(fx_node.name)
        if spec is None or spec.kind is InputKind.USER_INPUT:
            return NodeKind.INPUT, fx_node.name
        kind = NodeKind.PARAM if spec.kind is InputKind.PARAMETER else NodeKind.BUFFER
        return kind, str(spec.target)

    def input_value(fx_node: torch.fx.Node) -> Any:
        """A lifted constant's values, kept where small integers (a BlockMask made before
        the forward: `known_value`); buffers' are read from the module (`with_buffer_values`)."""
        spec = kinds.get(fx_node.name)
        if spec is None or spec.kind is not InputKind.CONSTANT_TENSOR:
            return None
        return known_value(program.constants.get(str(spec.target)))

    converter = FxConverter(input_kind, input_value)
    converter.convert(program.graph_module.graph, program.graph_module)
    return converter.nodes, _tensor_refs(converter.outputs), tuple(groups)


def _spliced(module: torch.nn.Module, traced: Traced, repeats: Repeats) -> Captured:
    nodes, outputs, _ = traced
    if repeats.groups:
        weights = {name for name, _ in module.named_parameters(remove_duplicate=False)}
        weights |= {name for name, _ in module.named_buffers(remove_duplicate=False)}
        nodes, outputs = splice(nodes, outputs, repeats, weights)
        repeats.check_outputs([nodes[r.node].outputs[r.index] for r in outputs])
        log.info("export traced %d groups of repeated blocks once and copied %d blocks",
                 len(repeats.groups), repeats.copies)
    return nodes, outputs, "torch.export (non-strict)"


def _lazy_recompile() -> contextlib.AbstractContextManager[Any]:
    """Export's own passes recompile the graph module's Python code again and again (splitting
    it around ``set_grad_enabled`` regions, renaming placeholders). We read the graph, never
    the code, so code is generated only if something calls the module (torch's lazy graph
    modules; same nodes, same metadata). Measured in bench/README.md ("Issue 15")."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:   # a torch without it: eager recompiles, same graph
        return contextlib.nullcontext()
    return _use_lazy_graph_module(True)


# --- 2. make_fx ------------------------------------------------------------------------------

def _by_make_fx(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                registry: CostRegistry) -> Captured:
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())

    def forward(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        out = torch.func.functional_call(module, {**params, **buffers}, args, kwargs)
        return [t for t in pytree.tree_leaves(plain_outputs(out)) if isinstance(t, torch.Tensor)]

    # Our fake mode (make_fx adopts the inputs' mode): its fake kernels accept what the CPU
    # kernels accept (`CpuFakeTensorMode`), e.g. float32 grouped GEMMs of MoE experts.
    fake_mode = CpuFakeTensorMode(allow_fallback_kernels=True, allow_non_fake_inputs=False,
                                  shape_env=ShapeEnv(), static_shapes=True)  # make_fx's own
    fake_params, fake_buffers, fake_args, fake_kwargs = pytree.tree_map_only(
        torch.Tensor, lambda t: fake_mode.from_tensor(t), (params, buffers, args, kwargs))
    # NB: make_fx records no module stack through functional_call; publish our own.
    with fx_traceback.preserve_node_meta(), module_tracking(module, [], publish=True):
        gm = make_fx(forward, tracing_mode="fake", pre_dispatch=True, record_stack_traces=True)(
            fake_params, fake_buffers, fake_args, fake_kwargs
        )
    names = [(NodeKind.PARAM, n) for n in params] + [(NodeKind.BUFFER, n) for n in buffers]
    leaves = iter(names + [(NodeKind.INPUT, f"input{i}")
                           for i, _ in enumerate(pytree.tree_leaves((args, kwargs)))])
    placeholders = {n: next(leaves) for n in gm.graph.nodes if n.op == "placeholder"}
    converter = FxConverter(lambda n: placeholders[n])
    converter.convert(gm.graph, gm)
    return converter.nodes, _tensor_refs(converter.outputs), "make_fx (fake tensors)"


def plain_outputs(value: Any) -> Any:
    """Model outputs as pytree-friendly containers (ModelOutput, dataclasses → dicts)."""
    if isinstance(value, torch.Tensor) or value is None:
        return value
    if isinstance(value, dict):
        return {k: plain_outputs(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_outputs(v) for v in value]
    if hasattr(value, "__dict__"):
        return {k: plain_outputs(v) for k, v in vars(value).items() if not k.startswith("_")}
    return None


# --- 3. dispatch-level recording -------------------------------------------------------------

def _by_recording(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                  registry: CostRegistry) -> Captured:
    def run(module: torch.nn.Module, state: dict[str, torch.Tensor], args: tuple[Any, ...],
            kwargs: dict[str, Any], fake_mode: FakeTensorMode | None) -> tuple[Any, Any]:
        return _record(module, state, args, kwargs, registry, fake_mode)

    (nodes, outputs), tensors = fake_then_real(module, args, kwargs, run)
    return nodes, outputs, f"eager recording ({tensors})"


def _record(
    module: torch.nn.Module, state: dict[str, torch.Tensor], args: tuple[Any, ...],
    kwargs: dict[str, Any], registry: CostRegistry, fake_mode: FakeTensorMode | None,
) -> tuple[list[Node], tuple[TensorRef, ...]]:
    recorder = Recorder.for_run(module, state, args, kwargs, registry.knows)
    tensors = fake_mode if fake_mode is not None else contextlib.nullcontext()
    with module_tracking(module, recorder.module_stack), torch.no_grad(), tensors, recorder:
        out = torch.func.functional_call(module, state, args, kwargs)
    leaves = [t for t in pytree.tree_leaves(plain_outputs(out)) if isinstance(t, torch.Tensor)]
    return recorder.nodes, tuple(recorder.ref(t) for t in leaves)


_CAPTURERS: dict[str, Capturer] = {
    "export": _by_export, "make_fx": _by_make_fx, "record": _by_recording}


# --- helpers ---------------------------------------------------------------------------------

def _tensor_refs(value: Any) -> tuple[TensorRef, ...]:
    if isinstance(value, TensorRef):
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(r for v in value for r in _tensor_refs(v))
    return ()


def param_infos(module: torch.nn.Module) -> tuple[ParamInfo, ...]:
    params = [ParamInfo(n, spec_of(p), False, p.requires_grad)
              for n, p in module.named_parameters()]
    buffers = [ParamInfo(n, spec_of(b), True, False) for n, b in module.named_buffers()]
    return tuple(params + buffers)


def with_buffer_values(nodes: Iterable[Node], module: torch.nn.Module) -> tuple[Node, ...]:
    """`nodes` with each buffer input holding its values where `known_value` keeps them (a
    causal-mask buffer, position ids), read from the module, whichever tensors the capture
    ran on."""
    buffers = dict(module.named_buffers(remove_duplicate=False))
    return tuple(
        replace(n, value=known_value(buffers[n.target]))
        if n.kind is NodeKind.BUFFER and n.value is None and n.target in buffers else n
        for n in nodes)


def tied_names(module: torch.nn.Module) -> dict[str, str]:
    """Each further name of a tensor the module holds under several (tied input and output
    embeddings), mapped to its first name: one storage, however many graph inputs."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    named = (*module.named_parameters(remove_duplicate=False),
             *module.named_buffers(remove_duplicate=False))
    for name, tensor in named:
        tied.update({name: first[id(tensor)]} if id(tensor) in first else {})
        first.setdefault(id(tensor), name)
    return tied


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


def _capture_error(error: BaseException | None, notes: list[str]) -> CaptureError:
    """One clear line: the last failure, the user's line it happened at, the methods tried."""
    where = ""
    if error is not None:
        frames = [(f.filename, f.lineno or 0) for f in traceback.extract_tb(error.__traceback__)]
        where = user_frame(frames)
    tried = ", ".join(note.split(" failed")[0] for note in notes)
    return CaptureError(
        f"could not capture the model: {_first_line(error) if error else 'no method'}"
        f"{f' at {where}' if where else ''} (tried {tried})"
    )
