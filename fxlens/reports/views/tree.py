"""Module trees with repeated structure shown once: a run of identical sibling blocks
(``layers.0`` … ``layers.31``, same type and figures) is one row ``0–31 ×32`` with the run's
totals, and the rows under it are those of one block, labelled ``×32`` and multiplied, so every
row still counts what it says. Iterative, children in the given (execution) order."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Node:
    path: str
    kind: str                        # module type: a run needs one kind
    figures: tuple[float, ...]       # additive figures (params, FLOPs, bytes, seconds)


@dataclass(frozen=True)
class Row:
    label: str                       # indented, with the run's range and multiplier
    kind: str
    figures: tuple[float, ...]       # multiplied by the run's size
    depth: int


def grouped_rows(nodes: Sequence[Node], depth: int) -> list[Row]:
    """Depth-first rows down to `depth` (the root is depth 0), runs grouped."""
    children: dict[str, list[Node]] = defaultdict(list)
    root = None
    for node in nodes:
        if node.path == "":
            root = node
        elif node.path.count(".") + 1 <= depth:
            children[node.path.rpartition(".")[0]].append(node)
    if root is None:
        return []
    rows: list[Row] = []
    stack: list[tuple[Node, int, str, int]] = [(root, 1, "", 0)]   # node, multiplier, label
    while stack:
        node, times, label, level = stack.pop()
        name = label or (node.path.rsplit(".", 1)[-1] if node.path else "(root)")
        suffix = f" ×{times}" if times > 1 and not label else ""
        rows.append(Row("  " * level + name + suffix, node.kind,
                        tuple(f * times for f in node.figures), level))
        runs = alike_runs(children.get(node.path, []))
        for run in reversed(runs):
            first, count = run[0], len(run)
            run_label = (f"{first.path.rsplit('.', 1)[-1]}–{run[-1].path.rsplit('.', 1)[-1]} "
                         f"×{count * times}" if count > 1 else "")
            stack.append((first, times * count, run_label, level + 1))
    return rows


def _name(node: Node) -> str:
    return node.path.rsplit(".", 1)[-1]


def _in_order(siblings: list[Node]) -> list[Node]:
    """Numbered siblings in numeric order (``2`` before ``10``) where the first one was."""
    numbered = [i for i, n in enumerate(siblings) if _name(n).isdigit()]
    if not numbered:
        return siblings
    return sorted(siblings, key=lambda n: (numbered[0], int(_name(n))) if _name(n).isdigit()
                  else (siblings.index(n), 0))


def alike_runs(siblings: list[Node]) -> list[list[Node]]:
    """Consecutive numbered siblings with one kind and equal figures, as runs."""
    runs: list[list[Node]] = []
    for node in _in_order(siblings):
        last = runs[-1][-1] if runs else None
        if (last is not None and node.path.rsplit(".", 1)[-1].isdigit()
                and last.path.rsplit(".", 1)[-1].isdigit()
                and node.kind == last.kind and node.figures == last.figures):
            runs[-1].append(node)
        else:
            runs.append([node])
    return runs
