"""Which ops to save: a 0/1 knapsack per group of alike blocks, solved exactly where it can be.

The problem (`fxlens.analyzer.checkpoint.model.Separable`): variables ``j`` (an op of a block,
in every block of its group), each sparing ``value[j]`` of recompute when saved and adding
``extra[j][t]`` bytes at each point ``t`` of the step; maximise the value spared subject to
``base[t] + Σ extra[j][t]·x[j] ≤ capacity`` at every point — a knapsack with one constraint per
point, nearly always bound at one of them (where the backward starts, every block's saved
outputs held).

`solve`:
1. the Pareto frontier (weight, value) of the single-point knapsack at the point that binds
   when everything is saved — exact dynamic programming over item subsets, dominated ones
   pruned (Nemhauser–Ullmann) — is an exact answer to that relaxation, so its best value
   within the capacity bounds the real optimum from above;
2. every frontier policy's true peak (the max over points) is evaluated; the best that fits is
   the answer, proven optimal when it reaches the bound;
3. otherwise depth-first branch and bound over the variables (by value per byte), bounded by
   the fractional knapsacks at the tightest points, within `NODE_LIMIT` nodes: finished, it
   is exact; cut off, the best found is a heuristic, and its gap to the bound (the best any
   branch left open could reach) is reported.
A frontier over `FRONTIER_LIMIT` points is replaced by greedy prefixes (by value per byte),
which then bound nothing: the bound is the fractional (LP) knapsack's.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from fxlens.analyzer.checkpoint.model import Separable

FRONTIER_LIMIT = 20_000
NODE_LIMIT = 100_000
BOUND_ROWS = 4
REL_TOL = 1e-9


@dataclass(frozen=True)
class Solution:
    chosen: tuple[int, ...]      # variables saved
    value: float                 # recompute spared
    peak: int                    # the forward/backward's peak (`Separable.peak`)
    fits: bool
    exact: bool
    bound: float                 # an upper bound on the value spared (== value when exact)
    method: str


@dataclass(frozen=True)
class _Point:
    weight: int
    value: float
    chosen: int                  # a bit per variable


@dataclass(frozen=True)
class Frontier:
    """Policies worth considering for every capacity, each with its true peak."""

    row: int                     # the point whose single constraint the frontier solves
    points: tuple[_Point, ...]
    peaks: tuple[int, ...]
    exact: bool                  # the frontier is complete (else greedy prefixes)


def frontier(problem: Separable, values: Sequence[float]) -> Frontier:
    """The Pareto frontier at the point binding when every variable is saved."""
    everything = range(len(values))
    row = max(range(len(problem.base)),
              key=lambda t: problem.base[t] + sum(problem.extra[j][t] for j in everything),
              default=0)
    weights = [problem.extra[j][row] if problem.base else 0 for j in everything]
    points = _pareto(weights, values)
    exact = points is not None
    if points is None:
        points = _greedy_prefixes(weights, values)
    peaks = tuple(problem.peak(bits(p.chosen)) for p in points)
    return Frontier(row, tuple(points), peaks, exact)


def solve(problem: Separable, values: Sequence[float], capacity: int,
          front: Frontier | None = None, node_limit: int = NODE_LIMIT) -> Solution:
    """The most recompute spared with the peak ≤ `capacity` (see the module docstring)."""
    front = front or frontier(problem, values)
    least = problem.peak(())
    if least > capacity:
        return Solution((), 0.0, least, False, True, 0.0, "nothing fits: every op recomputed")
    room = capacity - (problem.base[front.row] if problem.base else 0)
    fitting = [(0.0, -least, _Point(0, 0.0, 0))]       # saving nothing always fits
    fitting += [(p.value, -peak, p) for p, peak in zip(front.points, front.peaks, strict=True)
                if peak <= capacity]
    value, neg_peak, best = max(fitting, key=lambda f: (f[0], f[1]))
    weights = [problem.extra[j][front.row] if problem.base else 0 for j in range(len(values))]
    bound = (max(p.value for p in front.points if p.weight <= room) if front.exact
             else _fractional(weights, values, room, range(len(values))))
    if value >= bound * (1 - REL_TOL):
        return Solution(bits(best.chosen), value, -neg_peak, True, True, bound,
                        "exact: the knapsack's Pareto frontier")
    search = _BranchAndBound(problem, values, weights, capacity, front.row, value, best.chosen)
    done = search.run(node_limit)
    chosen = bits(search.best)
    if done:
        return Solution(chosen, search.best_value, problem.peak(chosen), True, True,
                        search.best_value, f"exact: branch and bound ({search.nodes} nodes)")
    return Solution(chosen, search.best_value, problem.peak(chosen), True, False,
                    min(bound, search.bound),
                    f"heuristic: branch and bound stopped at {node_limit} nodes")


def bits(mask: int) -> tuple[int, ...]:
    return tuple(j for j in range(mask.bit_length()) if mask >> j & 1)


def _pareto(weights: Sequence[int], values: Sequence[float]) -> list[_Point] | None:
    """Every non-dominated (weight, value) of subsets, lightest first; None past the limit."""
    points = [_Point(0, 0.0, 0)]
    for j, (w, v) in enumerate(zip(weights, values, strict=True)):
        if v <= 0:
            continue
        shifted = [_Point(p.weight + w, p.value + v, p.chosen | 1 << j) for p in points]
        merged = sorted(points + shifted, key=lambda p: (p.weight, -p.value))
        points = []
        for p in merged:
            if not points or p.value > points[-1].value:
                points.append(p)
        if len(points) > FRONTIER_LIMIT:
            return None
    return points


def _greedy_prefixes(weights: Sequence[int], values: Sequence[float]) -> list[_Point]:
    order = sorted((j for j, v in enumerate(values) if v > 0),
                   key=lambda j: -values[j] / weights[j] if weights[j] else float("-inf"))
    points = [_Point(0, 0.0, 0)]
    for j in order:
        last = points[-1]
        points.append(_Point(last.weight + weights[j], last.value + values[j],
                             last.chosen | 1 << j))
    return points


def _fractional(weights: Sequence[int], values: Sequence[float], room: int,
                free: Sequence[int]) -> float:
    """The LP bound: items of `free` by value per byte, the last one in part."""
    total = 0.0
    for j in sorted(free, key=lambda j: -values[j] / weights[j] if weights[j]
                    else float("-inf")):
        if values[j] <= 0:
            continue
        if weights[j] <= room:
            room -= weights[j]
            total += values[j]
        else:
            return total + values[j] * room / weights[j] if room > 0 else total
    return total


class _BranchAndBound:
    """Depth-first over variables by value per byte at the binding point. A node's bound is
    the least of the fractional knapsacks at the `BOUND_ROWS` points with the least slack (any
    one point's is a valid bound); a branch that cannot beat the best found is cut."""

    def __init__(self, problem: Separable, values: Sequence[float], weights: Sequence[int],
                 capacity: int, row: int, best_value: float, best: int) -> None:
        self.problem, self.values = problem, values
        self.order = sorted((j for j, v in enumerate(values) if v > 0),
                            key=lambda j: _ratio(values[j], weights[j]))
        self.rows = len(problem.base)
        self.by_row = [self._ordered(t) for t in range(self.rows)]
        self.start = [capacity - b for b in problem.base]
        self.best_value, self.best = best_value, best
        self.nodes = 0
        self.bound = float("inf")

    def _ordered(self, t: int) -> list[int]:
        column = [self.problem.extra[j][t] for j in range(len(self.values))]
        return sorted(self.order, key=lambda j: _ratio(self.values[j], column[j]))

    def run(self, limit: int = NODE_LIMIT) -> bool:
        """Whether the search finished (else it stopped at `limit` nodes, `bound` then the
        best any branch left open could reach)."""
        stack: list[tuple[int, float, int, list[int]]] = [(0, 0.0, 0, self.start)]
        while stack:
            depth, value, chosen, slack = stack.pop()
            self.nodes += 1
            if self.nodes > limit:
                stack.append((depth, value, chosen, slack))
                self.bound = max([self.best_value, *(
                    self._bound(*node) for node in stack if node[0] < len(self.order))])
                return False
            if value > self.best_value:
                self.best_value, self.best = value, chosen
            if depth == len(self.order) or self._bound(depth, value, chosen, slack) \
                    <= self.best_value * (1 + REL_TOL):
                continue
            j = self.order[depth]
            stack.append((depth + 1, value, chosen, slack))
            column = self.problem.extra[j]
            if all(c <= s for c, s in zip(column, slack, strict=True)):
                stack.append((depth + 1, value + self.values[j], chosen | 1 << j,
                              [s - c for s, c in zip(slack, column, strict=True)]))
        return True

    def _bound(self, depth: int, value: float, chosen: int, slack: Sequence[int]) -> float:
        decided = {*self.order[:depth]}
        tight = heapq.nsmallest(BOUND_ROWS, range(self.rows), key=slack.__getitem__)
        best = float("inf")
        for t in tight:
            room, total = slack[t], value
            for j in self.by_row[t]:
                if j in decided:
                    continue
                w = self.problem.extra[j][t]
                if w <= room:
                    room -= w
                    total += self.values[j]
                else:
                    total += self.values[j] * room / w if room > 0 else 0.0
                    break
            best = min(best, total)
        return best


def _ratio(value: float, weight: int) -> float:
    """Sort key: value per byte, highest first; a variable costing nothing there first."""
    return -value / weight if weight else float("-inf")
