"""Selective activation checkpointing under a memory budget (issue 32).

- `blocks`: each repeated block's forward as ``torch.utils.checkpoint`` sees it: where its
  recompute starts and stops in the backward, what it keeps, which of its ops a policy may save.
- `model`: the step under a policy, as a graph: recompute nodes inserted where torch runs
  them, saved tensors read from the recompute; the peak is the liveness of that graph.
- `solve`: the 0/1 knapsack per block (save an op: its output bytes; recompute it: its time),
  solved exactly as a Pareto frontier, with a greedy fallback and its gap to the LP bound.
- `choose`: budget → policy, the curve over budgets, the section.
- `code`: the policy as Python a user pastes.
"""
