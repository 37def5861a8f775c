"""What each calibration example carries of a measured damage, and the bootstrap over examples.

Every calibrated damage (`fxlens.analyzer.quant.calibrated`) is a ratio of sums over the
calibration examples, ``D = Σ_e x_e / Σ_e m_e``:

- ``kl``: x_e the KL of the example's logit rows, m_e its number of rows (a sequence model's
  example is its whole sequence); the top `TAIL_SHARE` of rows capped as `tail_capped_mean`
  caps them (`Samples.capped`, never under ``floor`` × the plain mean);
- ``agreement``: x_e the example's rows whose top-1 class flips, m_e its rows;
- ``sqnr``: x_e the example's output error power Σ(y − ŷ)², m_e its output power Σy².

An *example* is one index along the batch axis that the inputs share (`example_sizes`, as
`fisher.split_examples` splits them), when every output leaf has that axis first; else the
whole batch is one example. Resampling examples, not rows, keeps a sequence's correlated
positions together.

`bootstrap` draws the examples with replacement (`REPLICATES` times, one draw shared by every
layer and format: a paired bootstrap, so differences between layers keep their correlation)
and gives each pair's damage in dB per replicate. NB: the bootstrap variance of a mean's
log reads low on few, heavy-tailed examples (a confident classifier's KL sits on the rare
ambiguous rows, which a small sample rarely holds): measured on bench/README.md's models, the
true variance over fresh calibration sets of 8 examples was 1.4–1.9× the bootstrap's, about
1× at 128. `combine` corrects it by the effective degrees of freedom of the variance estimate,
read from the examples' kurtosis (`Spread.kurtosis`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

Pair = tuple[str, str]                  # (layer, format)

REPLICATES = 200
SEED = 0


@dataclass(frozen=True)
class Samples:
    """Per calibration example: its share of every measured pair's damage."""

    weight: torch.Tensor                    # (E,) m_e
    damage: Mapping[Pair, torch.Tensor]     # (E,) x_e
    capped: Mapping[Pair, torch.Tensor]     # (E,) x_e with the capped rows capped
    floor: float = 0.0                      # the capped ratio never under floor × the plain

    @property
    def examples(self) -> int:
        return int(self.weight.numel())


@dataclass(frozen=True)
class Spread:
    """The bootstrap of `Samples`: every pair's damage in dB (higher is safer) per replicate."""

    pairs: tuple[Pair, ...]
    point_db: torch.Tensor                  # (P,)
    replicates_db: torch.Tensor             # (B, P)
    kurtosis: torch.Tensor                  # (P,) excess kurtosis of the linearised x_e
    examples: int


def example_sizes(batches: Sequence[Any], runs: Sequence[Sequence[torch.Tensor]]) -> list[int]:
    """Examples per batch: the size of the batch axis its input tensors share, when every
    output leaf has that axis first; else 1 (the batch is one example)."""
    sizes = []
    for batch, leaves in zip(batches, runs, strict=True):
        tensors = [t for t in pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)]
        found = {t.shape[0] if t.dim() else -1 for t in tensors}
        size = found.pop() if len(found) == 1 else -1
        split = size >= 1 and all(t.dim() >= 1 and t.shape[0] == size for t in leaves)
        sizes.append(size if split else 1)
    return sizes


def example_power(reference: Sequence[Sequence[torch.Tensor]], sizes: Sequence[int],
                  other: Sequence[Sequence[torch.Tensor]] | None = None) -> torch.Tensor:
    """Σ y² (or Σ (y − ŷ)² with `other`) over each example's output elements (float64)."""
    out = []
    for b, size in enumerate(sizes):
        total = torch.zeros(size, dtype=torch.float64)
        for i, t in enumerate(reference[b]):
            x = t.detach().double()
            if other is not None:
                x = x - other[b][i].detach().double()
            total += x.pow(2).reshape(size, -1).sum(1)
        out.append(total)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def row_examples(row_counts: Sequence[Sequence[int]], sizes: Sequence[int]) -> torch.Tensor:
    """The example of every logit row, in the order the rows are concatenated: per batch,
    per logit leaf, that leaf's rows (its batch axis first, so rows of one example are
    consecutive)."""
    ids, offset = [], 0
    for counts, size in zip(row_counts, sizes, strict=True):
        for rows in counts:
            per = rows // size if size > 0 and rows % size == 0 else 0
            ids.append(offset + torch.arange(size).repeat_interleave(per) if per
                       else torch.full((rows,), offset))
        offset += size
    return torch.cat(ids) if ids else torch.zeros(0, dtype=torch.long)


def per_example(rows: torch.Tensor, ids: torch.Tensor, examples: int) -> torch.Tensor:
    """Each example's sum of its rows' values (float64)."""
    out = torch.zeros(examples, dtype=torch.float64)
    return out.index_add_(0, ids, rows.double())


def bootstrap(samples: Samples, replicates: int = REPLICATES, seed: int = SEED) -> Spread | None:
    """Every pair with some damage resampled over the examples (one draw for all pairs);
    None with fewer than two examples."""
    pairs = tuple(p for p, x in samples.damage.items() if float(x.sum()) > 0)
    count = samples.examples
    if count < 2 or not pairs:
        return None
    g = torch.Generator().manual_seed(seed)
    draws = torch.randint(count, (replicates, count), generator=g)
    w = torch.zeros(replicates, count, dtype=torch.float64).scatter_add_(
        1, draws, torch.ones(replicates, count, dtype=torch.float64))      # (B, E)
    x = torch.stack([samples.damage[p].double() for p in pairs], 1)          # (E, P)
    c = torch.stack([samples.capped[p].double() for p in pairs], 1)
    m = samples.weight.double()
    point = _ratio(c.sum(0, keepdim=True), x.sum(0, keepdim=True), m.sum(), samples.floor)[0]
    rep = _ratio(w @ c, w @ x, (w @ m).unsqueeze(1), samples.floor)
    # NB: a replicate with no damage at all would read +∞ dB: floor it at half the least
    # damage one example carries, as if half an example had drawn it
    least = torch.where(x > 0, x, torch.inf).amin(0) / (2 * m.sum().clamp(min=1e-300))
    rep = torch.maximum(rep, least)
    z = x - point * m.unsqueeze(1)                                            # linearised
    second = z.pow(2).mean(0)
    kurtosis = torch.where(second > 0, z.pow(4).mean(0) / second.clamp(min=1e-300).pow(2) - 3,
                           torch.zeros_like(second))
    return Spread(pairs, _db(point), _db(rep), kurtosis, count)


def _ratio(capped: torch.Tensor, plain: torch.Tensor, weight: torch.Tensor | float,
           floor: float) -> torch.Tensor:
    total = weight.clamp(min=1e-300) if isinstance(weight, torch.Tensor) else max(weight, 1e-300)
    return torch.maximum(capped / total, floor * plain / total)


def _db(damage: torch.Tensor) -> torch.Tensor:
    return -10 * torch.log10(damage.clamp(min=1e-300))
