"""The host's side of a layout: a training framework launches every kernel of a micro-batch
from Python, and a GPU cannot run a kernel before it is launched.

Each GPU of a stage launches the same kernels whatever the layout (tensor, context and expert
parallelism shrink the kernels, not their number): a unit's kernels as captured
(`Unit.launches`, forward and backward; a recomputed forward launches again), at the
device's `framework_launch_s` each — 46.6 µs per kernel on an x86 host, measured on
DeepSeek-V3's published training trace (`fxlens.rules.hardware`). The host time of one
micro-batch is a floor under its GPU time: a micro-batch takes the longer of the two
(`fxlens.analyzer.plan.estimate`). Fine-grained MoE layers meet it first: Qwen3-30B-A3B's
layer launches 210 kernels forward and backward (9.8 ms of host) for 2–6 ms of GPU work per
4,096-token micro-batch.

CUDA graphs (``graphs``: `fxlens.analyzer.plan.strategy`) replay kernels without the host:
``graphs`` (the whole step) leaves no floor, ``graphs=layers`` only the blocks' outside
(embedding, head, loss), ``graphs=attn+moe_router`` takes the kernels of those modules
(`fxlens.analyzer.plan.recompute`'s kinds) out of it.
NB: the count is the captured program's, fused kernels (``--fused``) or not: a framework
launches about one kernel per op of the model as written (DeepSeek-V3's MoE layer: 228
launched in its trace, 273 captured here); its per-kernel cost is one framework's, on a host
it names; the host's run-ahead past a micro-batch is not modelled (its pipeline receives and
a dropless dispatcher's token counts wait for the GPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fxlens.analyzer.plan.recompute import recomputed_parts
from fxlens.analyzer.plan.strategy import FULL_GRAPHS, LAYER_GRAPHS, Strategy
from fxlens.analyzer.plan.unit_share import is_block

if TYPE_CHECKING:
    from fxlens.analyzer.plan.structure import Unit


def launches(s: Strategy, units: Sequence[Unit]) -> int:
    """The kernels one GPU of a stage launches from the host per micro-batch: forward,
    backward and any recomputed forward, less those CUDA graphs replay."""
    if s.graphs == (FULL_GRAPHS,):
        return 0
    return sum(_launches(s, u) for u in units)


def _launches(s: Strategy, u: Unit) -> int:
    forward, backward = u.launches
    if not is_block(u):
        return forward + backward
    if LAYER_GRAPHS in s.graphs:
        return 0
    graphed = recomputed_parts(u, s.graphs) if s.graphs else ()
    replayed = {p.name for p in graphed}
    forward -= sum(p.launches[0] for p in graphed)
    backward -= sum(p.launches[1] for p in graphed)
    if s.checkpoint:
        again = forward
    elif s.recompute:
        again = sum(p.launches[0] for p in recomputed_parts(u, s.recompute)
                    if p.name not in replayed)
    else:
        again = 0
    return forward + backward + again


def host_s(s: Strategy, units: Sequence[Unit], launch_s: float) -> float:
    """One micro-batch's host seconds on one GPU of the stage holding `units`."""
    return launches(s, units) * launch_s
