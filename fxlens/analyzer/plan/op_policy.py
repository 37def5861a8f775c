"""Op-level selective activation checkpointing (``ckpt=ops``): what each block keeps and
recomputes under the policy torchtitan wraps its blocks in (``[activation_checkpoint] mode =
"selective"``, ``selective_ac_option = "op"``, the default of its Llama 3 8B recipe),
PyTorch's ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` with:

- must-save: the outputs of the block's 1st, 3rd, 5th … ``aten.mm`` (its policy counts the
  matmuls of one block's forward and recomputes every second one), and of every other
  compute-intensive op (``addmm``, ``bmm``, ``_scaled_mm``, the attention kernel's output
  and log-sum-exp), ``topk``, ``max`` (fp8 scales) and the collectives (reduce-scatters;
  a MoE layer's dispatch and combine all-to-alls, whose rows stay as the planner routes them:
  `fxlens.analyzer.plan.stage_memory`) — `fxlens.rules.parallel`;
- everything else is recomputed in the backward, from those and the block's input, which a
  checkpointed block keeps — MoE experts' grouped GEMMs included.

Eager PyTorch caches every must-save output; a compiled step (``--fused``: torch.compile's
partitioner honours the policy's tags) keeps only those the backward can use, so an output
read by nothing but residual additions (the down-projection's, whose addition needs no saved
input) is not kept. The recompute costs the forward of every op the policy does not save.

Known limitation: the graph is one GPU's, so tensor parallelism's reduce-scatters (saved by
the policy) are not in it; the row GEMMs' outputs stand for them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from fxlens.analyzer.core.graph import Graph, Node
from fxlens.analyzer.plan.serial import SerialSteps
from fxlens.analyzer.plan.types import ParallelKnowledge
from fxlens.analyzer.plan.workload import ExpertGemm, ExpertWork, ModulePart


def must_save(graph: Graph, forward: Sequence[int], knowledge: ParallelKnowledge
              ) -> list[int]:
    """The forward nodes (ids, in order) whose outputs the policy saves."""
    saved, matmuls = [], 0
    for node_id in forward:
        node = graph.nodes[node_id]
        if node.packet in knowledge.alternate_saved_ops:
            matmuls += 1
            if matmuls % 2:
                saved.append(node_id)
        elif node.packet in knowledge.saved_ops:
            saved.append(node_id)
    return saved


def op_policy_part(graph: Graph, forward: Sequence[int], split_nodes: Collection[int],
                   times: Mapping[int, float], knowledge: ParallelKnowledge, compiled: bool,
                   expert_gemms: tuple[ExpertGemm, ...], expert_work: ExpertWork,
                   serial_part: Callable[[list[int]], tuple[SerialSteps, ...]] | None = None
                   ) -> ModulePart:
    """The policy on one block: saved bytes are what it keeps (on split features, replicated)
    besides the block's input, forward seconds what it recomputes, the block's expert GEMMs
    and expert-sized work among it, the serial steps of what it recomputes (`forward`: the
    block's forward nodes in execution order; `compiled`: keep only outputs the backward can
    use)."""
    saved = must_save(graph, forward, knowledge)
    kept = saved
    if compiled:
        readers = _readers(graph, forward)
        kept = [n for n in saved if not _only_residual(n, readers, knowledge)]
    split = whole = 0
    for node_id in kept:
        size = sum(spec.nbytes for spec in graph.nodes[node_id].outputs if spec is not None)
        if node_id in split_nodes:
            split += size
        else:
            whole += size
    saved_set = set(saved)
    redone = [n for n in forward if n not in saved_set]
    return ModulePart(
        name="", saved_split_bytes=split, saved_whole_bytes=whole,
        forward_split_s=sum(times.get(n, 0.0) for n in redone if n in split_nodes),
        forward_whole_s=sum(times.get(n, 0.0) for n in redone if n not in split_nodes),
        expert_gemms=expert_gemms, expert_work=expert_work,
        serials=serial_part(redone) if serial_part else ())


def _readers(graph: Graph, forward: Iterable[int]) -> dict[int, list[Node]]:
    """The forward nodes that read each node's outputs, keyed by the node they read."""
    found: defaultdict[int, list[Node]] = defaultdict(list)
    for node_id in forward:
        node = graph.nodes[node_id]
        for source in {ref.node for ref in node.input_refs()}:
            found[source].append(node)
    return found


def _only_residual(node_id: int, readers: Mapping[int, list[Node]],
                   knowledge: ParallelKnowledge) -> bool:
    """Whether everything that reads `node_id`'s output in the forward, through views, is a
    residual addition (whose backward reads no input)."""
    ends: list[Node] = []
    pending = [node_id]
    while pending:
        for reader in readers.get(pending.pop(), ()):
            if reader.packet in knowledge.weight_path_ops:     # views and copies of it
                pending.append(reader.id)
            else:
                ends.append(reader)
    return bool(ends) and all(n.packet in knowledge.residual_ops for n in ends)
