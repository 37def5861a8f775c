"""The contract between the engine and the cost rules: `OpCall`, `Cost` and the registry.

A rule is a function ``OpCall -> Cost`` registered for one or more ops with `@cost_rule`.
Ops are keyed by their qualified names (``aten.mm`` for a whole overload packet,
``aten.mm.default`` for one overload, ``transformers.grouped_mm_fallback`` for a custom op),
so rules for third-party ops need not import the library that defines them.

Lookup order for a node: exact overload, then packet, then the free set; anything else is
unsupported. Registering the same key twice is an error naming both definition sites.
Third-party rule packs register by exposing a module under the ``fxlens.rules`` entry-point
group; importing it runs their ``@cost_rule`` decorators.

Alias checks (``@alias_rule``) serve the memory pass: for ops whose schema's alias annotation
is only sometimes true (``reshape`` is a view only when the strides allow one; ``to`` and
``contiguous`` hand back their input only when nothing changes; eval-mode ``dropout`` returns
its input although its schema promises a fresh tensor), a check ``OpCall -> bool`` says
whether this call's output shares its input's storage. Ops without a check follow the schema.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fxlens.analyzer.core.errors import RuleError
from fxlens.analyzer.core.graph import Graph, Node, TensorRef, TensorSpec


@dataclass(frozen=True)
class Cost:
    """What one op call costs. ``None`` bytes mean: the engine's default for the node,
    every distinct input tensor read once (its storage bytes) and every output written once."""

    flops: int = 0
    bytes_read: int | None = None
    bytes_written: int | None = None


class OpCall:
    """A read-only view of one node for a rule: arguments by schema name, specs resolved."""

    def __init__(self, node: Node, graph: Graph) -> None:
        self.node = node
        self._graph = graph

    @property
    def target(self) -> str:
        return self.node.target

    def has(self, name: str) -> bool:
        return self.node.args.get(name) is not None

    def arg(self, name: str, default: Any = None) -> Any:
        """A non-tensor argument (tensors come back as their `TensorSpec`)."""
        value = self.node.args.get(name, default)
        return self._resolve(value) if value is not None else default

    def tensor(self, name: str) -> TensorSpec:
        spec = self.arg(name)
        if not isinstance(spec, TensorSpec):
            raise RuleError(f"{self.target}: argument {name!r} is not a tensor ({spec!r})")
        return spec

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensor(name).shape

    def tensors(self, name: str) -> list[TensorSpec]:
        value = self.arg(name, [])
        return [v for v in value if isinstance(v, TensorSpec)]

    @property
    def inputs(self) -> list[TensorSpec]:
        """Every distinct input tensor, in schema order."""
        seen: dict[TensorRef, TensorSpec] = {}
        for ref in self.node.input_refs():
            spec = self._graph.spec(ref)
            if spec is not None and ref not in seen:
                seen[ref] = spec
        return list(seen.values())

    @property
    def outputs(self) -> list[TensorSpec]:
        return [o for o in self.node.outputs if o is not None]

    @property
    def out(self) -> TensorSpec:
        outputs = self.outputs
        if not outputs:
            raise RuleError(f"{self.target} has no tensor output")
        return outputs[0]

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, TensorRef):
            return self._graph.spec(value)
        if isinstance(value, (list, tuple)):
            return type(value)(self._resolve(v) for v in value)
        return value


RuleFn = Callable[[OpCall], Cost]
AliasRule = Callable[[OpCall], bool]  # True: the outputs share their input's storage


def op_key(op: Any) -> str:
    """Qualified name of an op, packet or overload: ``aten.mm`` / ``aten.mm.default``."""
    if isinstance(op, str):
        return op
    name = str(op)
    if not name.count("."):
        raise RuleError(f"cannot key op {op!r}")
    return name


@dataclass(frozen=True)
class Registration:
    rule: RuleFn
    site: str


class CostRegistry:
    """Rules by op key and the set of ops declared free (views, metadata)."""

    def __init__(self) -> None:
        self._rules: dict[str, Registration] = {}
        self._free: dict[str, str] = {}
        self._alias: dict[str, tuple[AliasRule, str]] = {}

    def register(self, ops: Iterable[Any], rule: RuleFn) -> None:
        site = _definition_site(rule)
        for key in map(op_key, ops):
            self._check_unique(key, site)
            self._rules[key] = Registration(rule, site)

    def declare_free(self, ops: Iterable[Any], reason: str) -> None:
        for key in map(op_key, ops):
            self._check_unique(key, reason)
            self._free[key] = reason

    def register_alias(self, ops: Iterable[Any], rule: AliasRule) -> None:
        """Register an alias check (see the module docstring) for `ops`."""
        site = _definition_site(rule)
        for key in map(op_key, ops):
            if key in self._alias:
                raise RuleError(f"duplicate alias rule for {key}: {self._alias[key][1]} and {site}")
            self._alias[key] = (rule, site)

    def alias_check(self, target: str) -> AliasRule | None:
        """The alias check for an overload (exact first, then its packet), if any."""
        found = self._alias.get(target) or self._alias.get(".".join(target.split(".")[:2]))
        return found[0] if found else None

    def _check_unique(self, key: str, site: str) -> None:
        previous = self._rules[key].site if key in self._rules else self._free.get(key)
        if previous is not None:
            raise RuleError(f"duplicate cost rule for {key}: {previous} and {site}")

    def lookup(self, node: Node) -> RuleFn | str | None:
        """The rule for a node, the reason it is free, or None when unsupported."""
        for key in (node.target, node.packet):
            if key in self._rules:
                return self._rules[key].rule
            if key in self._free:
                return self._free[key]
        return None

    def knows(self, target: str) -> bool:
        packet = ".".join(target.split(".")[:2])
        return any(k in self._rules or k in self._free for k in (target, packet))

    @property
    def keys(self) -> Mapping[str, str]:
        """Every registered key and where it was defined (or why it is free)."""
        return {**{k: r.site for k, r in self._rules.items()}, **self._free}


def _definition_site(fn: Callable[..., Any]) -> str:
    try:
        file = inspect.getsourcefile(fn) or "?"
        line = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))
    return f"{file}:{line} ({fn.__qualname__})"


REGISTRY = CostRegistry()


def cost_rule(*ops: Any) -> Callable[[RuleFn], RuleFn]:
    """Register the decorated function as the cost rule of `ops` in the default registry."""

    def decorate(fn: RuleFn) -> RuleFn:
        REGISTRY.register(ops, fn)
        return fn

    return decorate


def alias_rule(*ops: Any) -> Callable[[AliasRule], AliasRule]:
    """Register the decorated check as the alias rule of `ops` in the default registry."""

    def decorate(fn: AliasRule) -> AliasRule:
        REGISTRY.register_alias(ops, fn)
        return fn

    return decorate


def declare_free(ops: Iterable[Any], reason: str) -> None:
    """Declare `ops` free (no FLOPs, no bytes moved) in the default registry, saying why."""
    REGISTRY.declare_free(ops, reason)


def numel(shape: Iterable[int]) -> int:
    return math.prod(shape)
