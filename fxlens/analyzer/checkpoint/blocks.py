"""Each repeated block of a training step as ``torch.utils.checkpoint`` (non-reentrant, with a
selective-checkpoint context) would run it: `block_forwards(step, storages, free, cost)`.

What torch does (torch/utils/checkpoint.py, 2.13), and what is read off the joint graph for it:

- Forward: every tensor autograd packs inside the block is replaced by a holder; the block's
  inputs are kept by the checkpoint frame (`BlockForward.inputs`); an op the policy marks
  MUST_SAVE has its outputs cached (``_CachingTorchDispatchMode``) until the recompute reaches
  it. Nothing else of the block outlives its forward use.
- Backward: the first unpack of one of the block's holders (`BlockForward.recompute_at`: the
  first backward node of the block reading a saved tensor) re-runs the block's forward; cached
  ops return their cached outputs instead of running (``_CachedTorchDispatchMode``), every
  other op runs again. Each re-packed tensor is kept until its unpack, and the frame (with the
  inputs) until the block's last unpack (`BlockForward.frame_end`).
- Early stop: the recompute ends at the last pack, so the ops after it never run again
  (`BlockForward.recomputed` counts those that do). A tensor is packed by the op that saves
  it: an input before the op runs (the block's last matmul saving its input: the matmul itself
  is not recomputed), an output after. The op is found by module: the backward node that reads
  a saved tensor belongs to the module of the forward op that saved it, and that op reads or
  makes the tensor (the last non-view op of that module that does).

Items (`Item`): the ops a policy may save — ops the recompute runs, not views (free ops alias
their input: nothing to keep) and not ops whose output a later in-place op of the block
writes (SAC refuses a mutated cached tensor). Saving one keeps its fresh output storages from
the forward to the recompute (`Item.bytes`) and spares its recompute (`Item.cost`: roofline
seconds or FLOPs, the caller's choice). `Item.call` is which call of its op it is in the
block's forward, as the policy counts them.

Blocks with the same forward (ops and shapes) form a group: one policy, solved once, applies
to each (`signature`).

NB: the graph's forward is what the policy would see at dispatch, except ops the capture
decomposed because no cost rule knows them (the policy sees the op, the graph its parts).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fxlens.analyzer.capture.training import TrainingGraph
from fxlens.analyzer.core.graph import Graph, Node, NodeKind, TensorRef, packet, repeated_blocks
from fxlens.analyzer.memory.liveness import Storages


@dataclass(frozen=True)
class Item:
    """One op of a block's forward that a policy may save."""

    index: int          # position in the block's forward
    target: str
    call: int           # which call of `target` in the block's forward (0-based)
    bytes: int          # fresh output storages: what saving it keeps
    cost: float         # what recomputing it costs


@dataclass(frozen=True)
class BlockForward:
    path: str
    forward: tuple[int, ...]          # the block's forward node ids, in order
    recomputed: int                   # how many of them the recompute runs (early stop)
    recompute_at: int | None          # the backward node whose unpack starts the recompute
    frame_end: int | None             # the block's last unpacking backward node
    inputs: tuple[TensorRef, ...]     # what the block reads and did not make: the frame's
    items: tuple[Item, ...]
    calls: Mapping[str, int]          # calls of each op in the whole forward (stop or not)
    signature: tuple[object, ...]     # equal for blocks one policy fits

    @property
    def checkpointable(self) -> bool:
        return self.recompute_at is not None


def inside(module: str, block: str) -> bool:
    return module == block or module.startswith(block + ".")


def block_forwards(step: TrainingGraph, storages: Storages, free: Callable[[int], bool],
                   cost: Mapping[int, float], paths: Sequence[str] | None = None
                   ) -> list[BlockForward]:
    """Every repeated block of `step` (`repeated_blocks`), or the disjoint module `paths`
    given, as checkpointing runs it; `free` says which nodes are views, `cost` what
    recomputing a node costs."""
    graph = step.graph
    saved = set(step.saved)
    forward: dict[str, list[Node]] = defaultdict(list)
    backward: dict[str, list[Node]] = defaultdict(list)
    if paths is None:
        paths = repeated_blocks(graph.module_types)
    owner = owner_of(paths)
    for node in graph.nodes:
        block = owner(node.module) if node.kind is NodeKind.CALL else None
        if block is not None:
            (forward if node.phase == "forward" else backward)[block].append(node)
    return [_block(graph, path, forward[path], backward[path], saved, storages, free, cost)
            for path in paths if forward[path]]


# torch's containers that hold modules but run no forward of their own: their items count
CONTAINERS = frozenset({"torch.nn.modules.container.ModuleList",
                        "torch.nn.modules.container.ModuleDict"})


def children(module_types: Mapping[str, str], block: str) -> list[str]:
    """The outermost modules strictly inside `block` that can run a forward (`module_types`:
    path → qualified class name; a ``ModuleList`` runs none, so its items count)."""
    inner = sorted(p for p, kind in module_types.items()
                   if p != block and inside(p, block) and kind not in CONTAINERS)
    found: list[str] = []
    for path in inner:      # sorted: a module comes before those inside it
        if not any(inside(path, outer) for outer in found):
            found.append(path)
    return found


def owner_of(paths: Sequence[str]) -> Callable[[str], str | None]:
    """The block of `paths` a module path is in, if any (memoised)."""
    known: dict[str, str | None] = {}

    def owner(module: str) -> str | None:
        if module not in known:
            known[module] = next((p for p in paths if inside(module, p)), None)
        return known[module]

    return owner


def _block(graph: Graph, path: str, fwd: list[Node], bwd: list[Node], saved: set[TensorRef],
           st: Storages, free: Callable[[int], bool], cost: Mapping[int, float]
           ) -> BlockForward:
    unpacks = [(node, ref) for node in bwd for ref in node.input_refs() if ref in saved]
    ids = {node.id for node in fwd}
    inputs = tuple(dict.fromkeys(ref for node in fwd for ref in node.input_refs()
                                 if ref.node not in ids))
    signature = tuple((n.target, tuple(s.shape if s is not None else None for s in n.outputs))
                      for n in fwd)
    calls = dict(Counter(n.target for n in fwd))
    if not unpacks:
        return BlockForward(path, tuple(n.id for n in fwd), 0, None, None, inputs, (), calls,
                            (*signature, 0))
    stop = _stop(fwd, unpacks, st, free)
    recomputed = sum(1 for node in fwd if 2 * node.id < stop)
    items = _items(fwd[:recomputed], fwd, st, free, cost)
    return BlockForward(path, tuple(n.id for n in fwd), recomputed,
                        min(node.id for node, _ in unpacks),
                        max(node.id for node, _ in unpacks), inputs, items, calls,
                        (*signature, recomputed))


def _stop(fwd: list[Node], unpacks: list[tuple[Node, TensorRef]], st: Storages,
          free: Callable[[int], bool]) -> int:
    """Twice the position of the block's last pack: ``2·id − 1`` for an input an op saves
    (packed before it runs), ``2·id + 1`` for an output (after); the recompute runs the
    nodes with ``2·id`` below it."""
    readers: dict[TensorRef, set[str]] = defaultdict(set)
    for node, ref in unpacks:
        readers[ref].add(node.module)
    last = -1
    for ref, modules in readers.items():
        sid = st.of_ref.get(ref)
        makes = [n for n in fwd if ref.node == n.id and not free(n.id)]
        reads = [n for n in fwd if not free(n.id) and _reads(n, ref, sid, st)]
        packers = [n for n in (*makes, *reads) if n.module in modules] or [*makes, *reads]
        if not packers:
            continue
        packer = max(packers, key=lambda n: n.id)
        last = max(last, 2 * packer.id + (1 if packer in makes else -1))
    return last


def _reads(node: Node, ref: TensorRef, sid: int | None, st: Storages) -> bool:
    return any(r == ref or (sid is not None and st.of_ref.get(r) == sid)
               for r in node.input_refs())


def _items(run: list[Node], fwd: list[Node], st: Storages, free: Callable[[int], bool],
           cost: Mapping[int, float]) -> tuple[Item, ...]:
    mutated = {st.of_ref[TensorRef(n.id, i)] for n in fwd if packet(n.target).endswith("_")
               for i in range(len(n.outputs)) if TensorRef(n.id, i) in st.of_ref}
    calls: Counter[str] = Counter()
    position = {n.id: i for i, n in enumerate(fwd)}
    items = []
    for node in run:
        call = calls[node.target]
        calls[node.target] += 1
        if free(node.id):
            continue
        fresh = {st.of_ref[TensorRef(node.id, i)] for i in range(len(node.outputs))
                 if TensorRef(node.id, i) in st.of_ref}
        fresh = {sid for sid in fresh if st.origin[sid][0].id == node.id}
        if not fresh or fresh & mutated:
            continue
        items.append(Item(position[node.id], node.target, call,
                          sum(st.size[sid] for sid in fresh), cost.get(node.id, 0.0)))
    return tuple(items)
