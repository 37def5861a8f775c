"""Eager Python lifetimes: how long an eager run keeps a tensor past its last use by an op.

In a graph executor a tensor can be freed right after its last reader. Eagerly, Python holds
references: the arguments of a call, and names bound in a ``forward``. Two rules follow from
Python's semantics alone and can be read off the captured graph (module paths and source
lines); each only ever *extends* a lifetime to a point the eager run provably reaches with
the tensor still referenced:

A. Call arguments. A tensor created before an invocation of a module and read inside it was
   passed in (argument, container, attribute): the caller holds it until the call returns.
   An invocation is a maximal run of call nodes under one module path; ``ModuleList`` and
   ``ModuleDict`` paths are never called and so are skipped.
B. Named values. A tensor produced by one statement of a ``forward`` and read by a later
   statement of the same invocation was bound to a name in between: it stays referenced until
   that statement completes. A node's frame is its module, or its nearest ancestor when its
   module is a torch class (``nn.Linear`` runs no user code: its ops belong to the caller's
   line); a statement is a run of that frame's nodes with one source line.

NB: both are lower bounds. A name that outlives its last use until its function returns
(``q, k, v`` in an attention ``forward``, ``inputs_embeds`` in a transformers model) is
not seen: that needs the Python source's name bindings. Two back-to-back calls of one
module with no op between them merge into one invocation (rule A then holds its arguments
through both); a module used only as a namespace (never called) is taken as called.
Nodes without a source line are one statement each; a statement written over several lines
is one statement per line, which can hold a temporary passed between its lines until the
later line's ops finish. Only forward-phase readers are
extended: backward lifetimes come from what autograd saves, which the graph states.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fxlens.analyzer.core.graph import Graph, NodeKind

UNCALLED_CONTAINERS = frozenset({
    "torch.nn.modules.container.ModuleList", "torch.nn.modules.container.ModuleDict",
})


@dataclass
class EagerScopes:
    """Module invocations and statements by node position, to answer `hold_until`."""

    graph: Graph
    chain: dict[int, list[int]] = field(default_factory=dict)   # position -> invocation ids
    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    statement: dict[int, tuple[int, int]] = field(default_factory=dict)  # (frame inv, stmt)
    statement_end: list[int] = field(default_factory=list)
    _scopes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    _frames: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._invocations()
        self._statements()

    def scopes(self, path: str) -> tuple[str, ...]:
        """The called module paths enclosing `path`, root first."""
        if path not in self._scopes:
            parts = path.split(".") if path else []
            paths = [""] + [".".join(parts[: i + 1]) for i in range(len(parts))]
            types = self.graph.module_types
            self._scopes[path] = tuple(p for p in paths if types.get(p) not in UNCALLED_CONTAINERS)
        return self._scopes[path]

    def frame_depth(self, path: str) -> int:
        """Index in `scopes(path)` of the innermost module whose class is not torch's."""
        if path not in self._frames:
            scopes = self.scopes(path)
            self._frames[path] = next(
                (d for d in range(len(scopes) - 1, 0, -1)
                 if not self.graph.module_types.get(scopes[d], "").startswith("torch.")), 0)
        return self._frames[path]

    def _invocations(self) -> None:
        open_: list[tuple[str, int]] = []
        previous = -1
        for position, node in enumerate(self.graph.nodes):
            if node.kind is not NodeKind.CALL:
                continue
            scopes = self.scopes(node.module)
            keep = 0
            while keep < min(len(open_), len(scopes)) and open_[keep][0] == scopes[keep]:
                keep += 1
            for _, closed in open_[keep:]:
                self.end[closed] = previous
            del open_[keep:]
            for path in scopes[keep:]:
                self.start.append(position)
                self.end.append(position)
                open_.append((path, len(self.start) - 1))
            self.chain[position] = [i for _, i in open_]
            previous = position
        for _, closed in open_:
            self.end[closed] = previous

    def _statements(self) -> None:
        current: dict[int, tuple[str, int]] = {}   # frame invocation -> (source, statement)
        for position, node in enumerate(self.graph.nodes):
            if node.kind is not NodeKind.CALL:
                continue
            frame = self.chain[position][self.frame_depth(node.module)]
            seen = current.get(frame)
            if seen is None or not node.source or seen[0] != node.source:
                self.statement_end.append(position)
                seen = (node.source, len(self.statement_end) - 1)
                current[frame] = seen
            self.statement_end[seen[1]] = position
            self.statement[position] = (frame, seen[1])

    def hold_until(self, reader: int, producer: int) -> int:
        """Position until which the eager run holds a tensor made at `producer` and read at
        `reader` (both node positions); at least `reader`."""
        until = reader
        for invocation in self.chain.get(reader, ()):
            if self.start[invocation] > producer:
                until = self.end[invocation]
                break
        made, read = self.statement.get(producer), self.statement.get(reader)
        if made is not None and read is not None and made[0] == read[0] and made[1] != read[1]:
            until = max(until, self.statement_end[read[1]])
        return until
