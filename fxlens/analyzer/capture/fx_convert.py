"""Convert a torch.fx graph (from torch.export or make_fx) into our plain `Graph`.

What is kept per node: the aten overload, schema-bound arguments (fx nodes become
`TensorRef`s, symbolic ints become ints), output specs, module path and type from
``nn_module_stack``, and the user's source line from ``stack_trace``.

``operator.getitem`` nodes disappear: a reference to ``getitem(x, i)`` becomes
``TensorRef(x, i)``. Higher-order wrappers that only change autograd or autocast state
(``wrap_with_set_grad_enabled``, ``wrap_with_autocast``) are inlined: their subgraph's nodes
take their place. Any other higher-order op is kept as one node under its own name, which no
rule knows, so it shows as unsupported instead of vanishing.
"""

from __future__ import annotations

import functools
import operator
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from fxlens.analyzer.core.aten import bind_args, spec_of
from fxlens.analyzer.core.graph import Node, NodeKind, Subgraph, TensorRef, TensorSpec

INLINED_WRAPPERS = ("wrap_with_set_grad_enabled", "wrap_with_autocast")

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FXLENS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def user_frame(frames: list[tuple[str, int]]) -> str:
    """``file:line`` of the innermost frame outside torch and fxlens, shortened for display."""
    for file, line in reversed(frames):
        if not file.startswith((_TORCH_DIR, _FXLENS_DIR)) and not file.startswith("<"):
            return f"{display_path(file)}:{line}"
    return ""


def innermost_user_frame() -> str:
    """`user_frame` of the running stack, walked from the innermost frame out: no
    ``traceback.extract_stack`` (which builds every frame's summary and reads its source
    line), since a recorded op asks this once per call."""
    frame = sys._getframe(1)
    while frame is not None:
        file = frame.f_code.co_filename
        if not file.startswith((_TORCH_DIR, _FXLENS_DIR)) and not file.startswith("<"):
            return f"{display_path(file)}:{frame.f_lineno or 0}"
        frame = frame.f_back   # type: ignore[assignment]
    return ""


def display_path(file: str) -> str:
    """Site-packages paths from the package on; paths under the cwd relative to it."""
    return _display_path(file, os.getcwd())


@functools.lru_cache(maxsize=4096)
def _display_path(file: str, cwd: str) -> str:
    # NB: `cwd` is only the cache key (relpath reads the process's cwd): a model that
    # changes directory gets fresh answers.
    if "site-packages" + os.sep in file:
        return file.split("site-packages" + os.sep, 1)[1]
    try:
        relative = os.path.relpath(file)
    except ValueError:
        return file
    return file if relative.startswith("..") else relative


def source_of(stack_trace: str | None) -> str:
    if not stack_trace:
        return ""
    frames = [(m["file"], int(m["line"])) for m in _FRAME.finditer(stack_trace)]
    return user_frame(frames)


_INDEX = re.compile(r"\[(\d+)\]")
_MODULES_KEY = re.compile(r"\._modules\[['\"]([^'\"]+)['\"]\]")


def clean_module_path(path: str) -> str:
    """``L['self'].layers[0]`` / ``L__self__.layers.0`` → ``layers.0``."""
    path = _MODULES_KEY.sub(r".\1", path)
    path = _INDEX.sub(r".\1", path)
    for prefix in ("L['self']", "L__self__", "self"):
        if path == prefix:
            return ""
        if path.startswith(prefix + "."):
            path = path[len(prefix) + 1:]
    return path


USER_MODULE_PREFIX = "fxlens_user_"   # a model file's module name while it loads


def type_name(cls: Any) -> str:
    """A module's qualified class name as the report keeps it. A class from a model file is
    named by the file (``tiny_gpt.Block``), not by the module name the loader gave it
    (`USER_MODULE_PREFIX`, an internal detail every report would otherwise show)."""
    name = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else str(cls)
    return name.removeprefix(USER_MODULE_PREFIX)


def module_of(meta: Mapping[str, Any]) -> tuple[str, str]:
    stack = meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, cls = list(stack.values())[-1]
    return clean_module_path(str(path)), type_name(cls)


def specs_of(value: Any) -> tuple[TensorSpec | None, ...]:
    """Output specs of an fx node's ``meta["val"]`` (a tensor, a sequence of them, or other)."""
    if isinstance(value, torch.Tensor):
        return (spec_of(value),)
    if isinstance(value, (list, tuple)):
        return tuple(spec_of(v) if isinstance(v, torch.Tensor) else None for v in value)
    return ()


def concrete(value: Any) -> Any:
    """SymInts and friends become plain Python numbers."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return value.node.hint if value.node.has_hint() else value.node.expr
    return value


@dataclass
class FxConverter:
    """Accumulates nodes while walking one fx graph (and the subgraphs it inlines)."""

    input_kind: Callable[[torch.fx.Node], tuple[NodeKind, str]]
    # The values an input keeps (`Node.value`), None for most
    input_value: Callable[[torch.fx.Node], Any] = lambda _: None
    nodes: list[Node] = field(default_factory=list)
    outputs: tuple[TensorRef, ...] = ()

    def convert(
        self, graph: torch.fx.Graph, owner: torch.fx.GraphModule, given: Mapping | None = None
    ) -> None:
        """Walk `graph`; placeholders take values from `given` (inlining) or become inputs."""
        env: dict[torch.fx.Node, Any] = dict(given or {})
        for fx_node in graph.nodes:
            if fx_node.op == "placeholder" and fx_node not in env:
                kind, name = self.input_kind(fx_node)
                env[fx_node] = self._add(kind, name, {}, fx_node, self.input_value(fx_node))
            elif fx_node.op == "output":
                result = self._map(env, fx_node.args[0])
                self.outputs = tuple(result) if isinstance(result, (list, tuple)) else (result,)
            elif fx_node.op == "call_function":
                env[fx_node] = self._call(fx_node, env, owner)
            elif fx_node.op == "get_attr":
                env[fx_node] = getattr(owner, str(fx_node.target))

    def _call(self, fx_node: torch.fx.Node, env: dict, owner: torch.fx.GraphModule) -> Any:
        target = fx_node.target
        args = self._map(env, fx_node.args)
        kwargs = self._map(env, fx_node.kwargs)
        if target is operator.getitem:
            base, index = args
            return TensorRef(base.node, index) if isinstance(base, TensorRef) else base[index]
        if isinstance(target, torch._ops.OpOverload):
            return self._add(NodeKind.CALL, str(target), bind_args(target, args, kwargs), fx_node)
        name = getattr(target, "__name__", str(target))
        if name in INLINED_WRAPPERS:
            return self._inline(args)
        if isinstance(target, torch._ops.HigherOrderOperator):
            return self._add(NodeKind.CALL, f"higher_order.{name}", hop_arguments(args),
                             fx_node)
        # Python-level calls on symbolic sizes (operator.mul on SymInts...): plain values.
        return concrete(fx_node.meta.get("val"))

    def _inline(self, args: tuple) -> Any:
        position = next(i for i, a in enumerate(args) if isinstance(a, torch.fx.GraphModule))
        sub, operands = args[position], iter(args[position + 1:])
        given = {n: next(operands) for n in sub.graph.nodes if n.op == "placeholder"}
        inner = FxConverter(self.input_kind, self.input_value, self.nodes)
        inner.convert(sub.graph, sub, given)
        return inner.outputs if len(inner.outputs) != 1 else inner.outputs[0]

    def _add(self, kind: NodeKind, target: str, args: dict, fx_node: torch.fx.Node,
             value: Any = None) -> TensorRef:
        module, module_type = module_of(fx_node.meta)
        node = Node(
            id=len(self.nodes), kind=kind, target=target, args=args,
            outputs=specs_of(fx_node.meta.get("val")), module=module, module_type=module_type,
            source=source_of(fx_node.meta.get("stack_trace")), value=value,
        )
        self.nodes.append(node)
        return TensorRef(node.id)

    def _map(self, env: dict, value: Any) -> Any:
        return torch.fx.node.map_aggregate(
            value, lambda v: env[v] if isinstance(v, torch.fx.Node) else concrete(v)
        )


def hop_arguments(args: tuple[Any, ...]) -> dict[str, Any]:
    """A higher-order op's positional arguments as plain node arguments, ``arg0``…: graph
    modules as `Subgraph`s, Python functions left out (inside a tuple, None)."""
    return {f"arg{i}": subgraphs(a) for i, a in enumerate(args)
            if not callable(a) or isinstance(a, torch.fx.GraphModule)}


def subgraphs(value: Any) -> Any:
    """`value` with each graph module in it (a higher-order op's function argument) as the
    `Subgraph` of the ops it calls, and any other function as None: the graph stays plain
    data."""
    if isinstance(value, torch.fx.GraphModule):
        return Subgraph(tuple(str(n.target) for n in value.graph.nodes
                              if n.op == "call_function"))
    if isinstance(value, (tuple, list)):
        return type(value)(subgraphs(v) for v in value)
    return None if callable(value) else value    # a Python function: nothing to read
