"""Calibrated pruning importance against the damage measured for real on held-out data (issue 33).

For each small model trained here and each seed, fxlens finds the coupled groups
(`fxlens.analyzer.prune`) and ranks every unit (a channel, neuron, head or KV group with all its
coupled entries) three ways:

- calibrated: the section's calibrated importance — the unit removed alone, the calibration
  split forwarded, the damage by ``--quant-calibrate``'s metric (KL of the predictions, or the
  relative output error power of a regression); every unit measured (the section measures
  every unit up to `MEASURE_UNITS`, 256, in all);
- calibrated ¼: the same with a budget of a quarter of the units measured, the rest
  interpolated along each group's data-free order (what a model with more units than
  `MEASURE_UNITS` gets);
- calibrated, 32 rows: every unit measured on the first 32 rows of the calibration split only;
- data-free: the L2 norm of the unit's weights (``|γ|`` where a batch norm scales it) divided
  by its group's mean — the part-1 ranking.

The truth: each unit removed alone for real (the same slicing as ``--prune-save``) and the
held-out rows forwarded; the damage is the distortion of the model's own predictions (KL to
the unpruned model; relative error power for the regression), and, second, the increase of the
task loss. Spearman ρ between each ranking and the truth over every unit of every group (the
ranking the plan cuts from). Then the plan at ``--prune-target 20%``: the held-out accuracy
(R² for the regression) of the pruned module with calibrated against data-free ranking, no
fine-tuning (the section's own plan: above 256 units, its ranking is partly interpolated).

Models (`tests/analyzer/ranking_models.py`, as bench/quant_ranking.py, plus one here): a deep
MLP and a BatchNorm + depthwise CNN on sklearn's digits, the regression MLP with planted
function-preserving outlier channels (Friedman #1, synthetic), the 4-block character LM, and a
residual CNN on synthetic images (8 classes, each a smooth random template, shifted by up to 2
pixels, with noise), and a 2-block transformer on synthetic token sequences (which of 4 marker
tokens is most frequent; its attention reshapes with ``-1``, so heads and the residual stream
are groups, which the char LM's fixed reshape blocks). Target (issue 33): calibrated ρ ≥ 0.8.

    .venv/bin/python bench/prune_ranking.py                     # 3 seeds, every model
    .venv/bin/python bench/prune_ranking.py --seeds 0 --models deep_mlp res_cnn
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fxlens.analyzer.capture.chain import capture  # noqa: E402
from fxlens.analyzer.core.loaded import LoadedModel  # noqa: E402
from fxlens.analyzer.cost.engine import analyze  # noqa: E402
from fxlens.analyzer.prune.calibrated import CalibrationData, unit_damages  # noqa: E402
from fxlens.analyzer.prune.groups import Found  # noqa: E402
from fxlens.analyzer.prune.module import removed  # noqa: E402
from fxlens.analyzer.prune.plan import parse_target  # noqa: E402
from fxlens.analyzer.prune.section import PruneResult, prune  # noqa: E402
from fxlens.prune_pass import calibration_data  # noqa: E402
from fxlens.rules import load_rules  # noqa: E402
from fxlens.rules.prune import knowledge  # noqa: E402
from tests.analyzer import ranking_models as rm  # noqa: E402

F = nn.functional
KINDS = ("calibrated", "calibrated ¼", "calibrated, 32 rows", "data-free")
FEW = 32            # calibration rows of the small-calibration ranking
TARGET = "20%"


# --- a residual CNN on synthetic images ------------------------------------------------------


class ResBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, C, H, W)
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


def res_cnn(seed: int = 0, classes: int = 8, size: int = 12, width: int = 24) -> rm.Case:
    """Stem, 3 residual blocks, pooled linear head, on synthetic images: each class a smooth
    random template (4 × 4 noise upsampled), shifted by up to 2 pixels, plus noise 0.5."""
    g = torch.Generator().manual_seed(1000 + seed)
    templates = F.interpolate(torch.randn(classes, 1, 4, 4, generator=g), size=size,
                              mode="bilinear", align_corners=False)
    n = 3000
    y = torch.randint(classes, (n,), generator=g)
    shifts = torch.randint(-2, 3, (n, 2), generator=g)
    x = torch.stack([templates[c].roll((int(a), int(b)), (1, 2))
                     for c, (a, b) in zip(y.tolist(), shifts, strict=True)])
    x = x + 0.5 * torch.randn(x.shape, generator=g)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                          nn.ReLU(), *(ResBlock(width) for _ in range(3)),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes))
    split = (torch.arange(1800), torch.arange(1800, 2300), torch.arange(2300, n))
    return rm._classifier_case("residual CNN, synthetic images", model, x, y, split,
                               torch.randn(1, 1, size, size), 12, seed)


# --- a small transformer on synthetic token sequences ----------------------------------------


class Encoder(nn.Module):
    """Pre-norm blocks whose attention reshapes with ``-1`` (so heads and the residual stream
    can be pruned), mean-pooled into a linear head. Legend: ``B, T, C``; heads ``H, d``."""

    def __init__(self, vocab: int, classes: int, d: int = 32, heads: int = 4, blocks: int = 2,
                 length: int = 16) -> None:
        super().__init__()
        self.heads = heads
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(0.1 * torch.randn(length, d))
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln1": nn.LayerNorm(d), "qkv": nn.Linear(d, 3 * d), "o": nn.Linear(d, d),
            "ln2": nn.LayerNorm(d), "fc1": nn.Linear(d, 2 * d), "fc2": nn.Linear(2 * d, d),
        }) for _ in range(blocks))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids: (B, T)
        x = self.tok(ids) + self.pos
        b, t = ids.shape
        for blk in self.blocks:
            q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2)      # (B, H, T, d)
                       for z in blk["qkv"](blk["ln1"](x)).chunk(3, dim=-1))
            a = F.scaled_dot_product_attention(q, k, v)
            x = x + blk["o"](a.transpose(1, 2).reshape(b, t, -1))
            x = x + blk["fc2"](F.gelu(blk["fc1"](blk["ln2"](x))))
        return self.head(self.ln(x).mean(1))


def seq_transformer(seed: int = 0, vocab: int = 8, classes: int = 4, length: int = 16
                    ) -> rm.Case:
    """Which of `classes` marker tokens comes up most often in a sequence of `length` tokens
    over `vocab` (the others are noise): a count across positions, read through attention."""
    g = torch.Generator().manual_seed(2000 + seed)
    n = 3000
    y = torch.randint(classes, (n,), generator=g)
    x = torch.randint(vocab, (n, length), generator=g)
    extra = torch.rand(n, length, generator=g) < 0.25
    x = torch.where(extra, y[:, None], x)
    torch.manual_seed(seed)
    model = Encoder(vocab, classes, length=length)
    split = (torch.arange(1800), torch.arange(1800, 2300), torch.arange(2300, n))
    return rm._classifier_case("transformer, synthetic sequences", model, x, y, split,
                               torch.randint(vocab, (1, length)), 15, seed)


CASES: dict[str, Callable[[int], rm.Case]] = {
    "deep_mlp": rm.deep_mlp, "bn_cnn": rm.bn_cnn, "regression": rm.regression_outliers,
    "char_lm": rm.char_lm, "res_cnn": res_cnn, "transformer": seq_transformer,
}


# --- fxlens's rankings and the truth ---------------------------------------------------------


def fxlens_prune(case: rm.Case, data: CalibrationData | None, target: str | None = None
                 ) -> PruneResult:
    registry = load_rules()
    graph = capture(case.model, case.example, registry)
    return prune(case.model, case.example, graph, analyze(graph, registry), knowledge(),
                 registry, parse_target(target) if target else None, calibration=data)


def scores(groups: Sequence[Found]) -> dict[tuple[int, int], float]:
    """(root, unit) → importance, divided by the group's mean unless comparable."""
    out = {}
    for g in groups:
        mean = 1.0 if g.comparable else statistics.fmean(g.importance) or 1.0
        out.update({(g.root, u): v / mean for u, v in enumerate(g.importance)})
    return out


def truth(case: rm.Case, groups: Sequence[Found]) -> dict[str, dict[tuple[int, int], float]]:
    """metric → (root, unit) → the held-out damage of removing that unit alone."""
    rules = knowledge()
    reference = case.predict()
    base = case.loss_rows(reference).mean()
    out: dict[str, dict[tuple[int, int], float]] = {"distortion": {}, "loss": {}}
    for g in groups:
        for unit in range(g.units):
            with removed(case.model, groups, {g.root: frozenset({unit})}, rules):
                got = case.predict()
            out["distortion"][g.root, unit] = float(case.distortion_rows(reference, got).mean())
            out["loss"][g.root, unit] = float(case.loss_rows(got).mean() - base)
    return out


def quality(case: rm.Case, model: nn.Module) -> float:
    """Held-out accuracy (classification) or R² (regression)."""
    out = case.predict(model)
    if case.task == "regress":
        return float(1 - (out - case.target).pow(2).mean() / case.target.var())
    return float((out.argmax(-1) == case.target).float().mean())


def planned_quality(case: rm.Case, groups: Sequence[Found], result: PruneResult) -> float:
    """The plan's own pruned module (whole blocks in it exclusive with their inner units, so
    the plan is not a prefix of `ranked_units` of `units_removed` units)."""
    assert result.section.plan is not None and result.module is not None
    return quality(case, result.module)


def run_case(name: str, seed: int) -> list[str]:
    start = time.perf_counter()
    case = CASES[name](seed)
    trained = time.perf_counter()
    loaded = LoadedModel(case.model, case.example, name, name,
                         calibration=lambda: case.calibration)
    data = calibration_data(loaded)
    assert data is not None
    calibrated = fxlens_prune(case, data, TARGET)          # the section's path, for the plan
    data_free = fxlens_prune(case, None, TARGET)
    groups = data_free.groups
    total = sum(g.units for g in groups)
    ranked = {"data-free": scores(groups)}
    few = dataclasses.replace(data, batches=[tuple(t[:FEW] for t in data.batches[0])])
    for kind, budget, sample in (("calibrated", total, data), ("calibrated ¼", total // 4, data),
                                 ("calibrated, 32 rows", total, few)):
        damages = unit_damages(case.model, groups, sample, knowledge(), budget=budget)
        ranked[kind] = scores([dataclasses.replace(g, importance=damages.per_unit[g.root],
                                                   comparable=True) for g in groups])
    measured = time.perf_counter()
    true = truth(case, groups)
    keys = sorted(true["distortion"])
    rho = {(kind, metric): rm.spearman([ranked[kind][k] for k in keys],
                                        [true[metric][k] for k in keys])
           for kind in KINDS for metric in true}
    base = quality(case, case.model)
    after = (planned_quality(case, calibrated.groups, calibrated),
             planned_quality(case, groups, data_free))
    print(f"{case.name} seed {seed}: trained in {trained - start:.1f} s, {total} units in "
          f"{len(groups)} groups ranked in {measured - trained:.1f} s, truth in "
          f"{time.perf_counter() - measured:.1f} s", file=sys.stderr)
    cells = " | ".join(f"{rho[k, 'distortion']:+.2f} / {rho[k, 'loss']:+.2f}" for k in KINDS)
    unit = "R²" if case.task == "regress" else "acc"
    return [f"| {case.name} | {seed} | {len(groups)} · {total} | {cells} | {unit} {base:.3f} "
            f"→ {after[0]:.3f} / {after[1]:.3f} |"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lines = ["| model | seed | groups · units | " + " | ".join(
        f"{k} ρ (distortion / loss)" for k in KINDS) + f" | {TARGET} params cut: "
        "calibrated / data-free plan |", "|---|---|---|" + "---|" * len(KINDS) + "---|"]
    for name in args.models:
        for seed in args.seeds:
            lines += run_case(name, seed)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
