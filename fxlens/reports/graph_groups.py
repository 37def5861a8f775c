"""What each op of a report becomes in the drawn graph: a node of its own, a part of one run
of alike repeated blocks, a part of the folded input plumbing, or nothing. `plan_graph` decides;
`fxlens.reports.dot` draws the plan and `fxlens.reports.html` links the page's SVG back to it.

- **Runs.** The repeated blocks (`collapsed_blocks`: `repeated_blocks`, children ``0…N-1`` of
  one parent, one type or layers of several) are cut where consecutive blocks stop being
  alike, by the rule the module tables use (`fxlens.reports.views.tree`: consecutive numbered
  siblings of one kind with equal figures), on the figures params, ops, FLOPs, bytes read and
  bytes written. A run
  is one node, ``model.layers.0–31 ×32``, whose id is ``b<index of its first block>``; blocks
  that differ (sliding and full attention layers at a length past the window, a layer with
  other ops) are separate runs, side by side. The tables group on params and FLOPs only, so a
  run here never spans two of their groups.
- **Hidden.** An op that makes no tensor and costs nothing (status ``free`` and no output:
  ``_assert_tensor_metadata``, ``_assert_scalar``, range constraints) is drawn nowhere; an
  edge through one is bridged to its inputs. Known without a list of op names.
- **Plumbing.** Before the first op of the first repeated block, the ops that only prepare
  inputs (positions, masks, rotary cos/sin, dtype casts) fold into one node ``p0``,
  ``inputs & plumbing: N ops``. An op folds when all of these hold:
  it is costed or free (an unsupported op stays in sight);
  its FLOPs and its bytes moved are each at most `FOLD_SHARE` (0.1 %) of the report's totals;
  it does at most `FOLD_FLOPS_PER_ELEMENT` FLOPs per element it writes, i.e. elementwise
  work, not a contraction (a matmul, conv or attention does 2·K per element, K its reduction
  length);
  it depends on no weight: neither it nor any op it reads from, back to the graph's inputs,
  runs in a module holding parameters of its own (the embeddings, and the residual stream
  they start, stay drawn; rotary tables from a buffer and masks from the inputs fold);
  it does not start the hidden states: through ops that read no weight, its value enters no
  block or several (a mask, a rotary table), not the first block alone (T5's embedding, whose
  weight is tied to another module's, shows no parameters of its own yet stays drawn).
  Fewer than `MIN_FOLD` such ops are left as they are. NB: the shares make the fold a matter
  of scale: in a toy model (a handful of tokens) a rotary table is a share of the work worth
  seeing, and is drawn.

``expand=True`` keeps every op but the hidden ones as a node of its own.

NB: a run's figures are those of its first block times its length, exact because its blocks'
figures are equal; the colour of a run or of the fold sums what it stands for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fxlens.analyzer.core.graph import ancestors, repeated_blocks
from fxlens.analyzer.core.report import ModuleReport, NodeReport, Report
from fxlens.reports.views.tree import Node as TreeNode
from fxlens.reports.views.tree import alike_runs  # the tables' rule, not a copy

FOLD_SHARE = 0.001
FOLD_FLOPS_PER_ELEMENT = 16
MIN_FOLD = 2
FOLD_ID = "p0"
FOLD_TITLE = "inputs & plumbing"
FOLD_WHY = ("ops before the first repeated block that only build its inputs (positions, "
            f"masks, rotary tables, casts): each at most {FOLD_SHARE:.1%} of the FLOPs and of "
            "the bytes moved, elementwise, reading no weight, and feeding several blocks or "
            "none, not the first alone")


def collapsed_blocks(report: Report) -> tuple[str, ...]:
    """Module paths of the repeated blocks (in the report's module order); `block_node_id`
    indexes into this."""
    return repeated_blocks({m.path: m.type for m in report.modules})


def block_node_id(index: int) -> str:
    """The DOT/SVG id of the node of the run whose first block is `collapsed_blocks()[index]`."""
    return f"b{index}"


def node_dot_id(node_id: int) -> str:
    return f"n{node_id}"


def short_type(qualified: str) -> str:
    """A module type as labels show it: the class name alone (``LlamaDecoderLayer``)."""
    return qualified.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class BlockRun:
    """Consecutive repeated blocks alike in type and figures, drawn as one node."""

    paths: tuple[str, ...]
    first: int                 # index of paths[0] in `collapsed_blocks`
    module: ModuleReport       # the first block's figures; every block has the same

    @property
    def count(self) -> int:
        return len(self.paths)

    @property
    def item(self) -> str:
        return block_node_id(self.first)

    @property
    def parent(self) -> str:
        return self.paths[0].rpartition(".")[0]

    @property
    def label(self) -> str:
        """``model.layers.0–31 ×32``; a lone block is its path."""
        if self.count == 1:
            return self.paths[0]
        return f"{self.paths[0]}–{self.paths[-1].rpartition('.')[2]} ×{self.count}"


def block_runs(report: Report) -> tuple[BlockRun, ...]:
    """The repeated blocks cut into runs of alike blocks, in order."""
    blocks = collapsed_blocks(report)
    modules = {m.path: m for m in report.modules}
    index = {path: i for i, path in enumerate(blocks)}
    by_parent: dict[str, list[TreeNode]] = {}
    for path in blocks:
        m = modules[path]
        figures = (m.params, m.nodes, m.flops, m.bytes_read, m.bytes_written)
        by_parent.setdefault(path.rpartition(".")[0], []).append(TreeNode(path, m.type, figures))
    return tuple(BlockRun(tuple(n.path for n in run), index[run[0].path], modules[run[0].path])
                 for siblings in by_parent.values() for run in alike_runs(siblings))


def hidden_nodes(report: Report) -> frozenset[int]:
    """Ops drawn nowhere: free, with no output (asserts on metadata and the like)."""
    return frozenset(n.id for n in report.nodes if n.status == "free"
                     and not any(o.get("shape") is not None for o in n.outputs if o))


@dataclass(frozen=True)
class GraphPlan:
    """Which drawn item each op becomes and which module's cluster holds each item."""

    item_of: Mapping[int, str]                     # node id → item id; hidden nodes absent
    items: tuple[str, ...]                         # in order of their first op
    module_of: Mapping[str, str]                   # item id → module path
    members: Mapping[str, tuple[NodeReport, ...]]  # the ops of a run's or the fold's item
    runs: Mapping[str, BlockRun]                   # run item id → run
    block_of: Mapping[int, str]                    # node id → its repeated block's path
    hidden: frozenset[int]

    @property
    def folded(self) -> tuple[NodeReport, ...]:
        return self.members.get(FOLD_ID, ())


def plan_graph(report: Report, expand: bool = False) -> GraphPlan:
    """The drawing of `report`: runs and plumbing folded unless `expand`."""
    hidden = hidden_nodes(report)
    runs = () if expand else block_runs(report)
    run_of = {path: run for run in runs for path in run.paths}
    block_of = {n.id: block for n in report.nodes
                if (block := _block(n.module, run_of)) is not None}
    folded = set() if expand else set(plumbing(report, block_of, hidden))
    fold_module = _common_module([n.module for n in report.nodes if n.id in folded])
    item_of: dict[int, str] = {}
    module_of: dict[str, str] = {}
    members: dict[str, list[NodeReport]] = {}
    for node in report.nodes:
        if node.id in hidden:
            continue
        if node.id in block_of:
            run = run_of[block_of[node.id]]
            item, module = run.item, run.parent
        elif node.id in folded:
            item, module = FOLD_ID, fold_module
        else:
            item, module = node_dot_id(node.id), node.module
        if item[0] != "n":
            members.setdefault(item, []).append(node)
        item_of[node.id] = item
        module_of.setdefault(item, module)
    return GraphPlan(item_of, tuple(module_of), module_of,
                     {k: tuple(v) for k, v in members.items()},
                     {run.item: run for run in runs}, block_of, hidden)


def plumbing(report: Report, block_of: Mapping[int, str], hidden: frozenset[int]
             ) -> tuple[int, ...]:
    """Ids of the ops folded as input plumbing (the criterion in the module docstring)."""
    first = next((i for i, n in enumerate(report.nodes) if n.id in block_of), None)
    if first is None:
        return ()
    totals = report.totals
    max_flops = FOLD_SHARE * totals.flops
    max_bytes = FOLD_SHARE * (totals.bytes_read + totals.bytes_written)
    own = own_params(report.modules)
    weighted: set[int] = set()          # ops that read a weight, directly or through others
    for n in report.nodes[:first]:
        if own.get(n.module, 0) or any(i in weighted for i in n.inputs):
            weighted.add(n.id)
    stream = _hidden_states(report, first, block_of, weighted)
    chosen = tuple(n.id for n in report.nodes[:first]
                   if n.id not in hidden and n.id not in weighted and n.id not in stream
                   and n.status in ("costed", "free")
                   and n.flops <= max_flops and n.bytes_read + n.bytes_written <= max_bytes
                   and n.flops <= FOLD_FLOPS_PER_ELEMENT * max(_elements(n), 1))
    return chosen if len(chosen) >= MIN_FOLD else ()


def _hidden_states(report: Report, first: int, block_of: Mapping[int, str],
                   weighted: set[int]) -> set[int]:
    """Ops among the first `first` whose value enters exactly one block through ops that
    read no weight: the start of the hidden states, not inputs shared by the blocks."""
    consumers: dict[int, list[int]] = {}
    for n in report.nodes:
        for i in n.inputs:
            consumers.setdefault(i, []).append(n.id)
    reach: dict[int, set[str]] = {}
    for n in reversed(report.nodes[:first]):
        blocks: set[str] = set()
        for c in consumers.get(n.id, ()):
            if c in block_of:
                blocks.add(block_of[c])
            elif c in reach and c not in weighted:
                blocks |= reach[c]
        reach[n.id] = blocks
    return {i for i, blocks in reach.items() if len(blocks) == 1}


def own_params(modules: Sequence[ModuleReport]) -> dict[str, int]:
    """Parameters a module holds itself, not through its submodules."""
    own = {m.path: m.params for m in modules}
    for m in modules:
        parent = m.path.rpartition(".")[0]
        if m.path and parent in own:
            own[parent] -= m.params
    return own


def _elements(node: NodeReport) -> int:
    return sum(math.prod(o["shape"]) for o in node.outputs
               if o and isinstance(o.get("shape"), (list, tuple)))


def _block(module: str, run_of: Mapping[str, BlockRun]) -> str | None:
    if not run_of:
        return None
    return next((path for path in ancestors(module) if path in run_of), None)


def _common_module(paths: Sequence[str]) -> str:
    """The deepest module holding every one of `paths` ("" for none)."""
    if not paths:
        return ""
    common = ancestors(paths[0])
    for path in paths[1:]:
        chain = set(ancestors(path))
        common = [p for p in common if p in chain]
    return common[-1]


def clusters(plan: GraphPlan) -> tuple[dict[str, str], dict[str, list[str]]]:
    """(item → the module cluster holding it, cluster → its child clusters), the root "":
    an item sits in the deepest module around it that holds at least two items, so a module
    holding a single item gets no cluster of its own. Clusters in first-appearance order."""
    counts: dict[str, int] = {}
    for item in plan.items:
        for path in ancestors(plan.module_of[item])[1:]:
            counts[path] = counts.get(path, 0) + 1
    cluster_of: dict[str, str] = {}
    for item in plan.items:
        path = plan.module_of[item]
        while path and counts.get(path, 0) < 2:
            path = path.rpartition(".")[0]
        cluster_of[item] = path
    used = set(cluster_of.values())
    children: dict[str, list[str]] = {}
    for item in plan.items:
        chain = ["", *(p for p in ancestors(cluster_of[item])[1:] if p in used)]
        for parent, child in zip(chain, chain[1:], strict=False):
            if child not in children.setdefault(parent, []):
                children[parent].append(child)
    return cluster_of, children


def page_graph(plan: GraphPlan) -> dict[str, object]:
    """What the HTML page's script needs to link the SVG's items back to the report: each run
    (its item, first block index, length, label, type), the hidden ops and the fold's."""
    runs = [{"item": run.item, "first": run.first, "count": run.count, "label": run.label,
             "type": run.module.type} for run in plan.runs.values()]
    return {"runs": runs, "hidden": sorted(plan.hidden),
            "folded": {"item": FOLD_ID, "nodes": [n.id for n in plan.folded], "why": FOLD_WHY}}
