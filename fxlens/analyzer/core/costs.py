"""The contract between the engine and the cost rules: `OpCall`, `Cost` and the registry.

A rule is a function ``OpCall -> Cost`` registered for one or more ops with `@cost_rule`.
Ops are keyed by their qualified names (``aten.mm`` for a whole overload packet,
``aten.mm.default`` for one overload, ``transformers.grouped_mm_fallback`` for a custom op),
so rules for third-party ops need not import the library that defines them.

Lookup order for a node: exact overload, then packet, then the free set; anything else is
unsupported. Registering the same key twice is an error naming both definition sites.

The decorators (``@cost_rule``, ``@alias_rule``, `declare_free`, and the coded families'
``@fusion_rule`` / ``@risk_rule`` through `declare_coded`) write no registry the engine reads:
they record into `DECLARED`, with the module that declared each rule, and
`fxlens.rules.load_rules` builds a fresh registry from the declarations of the built-in
families and of the rule packs (see `fxlens.rules`). Part of the rule-facing API.

Alias checks (``@alias_rule``) serve the memory pass: for ops whose schema's alias annotation
is only sometimes true (``reshape`` is a view only when the strides allow one; ``to`` and
``contiguous`` hand back their input only when nothing changes; eval-mode ``dropout`` returns
its input although its schema promises a fresh tensor), a check ``OpCall -> bool`` says
whether this call's output shares its input's storage. Ops without a check follow the schema.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fxlens.analyzer.core.coded import (
    CodedRule,
    CodedRules,
    H,
    caller_module,
    coded_rule,
    definition_site,
    duplicate,
)
from fxlens.analyzer.core.errors import RuleError
from fxlens.analyzer.core.graph import Graph, Node, TensorRef, TensorSpec, packet


@dataclass(frozen=True)
class Recurrence:
    """A kernel that walks a sequence in order: each of `programs` independent programs takes
    `steps` dependent steps, each the device's `recurrence_step_s` (a chunked scan's state
    kernel, `fxlens.rules.gdn`)."""

    steps: float
    programs: int


def waves(programs: int, multiprocessors: int) -> int:
    """How many times over `programs` fill `multiprocessors` SMs (one where unknown): each
    wave of a `Recurrence` walks its steps again."""
    if multiprocessors <= 0:
        return 1
    return max(math.ceil(programs / multiprocessors), 1)


@dataclass(frozen=True)
class Cost:
    """What one op call costs. ``None`` bytes mean: the engine's default for the node,
    every distinct input tensor read once (its storage bytes) and every output written once."""

    flops: int = 0
    bytes_read: int | None = None
    bytes_written: int | None = None
    note: str = ""      # the convention the rule applied to this call, shown per node
    kernel: str = ""    # a kernel class with its own share of the peak (``gemm-misaligned``)
    recurrence: Recurrence | None = None   # steps walked in order, on top of the work


class OpCall:
    """A read-only view of one node for a rule: arguments by schema name, specs resolved."""

    def __init__(self, node: Node, graph: Graph) -> None:
        self.node = node
        self._graph = graph

    @property
    def target(self) -> str:
        return self.node.target

    @property
    def graph(self) -> Graph:
        """The whole captured graph, read-only: for rules that look at how an argument was
        built (an attention mask's producers), never to change it."""
        return self._graph

    def has(self, name: str) -> bool:
        return self.node.args.get(name) is not None

    def ref(self, name: str) -> TensorRef | None:
        """The producer of a tensor argument (None when absent or not a tensor)."""
        value = self.node.args.get(name)
        return value if isinstance(value, TensorRef) else None

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
    def default_bytes_read(self) -> int:
        """The engine's default read for the call: every distinct input's storage once."""
        return sum(spec.storage_bytes for spec in self.inputs)

    @property
    def default_bytes_written(self) -> int:
        """The engine's default write for the call: every output once."""
        return sum(spec.nbytes for spec in self.outputs)

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
    site: str                   # where the rule is defined (file:line (qualname))
    module: str = ""            # the module that registered it

    @property
    def family(self) -> str:
        """The registering module's last name: the rule family for built-in rules."""
        return self.module.rpartition(".")[2]


class CostRegistry:
    """Every rule of one analysis: cost rules, free ops and alias checks by op key, and the
    coded rules (fusion, quantization risks) by code in `coded`.

    `select` and `copy` build new registries; a registry handed out to share (`load_rules`) is
    frozen, and registering into it is an error: extend a `copy()`.
    """

    def __init__(self) -> None:
        self._rules: dict[str, Registration] = {}
        self._free: dict[str, tuple[str, str]] = {}                   # key → (reason, module)
        self._alias: dict[str, tuple[AliasRule, str, str]] = {}       # key → (rule, site, module)
        self.coded = CodedRules()
        self._frozen = False

    def register(self, ops: Iterable[Any], rule: RuleFn, module: str | None = None) -> None:
        """Register `rule` for `ops`; `module` is the registering module (default: the rule's)."""
        self._check_open()
        site = definition_site(rule)
        module = rule.__module__ if module is None else module
        for key in map(op_key, ops):
            self._check_unique(key, site)
            self._rules[key] = Registration(rule, site, module)

    def declare_free(self, ops: Iterable[Any], reason: str, module: str = "") -> None:
        self._check_open()
        for key in map(op_key, ops):
            self._check_unique(key, reason)
            self._free[key] = (reason, module)

    def register_alias(self, ops: Iterable[Any], rule: AliasRule, module: str | None = None
                       ) -> None:
        """Register an alias check (see the module docstring) for `ops`."""
        self._check_open()
        site = definition_site(rule)
        module = rule.__module__ if module is None else module
        for key in map(op_key, ops):
            if key in self._alias:
                raise duplicate(f"duplicate alias rule for {key}", self._alias[key][1], site)
            self._alias[key] = (rule, site, module)

    def add_coded(self, rule: CodedRule[Any]) -> None:
        """Register a coded rule (`fxlens.analyzer.core.coded`)."""
        self._check_open()
        self.coded.add(rule)

    def alias_check(self, target: str) -> AliasRule | None:
        """The alias check for an overload (exact first, then its packet), if any."""
        found = self._alias.get(target) or self._alias.get(packet(target))
        return found[0] if found else None

    def _check_unique(self, key: str, site: str) -> None:
        previous = self._rules[key].site if key in self._rules else self._free.get(key, ("",))[0]
        if previous:
            raise duplicate(f"duplicate cost rule for {key}", previous, site)

    def _check_open(self) -> None:
        if self._frozen:
            raise RuleError("this registry is shared (load_rules) and frozen: register into "
                            "its copy() instead")

    def lookup(self, node: Node) -> RuleFn | str | None:
        """The rule for a node, the reason it is free, or None when unsupported."""
        found = self._find_key(node.target) or self._find_key(node.packet)
        return found.rule if isinstance(found, Registration) else found

    def find(self, target: str) -> Registration | str | None:
        """The registration of an op key (an overload: exact first, then its packet), the
        reason it is free, or None when unsupported."""
        return self._find_key(target) or self._find_key(packet(target))

    def _find_key(self, key: str) -> Registration | str | None:
        if key in self._rules:
            return self._rules[key]
        return self._free[key][0] if key in self._free else None

    def knows(self, target: str) -> bool:
        return self.find(target) is not None

    @property
    def keys(self) -> Mapping[str, str]:
        """Every registered key and where it was defined (or why it is free)."""
        return {**{k: r.site for k, r in self._rules.items()},
                **{k: reason for k, (reason, _) in self._free.items()}}

    def select(self, within: Callable[[str], bool]) -> CostRegistry:
        """A new (open) registry with the rules registered by the modules `within` accepts."""
        new = CostRegistry()
        new._rules = {k: r for k, r in self._rules.items() if within(r.module)}
        new._free = {k: f for k, f in self._free.items() if within(f[1])}
        new._alias = {k: a for k, a in self._alias.items() if within(a[2])}
        new.coded = self.coded.select(lambda rule: within(rule.module))
        return new

    def copy(self) -> CostRegistry:
        """A new (open) registry with every rule of this one, to extend without touching it."""
        return self.select(lambda _: True)

    def freeze(self) -> CostRegistry:
        """Refuse registrations from now on (see the class docstring); returns self."""
        self._frozen = True
        return self


# Every rule the decorators below have declared, in whichever module imported them: the
# pending list `fxlens.rules.load_rules` selects the built-in families and the rule packs from
# (by registering module). It is never handed to the engine; a duplicate is refused here, at
# the decorator, naming both sites.
DECLARED = CostRegistry()


def cost_rule(*ops: Any) -> Callable[[RuleFn], RuleFn]:
    """Declare the decorated function as the cost rule of `ops` (see `DECLARED`)."""

    def decorate(fn: RuleFn) -> RuleFn:
        DECLARED.register(ops, fn, caller_module(1))
        return fn

    return decorate


def alias_rule(*ops: Any) -> Callable[[AliasRule], AliasRule]:
    """Declare the decorated check as the alias rule of `ops` (see `DECLARED`)."""

    def decorate(fn: AliasRule) -> AliasRule:
        DECLARED.register_alias(ops, fn, caller_module(1))
        return fn

    return decorate


def declare_free(ops: Iterable[Any], reason: str) -> None:
    """Declare `ops` free (no FLOPs, no bytes moved), saying why (see `DECLARED`)."""
    DECLARED.declare_free(ops, reason, caller_module(1))


def declare_coded(family: str, code: str, priority: int = 0) -> Callable[[H], H]:
    """Declare the decorated handler as the coded rule `code` of `family` (see `DECLARED` and
    `fxlens.analyzer.core.coded`); the families' own decorators call this."""

    def decorate(fn: H) -> H:
        DECLARED.add_coded(coded_rule(family, code, fn, caller_module(1), priority))
        return fn

    return decorate


def declared_coded(family: str, module: str) -> tuple[CodedRule[Any], ...]:
    """The coded rules of `family` that `module` has declared so far, in the order they apply."""
    return DECLARED.coded.select(lambda rule: rule.module == module).of(family)


def numel(shape: Iterable[int]) -> int:
    return math.prod(shape)
