"""Synthetic op calls for rule tests: no tracing, milliseconds per case."""

from __future__ import annotations

from typing import Any

import torch

from fxlens.analyzer.core.aten import bind_args, meta_tensor, resolve_op, spec_of
from fxlens.analyzer.core.costs import Cost, OpCall
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef, TensorSpec
from fxlens.rules import load_rules


def T(*shape: int, dtype: str = "float32") -> TensorSpec:
    """A contiguous tensor spec."""
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= max(size, 1)
    return TensorSpec(tuple(shape), dtype, tuple(reversed(stride)))


def op_call(
    target: str, *args: Any, given_outputs: tuple[TensorSpec, ...] | None = None, **kwargs: Any
) -> OpCall:
    """An OpCall for `target` on the given specs. Outputs come from running the op on meta,
    or are `given_outputs` for ops that cannot run there (data-dependent output shapes)."""
    inputs: list[Node] = []

    def as_ref(value: Any) -> Any:
        if isinstance(value, TensorSpec):
            inputs.append(Node(len(inputs), NodeKind.INPUT, f"x{len(inputs)}", {}, (value,)))
            return TensorRef(len(inputs) - 1)
        if isinstance(value, (list, tuple)):
            return type(value)(as_ref(v) for v in value)
        return value

    def as_meta(value: Any) -> Any:
        if isinstance(value, TensorSpec):
            return meta_tensor(value)
        if isinstance(value, (list, tuple)):
            return type(value)(as_meta(v) for v in value)
        return value

    op = resolve_op(target)
    if given_outputs is None:
        result = op(*as_meta(args), **{k: as_meta(v) for k, v in kwargs.items()})
        flat = result if isinstance(result, (tuple, list)) else (result,)
        outputs = tuple(spec_of(r) if isinstance(r, torch.Tensor) else None for r in flat)
    else:
        outputs = given_outputs
    bound = bind_args(op, args, kwargs, convert=as_ref)
    node = Node(len(inputs), NodeKind.CALL, target, bound, outputs)
    return OpCall(node, Graph((*inputs, node), "synthetic"))


def cost_of(
    target: str, *args: Any, given_outputs: tuple[TensorSpec, ...] | None = None, **kwargs: Any
) -> Cost:
    """Run the registered rule for `target` on a synthetic call."""
    registry = load_rules()
    call = op_call(target, *args, given_outputs=given_outputs, **kwargs)
    rule = registry.lookup(call.node)
    assert callable(rule), f"{target} has no cost rule (lookup gave {rule!r})"
    return rule(call)


def captured_kernel_ops(module: torch.nn.Module, inputs: dict[str, Any], prefix: str
                        ) -> tuple[Graph, list[Node]]:
    """`module` captured in eval mode, and its calls whose target starts with `prefix` (a
    kernel op the capture stands in for a library's reference), each checked to be costed by
    its rule with some FLOPs."""
    from fxlens.analyzer.capture.chain import capture

    module.eval()
    registry = load_rules()
    with torch.no_grad():
        graph = capture(module, inputs, registry)
    ops = [n for n in graph.nodes if str(n.target).startswith(prefix)]
    for node in ops:                   # costed by the rule, at the closed form's size
        rule = registry.lookup(node)
        assert callable(rule) and rule(OpCall(node, graph)).flops > 0
    return graph, ops
