"""``ckpt=auto``: the least recompute that makes a layout fit, chosen per module of the blocks.

A layout that fits as it is recomputes nothing. Otherwise the choice is the selective
recompute ``ckpt=…`` already prices (`fxlens.analyzer.plan.recompute`): a set of module paths
inside the repeated blocks, each recomputed with its children in every block that has it
(Megatron-core's ``--recompute-modules`` and ``torch.utils.checkpoint`` around a submodule
work at this grain). What a path frees is the activations its modules save on one GPU, what
it costs their forward seconds on that GPU, both summed over the model's blocks under the
layout (tp, sp, cp, experts).

Paths nest (``mlp`` holds ``mlp.up_proj``), so the choices form a tree: a module is either
recomputed whole, or some of its children are (and, for an attention module, its own ops
alone: ``core_attn``). The Pareto frontier of (seconds, bytes) over that tree is exact: each
node's frontier is its children's combined (their choices are disjoint) plus itself whole,
dominated points dropped. The frontier's points, cheapest first, then have their memory
estimated as real layouts (`fxlens.analyzer.plan.stage_memory`, memory alone) — a bisection
for the first that fits, since each point frees more than the last — so a stage's in-flight
micro-batches and the block recomputed during its backward are counted as the layout counts
them. When no selective choice fits, full recompute (``ckpt``) is tried; when nothing fits,
the layout that needs least is returned, not fitting. Only the answer is timed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from fxlens.analyzer.core.sections import PlanLayout
from fxlens.analyzer.plan.estimate import estimate
from fxlens.analyzer.plan.recompute import KINDS, recomputed_parts
from fxlens.analyzer.plan.stage_memory import peak_bytes
from fxlens.analyzer.plan.strategy import Strategy
from fxlens.analyzer.plan.structure import ModelFacts
from fxlens.analyzer.plan.transfers import Links
from fxlens.analyzer.plan.types import remembered
from fxlens.analyzer.plan.unit_share import degrees, is_block, phase_s, saved_on_gpu

FRONTIER_LIMIT = 4_000      # points kept per node; past it the frontier is thinned
CORE_ATTENTION = "\0core_attn"   # a child no module path can be named
UNWRITABLE = ",+= "                # characters a ckpt= pattern cannot hold


@dataclass(frozen=True)
class Choice:
    """Recompute `patterns` (paths inside a block, or ``core_attn``): `seconds` of forward
    and `freed` bytes saved, summed over the blocks, on one GPU under the layout."""

    seconds: float
    freed: float
    patterns: tuple[str, ...]

    def plus(self, other: Choice) -> Choice:
        return Choice(self.seconds + other.seconds, self.freed + other.freed,
                      self.patterns + other.patterns)


NOTHING = Choice(0.0, 0.0, ())


@dataclass
class _Node:
    own: Choice = NOTHING                   # this module's own ops
    children: dict[str, _Node] | None = None


def estimate_auto(facts: ModelFacts, strategy: Strategy, device: Links,
                  tokens: int | None = None, price_per_gpu_hour: float | None = None
                  ) -> PlanLayout:
    """`strategy` on `device`, its ``ckpt=auto`` resolved (see the module docstring); a
    strategy without it is estimated as given."""
    resolved, _ = resolve_auto(facts, strategy, device)
    return estimate_resolved(facts, strategy, resolved, device, tokens, price_per_gpu_hour)


def estimate_resolved(facts: ModelFacts, asked: Strategy, resolved: Strategy, device: Links,
                      tokens: int | None = None, price_per_gpu_hour: float | None = None
                      ) -> PlanLayout:
    """The layout of `resolved`, what `resolve_auto` made of `asked`."""
    layout = estimate(facts, resolved, device, tokens, price_per_gpu_hour)
    return replace(layout, recompute_auto=True) if asked.checkpoint_auto else layout


def resolve_auto(facts: ModelFacts, strategy: Strategy, device: Links) -> tuple[Strategy, int]:
    """The strategy ``ckpt=auto`` settles on and its peak bytes per GPU: only memory is
    estimated on the way (`fxlens.analyzer.plan.stage_memory`), the time once, of the answer."""
    peaks: dict[Strategy, int] = {}

    def peak(s: Strategy) -> int:
        if s not in peaks:
            peaks[s] = peak_bytes(facts, s, device)
        return peaks[s]

    def fits(s: Strategy) -> bool:
        return peak(s) <= device.usable_bytes

    if not strategy.checkpoint_auto:
        return strategy, peak(strategy)
    base = replace(strategy, checkpoint_auto=False)
    if fits(base):
        return base, peak(base)
    options = [c.patterns for c in frontier(facts, base) if c.patterns]
    # the options free more and more: when the one freeing the most does not fit, none does
    most = replace(base, recompute=options[-1]) if options else None
    if most is not None and fits(most):
        first = _first_fitting(options, lambda p: fits(replace(base, recompute=p)))
        if first is not None:
            chosen = replace(base, recompute=first)
            return chosen, peak(chosen)
    full = replace(base, checkpoint=True)
    if fits(full) or most is None:
        answer = full if peak(full) <= peak(base) else base
    else:
        answer = min((base, most, full), key=peak)
    return answer, peak(answer)


def _first_fitting(options: Sequence[tuple[str, ...]], fits: Callable[[tuple[str, ...]], bool]
                   ) -> tuple[str, ...] | None:
    """The cheapest of `options` (cheapest first, each freeing more) that fits."""
    lo, hi, found = 0, len(options) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(options[mid]):
            found, hi = options[mid], mid - 1
        else:
            lo = mid + 1
    return found


def frontier(facts: ModelFacts, s: Strategy) -> list[Choice]:
    """Every choice of module paths no other choice beats on both seconds and freed bytes,
    cheapest first (remembered per the degrees it reads)."""
    def work() -> list[Choice]:
        root, plain = _tree(facts, s)
        return _frontier(root, "", plain)
    return list(remembered(facts.answers, ("frontier", *degrees(s)), work))


def _tree(facts: ModelFacts, s: Strategy) -> tuple[_Node, frozenset[str]]:
    """The blocks' modules by path inside a block, each with its own ops' seconds and bytes
    summed over the blocks; the paths spelled like a module kind that the kind means exactly
    (a pattern needs no escaping for them)."""
    seq_div = s.tp if s.sp else 1
    seconds: defaultdict[str, float] = defaultdict(float)
    freed: defaultdict[str, float] = defaultdict(float)
    attention: set[str] = set()
    for unit in facts.units:
        if not is_block(unit):
            continue
        for part in unit.parts:
            if not part.name.startswith(unit.name + "."):
                continue
            inside = part.name[len(unit.name) + 1:].lower()
            seconds[inside] += phase_s(s, part, "forward")
            freed[inside] += saved_on_gpu(part, s.tp, seq_div) / s.cp
            if KINDS["core_attn"](inside.split("."), part.types):
                attention.add(inside)
    tops = {path.split(".")[0] for path in seconds}
    plain = {kind for kind in KINDS if kind in tops and _kind_is_path(facts, kind)}
    root = _Node(children={})
    for path in seconds:
        node = root
        for segment in path.split("."):
            assert node.children is not None
            node = node.children.setdefault(segment, _Node(children={}))
        node.own = Choice(seconds[path], freed[path], ())
    if len(attention) == 1:     # ``core_attn``: the one attention module's own ops alone
        path = next(iter(attention))
        node = _find(root, path)
        node.children = {**(node.children or {}), CORE_ATTENTION: _Node(
            own=Choice(seconds[path], freed[path], ("core_attn",)))}
    return root, frozenset(plain)


def _find(root: _Node, path: str) -> _Node:
    node = root
    for segment in path.split("."):
        assert node.children is not None
        node = node.children[segment]
    return node


def _kind_is_path(facts: ModelFacts, kind: str) -> bool:
    """Whether module kind `kind` (``mlp``) recomputes, in every block, exactly the module at
    the path of that name and its children."""
    return all(recomputed_parts(u, (kind,)) == recomputed_parts(u, (_as_pattern(kind),))
               for u in facts.units if is_block(u))


def _frontier(node: _Node, path: str, plain: frozenset[str]) -> list[Choice]:
    """`node`'s frontier: its children's choices combined, and (below the root) the whole
    module at its path."""
    points = [NOTHING]
    for name, child in (node.children or {}).items():
        if name == CORE_ATTENTION:
            inner = [NOTHING, child.own]
        else:
            inner = _frontier(child, f"{path}.{name}" if path else name, plain)
        points = _pareto([a.plus(b) for a in points for b in inner])
    if not path or any(c in path for c in UNWRITABLE):
        return points       # the block itself, or a path the strategy text cannot carry
    whole = _total(node)
    pattern = path if path in plain else _as_pattern(path)
    return _pareto([*points, Choice(whole.seconds, whole.freed, (pattern,))])


def _total(node: _Node) -> Choice:
    """Seconds and bytes of `node` and everything under it (core_attn is its parent's own
    ops, counted once)."""
    total = node.own
    for name, child in (node.children or {}).items():
        if name != CORE_ATTENTION:
            total = total.plus(_total(child))
    return total


def _as_pattern(path: str) -> str:
    """`path` as a ``ckpt=`` pattern that means that module alone: glob characters escaped
    (``[*]``), and a path spelled like a module kind (``mlp``, ``norm``) too (``[m]lp``)."""
    escaped = "".join(f"[{c}]" if c in "*?[" else c for c in path)
    return f"[{path[0]}]{escaped[1:]}" if path in KINDS else escaped


def _pareto(points: Sequence[Choice]) -> list[Choice]:
    """The points no other beats on both (fewer seconds, more bytes freed), cheapest first;
    thinned to `FRONTIER_LIMIT` evenly when longer."""
    kept: list[Choice] = []
    for point in sorted(points, key=lambda c: (c.seconds, -c.freed)):
        if not kept or point.freed > kept[-1].freed:
            kept.append(point)
    if len(kept) > FRONTIER_LIMIT:
        step = len(kept) / FRONTIER_LIMIT
        kept = [kept[int(i * step)] for i in range(FRONTIER_LIMIT - 1)] + [kept[-1]]
    return kept
