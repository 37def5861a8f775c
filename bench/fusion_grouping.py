"""Kernel grouping (`plan_kernels`): the hand-written union-find and cycle check against the same
algorithm on networkx (`nx.utils.UnionFind`, BFS over a `subgraph_view`), on a big real graph.

    .venv/bin/python bench/fusion_grouping.py [hf:llama-3-70b] [--seq-len 2048] [--train]
                                              [--repeat 3]

Captures the target once (a training step with ``--train``), then times `plan_kernels` under
both policies with each implementation (median of runs) and checks that both give the same
kernels. The result is written down in `fxlens.analyzer.fusion.kernels`' module docstring.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import networkx as nx

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.capture.load import load
from fxlens.analyzer.capture.training import capture_training
from fxlens.analyzer.cost.engine import analyze
from fxlens.analyzer.fusion import kernels
from fxlens.analyzer.fusion.kernels import Policy, effective_kinds, plan_kernels
from fxlens.analyzer.fusion.types import FusionGraph
from fxlens.rules import load_rules
from fxlens.rules.fusion import kinds_of


class NxGroups:
    """`kernels._Groups` on networkx's union-find (members kept beside it, as plan_kernels
    reads them)."""

    def __init__(self) -> None:
        self.uf = nx.utils.UnionFind()
        self.parent = self.uf.parents
        self.members: dict[int, list[int]] = {}
        self.has_gemm: dict[int, bool] = {}
        self.mask: dict[int, int] = {}
        self.readers: dict[int, int] = {}

    def add(self, node: int, gemm: bool, readers: int = 0) -> None:
        self.uf.union(node)
        self.members[node] = [node]
        self.has_gemm[node] = gemm
        self.mask[node] = 1 << node
        self.readers[node] = readers

    def find(self, node: int) -> int:
        return int(self.uf[node])

    def union(self, a: int, b: int) -> None:
        ra, rb = self.uf[a], self.uf[b]
        if ra == rb:
            return
        self.uf.union(a, b)
        root = self.uf[a]
        other = rb if root == ra else ra
        self.members[root] += self.members.pop(other)
        self.has_gemm[root] = self.has_gemm[root] or self.has_gemm.pop(other)
        self.mask[root] |= self.mask.pop(other)
        self.readers[root] |= self.readers.pop(other)


def users_graph(fg: FusionGraph) -> nx.DiGraph:
    graph = nx.DiGraph()
    for ref, users in fg.consumers.items():
        graph.add_edges_from((ref.node, user) for user in users)
    return graph


def nx_creates_cycle(graph: nx.DiGraph) -> Callable[..., bool]:
    def creates_cycle(fg: FusionGraph, groups: Any, a: int, node: int, reach: Any) -> bool:
        ga, gb = groups.find(a), groups.find(node)
        view = nx.subgraph_view(graph, filter_node=lambda n: (
            n in groups.parent and n <= node and groups.find(n) != ga))
        starts = [u for m in groups.members[ga] if m in graph for u in graph.successors(m)
                  if u in view and groups.find(u) != gb]
        targets = set(groups.members[gb])
        seen: set[int] = set()
        for start in starts:
            if start in seen:
                continue
            seen.add(start)
            for _, reached in nx.bfs_edges(view, start):
                if reached in targets:
                    return True
                seen.add(reached)
        return False
    return creates_cycle


@contextmanager
def networkx_grouping(fg: FusionGraph, cycle_check: bool = True) -> Iterator[None]:
    """Swap in networkx's union-find and (with `cycle_check`) the BFS cycle check."""
    saved = kernels._Groups, kernels._creates_cycle
    kernels._Groups = NxGroups  # type: ignore[misc,assignment]
    if cycle_check:
        kernels._creates_cycle = nx_creates_cycle(users_graph(fg))
    try:
        yield
    finally:
        kernels._Groups, kernels._creates_cycle = saved  # type: ignore[misc]


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", nargs="?", default="hf:llama-3-70b")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    loaded = load(args.target, sizes={"seq_len": args.seq_len})
    registry = load_rules()
    graph = (capture_training(loaded.module, loaded.inputs, registry).graph if args.train
             else capture(loaded.module, loaded.inputs, registry))
    report = analyze(graph, registry)
    fg = FusionGraph(graph, effective_kinds(report, kinds_of(list(graph.nodes), registry)))
    costs = {n.id: n for n in report.nodes}
    print(f"{args.target}{' --train' if args.train else ''}: {len(graph.nodes)} nodes, "
          f"{sum(1 for _ in graph.calls())} call nodes")
    for policy in (Policy(), Policy(gemm_epilogues=True)):
        hand_s, hand = timed(lambda p=policy: plan_kernels(fg, costs, p), args.repeat)
        with networkx_grouping(fg, cycle_check=False):
            uf_s, uf_plan = timed(lambda p=policy: plan_kernels(fg, costs, p), args.repeat)
        with networkx_grouping(fg):
            nx_s, nx_plan = timed(lambda p=policy: plan_kernels(fg, costs, p), args.repeat)
        same = hand == uf_plan == nx_plan
        print(f"  {policy}: hand-written {hand_s:.3f} s; networkx union-find {uf_s:.3f} s "
              f"({uf_s / hand_s:.1f}×); networkx union-find + BFS {nx_s:.3f} s "
              f"({nx_s / hand_s:.1f}×); {len(hand.kernels)} kernels, same result: {same}")


if __name__ == "__main__":
    main()
