"""Fusion: run the fusion pattern rules, and model the kernels a fusing compiler would emit.

No op knowledge lives here. The rules (`fxlens.rules.fusion`) come in as data: an `OpKind` per
call node and the `FusionRule`s in the order they apply (code, parsed docstring, matcher). The
types the rules see (`FusionGraph`: free nodes — views, metadata, viewable reshapes, anything
that moves no byte — are see-through; `Match`, `OpKind`) live in `fxlens.analyzer.fusion.types`.
This module owns

- `run_rules`: every rule's matcher on every call node; each `Match` names the intermediates a
  fused kernel would no longer materialise (and tensors it would read fewer times). Saved bytes
  = Σ (bytes written + bytes read) of those intermediates (domain.md, "Fusion"), plus the
  re-reads avoided. An intermediate is claimed by one finding only: rules run in the order
  given (the most specific first), and a later match keeps only unclaimed intermediates.
  A finding's fix is the rule docstring's ``Fix:`` line the match names.
  ``saved_s`` = saved bytes / the roofline device's achievable bandwidth when a device is
  given, else None, plus the seconds of the FLOPs a fix skips (`Match.flops_saved`) at the
  device's rate for that node. Findings are ranked by time saved when a device is given (a
  fix that skips work can matter most while saving few bytes), else by bytes saved.
- `plan_kernels`: groups the graph into kernels as Inductor does by default: connected
  pointwise and reduction nodes fuse into one kernel whenever that creates no cycle through
  another kernel and both belong to one phase (a training step's forward, backward and
  optimizer step are compiled as separate graphs: AOTAutograd partitions the joint graph,
  so the loss's last forward ops and its gradient's first backward ops never share a
  kernel); GEMMs, convolutions and other library calls stay one kernel each (with
  `Policy(gemm_epilogues=True)` a GEMM also absorbs its pointwise consumers, as cuBLASLt
  epilogues or Triton GEMM templates do). Bytes after fusion = the unfused bytes of the
  members, minus the writes and reads of tensors that never leave the kernel, minus repeated
  reads of one input inside a kernel.

Why the union-find (`_Groups`) and the cycle check (`_creates_cycle`) are hand-written rather
than networkx's (`nx.utils.UnionFind`; BFS over an `nx.subgraph_view` of the users graph):
measured with ``bench/fusion_grouping.py`` (same kernels either way), `plan_kernels` on the
training step of hf:llama-2-7b at seq 2048 (23 835 nodes) takes 1.1–1.4 s hand-written, 1.2×
that with networkx's union-find, and 7–9× that (8–12 s) with its BFS as well; on
hf:llama-3-70b's step (64 331 nodes) 8.3 s against 57–67 s. networkx pays for its generality
per visited node (filter callbacks, generic views), and the check runs once per candidate edge;
the union-find alone would save ten lines for a fifth more time. Measured 2026-11-23 on
x86_64, 2 shared cores, networkx 3.6.1, torch 2.13.0+cpu. Since then (issue 15) the cycle
check reads each node's readers from lists built once (`_user_lists`) and looks each
reader's group up once: on the same 7B step 5.1 → 1.0 s (default) and 4.5 → 2.2 s (GEMM
epilogues), same kernels (one run each, the machine shared); on an idle machine later that
day, 0.28 s and 0.26 s (median of 5). A per-group frontier of readers, pruned as groups grow,
was tried then and not kept: 0.26 s, within noise. Later still, the search skips every node
that reaches no member of the other group by any path (`_descendants`, bitmasks built once
per plan): most checks find no cycle and used to walk all the first group's descendants
below the node. On the step recorded without device queries (8,662 nodes), 0.085 s and
0.068 s per policy with the skip (bench/fusion_grouping.py, median of 3: same kernels as
networkx's BFS), against 0.37 s for both before; on seven more graphs (gpt2, llama-3-70b,
mixtral, deepseek-v3 and whisper steps among them) the same kernels with and without it.
Since then each group keeps its members' readers as a bitmask too, and the check with the
bitmasks is no search at all: is there a reader of the first group, outside both, whose
descendants hold a member of the other? The default plan of llama-3-70b at seq 2048 went
0.081 → 0.042 s and deepseek-v3's 0.160 → 0.089 s, the same kernels on nine graphs (one run
each, old and new module on the same graph).

NB: no horizontal fusion of independent kernels that only share an input; no split of a
group that a real scheduler would split (mismatched iteration spaces, register pressure);
CPU-only layout conversions Inductor adds before convolutions are not modelled.
NB: an intermediate read by two consumers, or a graph output, is never fused away in the
findings (it must be written anyway); the kernel model does fuse such a tensor's consumers
into one kernel when they are fusable, which is what Inductor does.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fxlens.analyzer.core.graph import Graph, Node, TensorRef, ancestors
from fxlens.analyzer.core.report import NodeReport, Report
from fxlens.analyzer.core.sections import Finding, Findings, Fusion, KernelCounts
from fxlens.analyzer.fusion.types import FUSABLE, FusionGraph, FusionRule, OpKind

# --- findings ----------------------------------------------------------------------------------

def run_rules(fg: FusionGraph, rules: Sequence[FusionRule],
              bandwidth_bytes_per_s: float | None = None,
              compute_s: Callable[[int, int], float] | None = None) -> list[Finding]:
    """Every rule on every call node, each intermediate claimed once; most time saved first
    where a device gives times, else most bytes saved.
    `compute_s(node id, flops)`: the device's seconds for that node's kind of work, which
    adds the FLOPs a fix skips (`Match.flops_saved`) to its time saved."""
    claimed: set[TensorRef] = set()
    found: list[Finding] = []
    calls = list(fg.graph.calls())
    for rule in rules:
        for node in calls:
            match = rule.handler(fg, node)
            if match is None:
                continue
            fresh = [r for r in dict.fromkeys(match.intermediates) if r not in claimed]
            if match.intermediates and not fresh and not match.rereads \
                    and not match.flops_saved:
                continue
            claimed.update(fresh)
            saved = sum(fg.traffic(r) for r in fresh)
            saved += sum(times * fg.nbytes(r) for r, times in match.rereads)
            if saved <= 0 and match.flops_saved <= 0:
                continue
            seconds = saved / bandwidth_bytes_per_s if bandwidth_bytes_per_s else None
            if seconds is not None and match.flops_saved:
                seconds += compute_s(match.nodes[0], match.flops_saved) if compute_s else 0.0
            modules = tuple(dict.fromkeys(fg.node(i).module for i in match.nodes))
            found.append(Finding(rule.code, tuple(sorted(match.nodes)), modules, saved, seconds,
                                 match.message, rule.doc.fix(match.fix_variant),
                                 match.flops_saved))
    if bandwidth_bytes_per_s:   # time saved ranks: it weighs skipped work beside bytes
        return sorted(found, key=lambda f: (-(f.saved_s or 0.0), -f.saved_bytes, f.code,
                                            f.nodes))
    return sorted(found, key=lambda f: (-f.saved_bytes, f.code, f.nodes))


# --- the fused-graph model ---------------------------------------------------------------------

@dataclass(frozen=True)
class Policy:
    """What the modelled compiler fuses. Default: Inductor's default (GEMMs are library calls)."""

    gemm_epilogues: bool = False


@dataclass(frozen=True)
class Kernel:
    nodes: tuple[int, ...]
    module: str
    flops: int
    bytes_unfused: int
    bytes_fused: int


@dataclass(frozen=True)
class KernelPlan:
    kernels: tuple[Kernel, ...]
    kernels_unfused: int
    bytes_unfused: int

    @property
    def bytes_fused(self) -> int:
        return sum(k.bytes_fused for k in self.kernels)


class _Groups:
    """Union-find over node ids, with each group's members."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}
        self.members: dict[int, list[int]] = {}
        self.has_gemm: dict[int, bool] = {}
        self.mask: dict[int, int] = {}          # each group's members as a bitmask
        self.readers: dict[int, int] = {}       # every reader of a member, as a bitmask

    def add(self, node: int, gemm: bool, readers: int = 0) -> None:
        self.parent[node] = node
        self.members[node] = [node]
        self.has_gemm[node] = gemm
        self.mask[node] = 1 << node
        self.readers[node] = readers

    def find(self, node: int) -> int:
        root = node
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[node] != root:
            self.parent[node], node = root, self.parent[node]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if len(self.members[ra]) < len(self.members[rb]):
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.members[ra] += self.members.pop(rb)
        self.has_gemm[ra] = self.has_gemm[ra] or self.has_gemm.pop(rb)
        self.mask[ra] |= self.mask.pop(rb)
        self.readers[ra] |= self.readers.pop(rb)


def _creates_cycle(users: list[list[int]], groups: _Groups, a: int, node: int,
                   reach: Mapping[int, int] | None) -> bool:
    """Would merging group `a` with `node`'s group put another kernel between them?

    A path from group `a` to `node`'s group through an outside node; the nodes are in
    topological order, so only ids below `node` need a look. `users` lists each node's
    readers (`_user_lists`); `reach`, when given, each node's descendants (`_descendants`).

    With `reach` there is no search: a cycle is a reader of group `a` outside both groups
    that reaches a member of `node`'s group. A path from such a reader back through group
    `a` cannot exist: it would be a cycle between kernels, and no merge makes one."""
    find, parent = groups.find, groups.parent
    ga, gb = find(a), find(node)
    target = groups.mask[gb]
    if reach is not None:
        outside = groups.readers[ga] & ~groups.mask[ga] & ~target
        while outside:
            lowest = outside & -outside
            if reach.get(lowest.bit_length() - 1, 0) & target:
                return True
            outside ^= lowest
        return False
    stack = [user for m in groups.members[ga] for user in users[m]
             if user < node and user in parent and find(user) not in (ga, gb)]
    seen: set[int] = set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        for user in users[current]:
            if user > node or user in seen or user not in parent:
                continue
            root = find(user)
            if root == gb:
                return True
            if root != ga:
                stack.append(user)
    return False


# Above this many fusable-or-not call nodes, `_descendants` is not built: its bitmasks take
# about n²/16 bytes (160 MB at 50 000).
REACH_MAX_NODES = 50_000


def _descendants(users: list[list[int]], calls: Sequence[int]) -> dict[int, int] | None:
    """Each of `calls`' descendants through `calls` (ids in topological order), as a bitmask
    over node ids; None past `REACH_MAX_NODES`."""
    if len(calls) > REACH_MAX_NODES:
        return None
    reach: dict[int, int] = {}
    for node in reversed(calls):
        mask = 0
        for user in users[node]:
            below = reach.get(user)
            if below is not None:
                mask |= below | (1 << user)
        reach[node] = mask
    return reach


def _bits(ids: Iterable[int]) -> int:
    mask = 0
    for i in ids:
        mask |= 1 << i
    return mask


def _user_lists(fg: FusionGraph) -> list[list[int]]:
    """Readers of each node's outputs by node id (`FusionGraph.consumers`), built once: the
    cycle check asks for the same nodes' readers many times."""
    users: list[list[int]] = [[] for _ in fg.graph.nodes]
    for ref, readers in fg.consumers.items():
        users[ref.node].extend(readers)
    return users


def plan_kernels(fg: FusionGraph, costs: Mapping[int, NodeReport], policy: Policy = Policy()
                 ) -> KernelPlan:
    """Group the call nodes into kernels (see the module docstring)."""
    groups = _Groups()
    users = _user_lists(fg)
    calls = [n for n in fg.graph.calls() if fg.kind(n.id) is not OpKind.FREE]
    reach = _descendants(users, [n.id for n in calls])
    for node in calls:
        kind = fg.kind(node.id)
        groups.add(node.id, kind is OpKind.GEMM, _bits(users[node.id]))
        if kind not in FUSABLE:
            continue
        for src in fg.sources(node):
            producer = src.node
            if producer not in groups.parent or groups.find(producer) == groups.find(node.id):
                continue
            pkind = fg.kind(producer)
            fusable = pkind in FUSABLE or (
                policy.gemm_epilogues and pkind is OpKind.GEMM and kind is OpKind.POINTWISE)
            if groups.has_gemm[groups.find(producer)] and groups.has_gemm[groups.find(node.id)]:
                fusable = False
            if fg.graph.nodes[producer].phase != node.phase:   # compiled as separate graphs
                fusable = False
            if fusable and not _creates_cycle(users, groups, producer, node.id, reach):
                groups.union(producer, node.id)
    kernels = tuple(_kernel(fg, costs, sorted(members))
                    for members in sorted(groups.members.values(), key=min))
    return KernelPlan(kernels, len(calls), sum(costs[n.id].bytes_read + costs[n.id].bytes_written
                                               for n in fg.graph.calls() if n.id in costs))


def _kernel(fg: FusionGraph, costs: Mapping[int, NodeReport], members: list[int]) -> Kernel:
    inside = set(members)
    unfused = sum(costs[m].bytes_read + costs[m].bytes_written for m in members if m in costs)
    internal = 0
    external_reads: dict[TensorRef, list[int]] = defaultdict(list)
    for m in members:
        for src, read in fg.reads.get(m, []):
            if src.node in inside:
                internal += read
            else:
                external_reads[src].append(read)
        for index in range(len(fg.node(m).outputs)):
            ref = TensorRef(m, index)
            users = fg.consumers.get(ref, [])
            if users and ref not in fg.outputs and all(u in inside for u in users):
                internal += fg.nbytes(ref)
    repeated = sum(sum(reads) - max(reads) for reads in external_reads.values())
    modules = [fg.node(m).module for m in members]
    return Kernel(tuple(members), _common_module(modules),
                  sum(costs[m].flops for m in members if m in costs),
                  unfused, max(unfused - internal - repeated, 0))


def _common_module(paths: list[str]) -> str:
    common = ancestors(paths[0])
    for path in dict.fromkeys(paths[1:]):   # a repeated path narrows nothing more
        chain = ancestors(path)
        common = [p for p, q in zip(common, chain, strict=False) if p == q]
    return common[-1] if common else ""


def fusion_section(plan: KernelPlan, epilogue_plan: KernelPlan | None,
                   unfused: Mapping[str, KernelCounts]) -> Fusion:
    """The report's ``fusion`` section: kernel counts and bytes moved, unfused and fused,
    in total and per module (each module with its submodules)."""
    fused = _per_module((kernel.module, kernel.bytes_fused) for kernel in plan.kernels)
    by_module = dict(unfused)
    for path, (kernels, moved) in fused.items():
        by_module[path] = dataclasses.replace(by_module.get(path, KernelCounts()),
                                              kernels_fused=kernels, bytes_fused=moved)
    return Fusion(
        kernels_unfused=plan.kernels_unfused, kernels_fused=len(plan.kernels),
        bytes_unfused=plan.bytes_unfused, bytes_fused=plan.bytes_fused,
        policy="inductor-default: GEMMs and convolutions as library calls, connected "
               "pointwise/reduction ops in one kernel",
        kernels_fused_with_epilogues=(len(epilogue_plan.kernels)
                                      if epilogue_plan is not None else None),
        by_module=dict(sorted(by_module.items())),
    )


def _by_module_unfused(plan: KernelPlan, fg: FusionGraph, costs: Mapping[int, NodeReport]
                       ) -> dict[str, KernelCounts]:
    """Kernels and bytes per module (with its submodules) when every node is its own kernel."""
    def bytes_of(node_id: int) -> int:
        cost = costs.get(node_id)
        return cost.bytes_read + cost.bytes_written if cost is not None else 0

    sums = _per_module((fg.node(n).module, bytes_of(n))
                       for n in sorted(n for k in plan.kernels for n in k.nodes))
    return {path: KernelCounts(kernels_unfused=kernels, bytes_unfused=moved)
            for path, (kernels, moved) in sums.items()}


def _per_module(items: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    """[count, bytes] per module path of (module, bytes) items, each counted in its module
    and every module above it."""
    sums: dict[str, list[int]] = {}
    for module, moved in items:
        for path in ancestors(module):
            entry = sums.setdefault(path, [0, 0])
            entry[0] += 1
            entry[1] += moved
    return sums


# --- one entry point -------------------------------------------------------------------------

@dataclass(frozen=True)
class FusionAnalysis:
    findings: tuple[Finding, ...]
    plan: KernelPlan
    section: Fusion

    def sections(self) -> tuple[Findings, Fusion]:
        return Findings(self.findings), self.section


def effective_kinds(report: Report, kinds: Mapping[int, OpKind]) -> dict[int, OpKind]:
    """The rules' kinds, with every node that moves nothing and computes nothing made free
    (a reshape that turned out to be a view, an eval-mode dropout)."""
    result: dict[int, OpKind] = {}
    for node in report.nodes:
        idle = node.status == "free" or (
            node.status == "costed" and node.flops == 0 and node.bytes_read == 0
            and node.bytes_written == 0)
        result[node.id] = OpKind.FREE if idle else kinds.get(node.id, OpKind.EXTERN)
    return result


def analyze_fusion(report: Report, graph: Graph, kinds: Mapping[int, OpKind],
                   rules: Sequence[FusionRule], rule_of: Callable[[Node], Any] = lambda _: None,
                   bandwidth_bytes_per_s: float | None = None,
                   compute_s: Callable[[int, int], float] | None = None) -> FusionAnalysis:
    """Findings and the fused-graph model of one analysed graph (`run_rules`)."""
    fg = FusionGraph(graph, effective_kinds(report, kinds), rule_of)
    costs = {n.id: n for n in report.nodes}
    plan = plan_kernels(fg, costs)
    epilogues = plan_kernels(fg, costs, Policy(gemm_epilogues=True))
    section = fusion_section(plan, epilogues, _by_module_unfused(plan, fg, costs))
    findings = tuple(run_rules(fg, rules, bandwidth_bytes_per_s, compute_s))
    return FusionAnalysis(findings, plan, section)


def fused_kernels(report: Report, graph: Graph, kinds: Mapping[int, OpKind],
                  rule_of: Callable[[Node], Any] = lambda _: None) -> Report:
    """`report` as the kernels the default fusion plan runs (`fused_report`), without the
    findings: what an engine's compiled graph launches."""
    fg = FusionGraph(graph, effective_kinds(report, kinds), rule_of)
    return fused_report(report, plan_kernels(fg, {n.id: n for n in report.nodes}))


def fused_report(report: Report, plan: KernelPlan) -> Report:
    """The report as the fused kernels: one costed node per kernel (id of its first member,
    FLOPs summed, bytes after fusion), for the roofline's fused view (``--fused``)."""
    by_id = {n.id: n for n in report.nodes}
    nodes = []
    for kernel in plan.kernels:
        first = by_id[kernel.nodes[0]]
        targets = dict.fromkeys(by_id[i].target for i in kernel.nodes)
        target = first.target if len(targets) == 1 else "fused(" + "+".join(
            t.split(".")[1] if t.count(".") >= 1 else t for t in targets) + ")"
        nodes.append(dataclasses.replace(
            first, target=target, status="costed", module=kernel.module, flops=kernel.flops,
            bytes_read=kernel.bytes_fused, bytes_written=0))
    return dataclasses.replace(report, nodes=tuple(nodes))
