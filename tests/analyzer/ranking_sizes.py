"""Calibration sets of a chosen size for the ranking models (`tests.analyzer.ranking_models`),
and two more models whose data-free score ranks well (issue 35).

`calibration_batches` draws ``batches × rows`` examples without replacement from the model's
calibration pool, in batches of ``rows``: the digits models' 500-row calibration split, the
Gaussian MLP's 1,000 rows; `POOL` fresh Friedman #1 draws for the regression (the same
generator, another random state); for the LM, `POOL` windows at random offsets of its
calibration text (they overlap: the text holds about 130 disjoint ones). The held-out data is
never drawn from.

The two models: an 8-layer MLP on Gaussian class clusters (sklearn's `make_classification`,
inputs already standardised, so the data-free Fisher's synthetic inputs, drawn like
``torch.randn`` examples, look like the real ones), and a small GRU classifier (projection,
one GRU layer, head: 4 weight matrices) on the digits' rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tests.analyzer import ranking_models as rm

F = nn.functional


def _clusters(seed: int, count: int, features: int = 24, classes: int = 6
              ) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import make_classification

    x, y = make_classification(count, features, n_informative=12, n_redundant=4,
                               n_classes=classes, n_clusters_per_class=2, class_sep=1.0,
                               flip_y=0.02, random_state=seed)
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y)


def gaussian_mlp(seed: int = 0, depth: int = 8, epochs: int = 15) -> rm.Case:
    """`depth` Linear layers on 6 classes of Gaussian clusters in 24 dimensions: 3,000
    training rows, 1,000 for calibration, 2,000 held out."""
    x, y = _clusters(seed, 6000)
    torch.manual_seed(seed)
    model = rm.relu_mlp([24] + [64] * (depth - 1) + [6])
    index = torch.arange(6000)
    train, calib, test = index[:3000], index[3000:4000], index[4000:]
    rm._fit(model, rm._minibatches(x, y, train), F.cross_entropy, epochs, seed)
    return rm.Case("Gaussian-cluster MLP", model, (torch.randn(1, 24),), [(x[calib],)],
                   (x[test],), y[test], "classify")


class SmallGRU(nn.Module):
    """The digits' 8 rows as a sequence: projection, one GRU layer, head."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 24)
        self.gru = nn.GRU(24, 32, batch_first=True)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        return self.head(self.gru(torch.relu(self.proj(x)))[0][:, -1])  # type: ignore[no-any-return]


def small_gru(seed: int = 0) -> rm.Case:
    x, y, *split = rm._digits(seed)
    torch.manual_seed(seed)
    return rm._classifier_case("small GRU classifier", SmallGRU(), x.reshape(-1, 8, 8), y,
                               split, torch.randn(1, 8, 8), 20, seed)


CASES: dict[str, Callable[[int], rm.Case]] = {
    **rm.CASES, "gaussian_mlp": gaussian_mlp, "small_gru": small_gru}


# --- calibration pools -----------------------------------------------------------------------


def _friedman_pool(seed: int, count: int) -> torch.Tensor:
    from sklearn.datasets import make_friedman1

    x, _ = make_friedman1(count, 10, noise=0.1, random_state=10_000 + seed)
    return torch.tensor(x, dtype=torch.float32)


def _lm_pool(seed: int, count: int, context: int = 32) -> torch.Tensor:
    """`count` windows at random offsets of the LM's calibration text (`rm.char_lm`'s split)."""
    text = rm._corpus()
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    n = len(ids)
    calib = ids[int(0.8 * n):int(0.9 * n)]
    start = torch.randint(len(calib) - context, (count,),
                          generator=torch.Generator().manual_seed(10_000 + seed))
    return torch.stack([calib[s:s + context] for s in start.tolist()])


POOL = 1024     # examples drawn for the regression's and the LM's pools


def pool(name: str, case: rm.Case, seed: int, count: int) -> torch.Tensor:
    """The calibration pool of the model `name` (see the docstring), of at least `count`
    examples."""
    if name in ("regression", "char_lm"):
        if count > POOL:
            raise ValueError(f"{case.name}: {count} calibration rows asked, the pool has {POOL}")
        return (_friedman_pool if name == "regression" else _lm_pool)(seed, POOL)
    (inputs,) = case.calibration[0]
    if len(inputs) < count:
        raise ValueError(f"{case.name}: {count} calibration rows asked, the split has "
                         f"{len(inputs)}")
    return inputs  # type: ignore[no-any-return]


def calibration_batches(name: str, case: rm.Case, seed: int, batches: int, rows: int,
                        draw: int = 0) -> list[tuple[Any, ...]]:
    """`batches` batches of `rows` examples drawn without replacement from the pool; `draw`
    numbers other draws from the same pool."""
    examples = pool(name, case, seed, batches * rows)
    order = torch.randperm(len(examples),
                           generator=torch.Generator().manual_seed(seed + 1000 * draw))
    return [(examples[order[i * rows:(i + 1) * rows]],) for i in range(batches)]


def with_calibration(case: rm.Case, batches: list[tuple[Any, ...]]) -> rm.Case:
    return dataclasses.replace(case, calibration=batches)


def size_rows(name: str, case: rm.Case, seed: int, sizes: list[int], rows: int,
              draws: int = 1, formats: list[str] | None = None) -> dict[int, list[rm.Row]]:
    """Per calibration size (batches), the ranking rows of the primary metric (distortion),
    for `draws` calibration sets drawn from the pool; the truth and the weights-only prior
    measured once."""
    prior = rm.fxlens_section(case, calibrated=False, synthetic=False)
    formats = formats or list(prior["formats"])
    truth = rm.true_damage(case, formats, ["distortion"])
    return {size: [row for draw in range(draws) for row in rm.ranking_rows(
        with_calibration(case, calibration_batches(name, case, seed, size, rows, draw)),
        formats, truth, prior)] for size in sizes}
