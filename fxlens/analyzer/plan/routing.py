"""Where one token's experts live: how many of a MoE layer's expert holders (the GPUs of an
expert-parallel group, or the nodes it spans) receive its rows, as DeepEP sends them — once
per holder, however many of its experts a holder has (`transfers.expert_parallel`).

Experts are numbered as the checkpoint numbers them and laid out in order, holder h keeping
``[h·E/n, (h+1)·E/n)`` of a layer's E (Megatron-core's and Automodel's expert parallelism).
A token's k experts are drawn by the run's router:

- ``balanced`` (the default): k distinct experts drawn uniformly, as a router trained to
  balance its load spreads them and as Megatron-core's ``moe_router_force_load_balancing``
  draws them (random logits into the model's own top-k); with group-limited routing (the
  model's config: DeepSeek-V3's ``n_group`` = 8 groups of experts, ``topk_group`` = 4 of them
  per token — "node-limited routing" in its report) first that many groups uniformly, then
  the k experts among theirs. A holder is reached with probability
  ``1 − C(P − m, k)/C(P, k)`` when m of its experts are among the P eligible ones;
  `distinct_holders` sums that over holders and over the ways the groups fall.
- ``blocks``: token i's experts are the k consecutive experts from ``i·k mod E`` (NeMo
  Automodel's ``fake_balanced_gate``, which its performance runs use): every expert gets the
  same rows, and a token's rows reach the one or two holders of its block.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import cache
from math import comb, gcd

ROUTINGS = ("balanced", "blocks")


@dataclass(frozen=True)
class ExpertRouting:
    """A MoE layer's experts and the router's group limit (1 and 1: none)."""

    experts: int                # per MoE layer
    groups: int = 1             # experts split in this many equal groups …
    groups_per_token: int = 1   # … of which a token's experts come from this many

    @property
    def limited(self) -> bool:
        return (0 < self.groups_per_token < self.groups
                and self.experts > 0 and self.experts % self.groups == 0)


def routing_groups(config: object) -> tuple[int, int]:
    """(groups, groups per token) of a model's group-limited router from its configuration
    (`transformers`' DeepSeek-V2/V3 names: ``n_group``, ``topk_group``; DeepSeek-V2's
    ``topk_method = "greedy"`` ignores them); (1, 1) without."""
    groups, per_token = getattr(config, "n_group", None), getattr(config, "topk_group", None)
    if getattr(config, "topk_method", None) == "greedy":
        return 1, 1
    if isinstance(groups, int) and isinstance(per_token, int) and 1 <= per_token < groups:
        return groups, per_token
    return 1, 1


@cache
def distinct_holders(routing: ExpertRouting, chosen: float, holders: int,
                     pattern: str = "balanced") -> float:
    """Expected number of the `holders` (each keeping an equal run of the experts) that hold
    at least one of a token's `chosen` experts under `pattern` (`ROUTINGS`). Remembered: a
    plan search asks it for every stage of every layout."""
    k, experts = round(chosen), routing.experts
    if holders <= 1 or k < 1 or experts < holders:
        return 1.0
    bounds = tuple(h * experts // holders for h in range(holders + 1))
    if pattern == "blocks":
        return _block_holders(experts, min(k, experts), bounds)
    groups, per_token = ((routing.groups, routing.groups_per_token) if routing.limited
                         else (1, 1))
    return sum(_reached(experts, k, bounds[h], bounds[h + 1], groups, per_token)
               for h in range(holders))


def _reached(experts: int, k: int, lo: int, hi: int, groups: int, per_token: int) -> float:
    """Probability that a token's k uniformly drawn experts (from `per_token` of `groups`
    uniformly drawn groups) include one of experts [lo, hi)."""
    size = experts // groups
    overlaps = [max(0, min(hi, (g + 1) * size) - max(lo, g * size)) for g in range(groups)]
    ways: dict[tuple[int, int], int] = {(0, 0): 1}   # (groups taken, experts of ours) → ways
    for overlap in overlaps:
        nxt: dict[tuple[int, int], int] = {}
        for (taken, mine), count in ways.items():
            nxt[(taken, mine)] = nxt.get((taken, mine), 0) + count
            if taken < per_token:
                key = (taken + 1, mine + overlap)
                nxt[key] = nxt.get(key, 0) + count
        ways = nxt
    eligible = per_token * size
    draws = comb(eligible, k)
    if draws == 0:
        return 1.0
    total = comb(groups, per_token)
    return sum(count * (1 - comb(eligible - mine, k) / draws)
               for (taken, mine), count in ways.items() if taken == per_token) / total


def _block_holders(experts: int, k: int, bounds: tuple[int, ...]) -> float:
    """Mean distinct holders of the blocks ``[s, s + k) mod E`` that tokens' starts
    ``s = i·k mod E`` take in turn."""
    starts = range(0, experts, gcd(experts, k))
    reached = [len({bisect_right(bounds, (s + j) % experts) - 1 for j in range(k)})
               for s in starts]
    return sum(reached) / len(reached)
