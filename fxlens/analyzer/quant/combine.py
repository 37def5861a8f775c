"""One ranking from two estimates of each layer's damage, weighed by their uncertainties.

Per format f and layer i, in dB (higher is safer):

    c_i = t_i + e_i,          e_i ~ (0, v_i)   the calibrated score, a sample of the
                                               calibration examples;
    d_i = t_i − a_f + u_i,    u_i ~ (0, τ²)    the data-free score: an offset a_f (other inputs,
                                               and the weights-only prior is in another unit)
                                               and an error of its own.

``v_i`` is the bootstrap variance of c_i over the calibration examples (`samples.bootstrap`)
with the shift common to every layer of the format taken out (it moves no rank, and a_f
absorbs it), drawn toward the format's typical variance in log space by empirical Bayes
(`_pooled`: each v̂_i rests on the same few examples), times the small-sample factor
``ν/(ν − 2)``: the mean of the true variance given its estimate (an inverse-χ² with ν degrees
of freedom), ν from the examples' excess kurtosis κ (median over the pairs),
``ν = 2 / (2/(n − 1) + κ/n)``, at least `MIN_DOF`. Measured on bench/README.md's models (a
one-off check over 40–60 fresh calibration sets per size): the variance of c_i over sets of 8
examples was 1.4–1.9× the plain bootstrap's on the classifiers, over sets of 128 about 1×. A
calibrated score the Fisher predicted (a layer not measured: big models) has for v_i the mean
square of the Fisher's dB around the measured dB over the measured pairs (per format, offset
removed).

τ² and a_f come from the residuals r_i = c_i − d_i as in a random-effects meta-analysis
(Paule–Mandel: τ² such that ``Σ w_i (r_i − a_f)² = N − F`` with ``w_i = 1 / (v_i + τ²)``, one
offset per format, one τ² for all formats), so the data-free score's spread is measured on
this model, never assumed. The combined score is the precision-weighted mean

    s_i = w_i·c_i + (1 − w_i)·(d_i + a_f),   w_i = τ² / (τ² + v_i),   variance w_i·v_i:

v_i → 0 gives the calibrated score, v_i → ∞ the data-free one (shifted by a_f: the same
order). A layer with only one of the two scores keeps it; an exact format (+∞) stays exact.

Ties: layers most sensitive first; a layer is tied with the first layer of the current group
when their 95 % intervals (``± Z·σ``) overlap, and shares its rank.

Health (`Health`): the expected Spearman ρ between the calibrated order at the score format
and the order an unlimited calibration would give, read from the bootstrap replicates
(``c + √factor·(replicate − mean)``), the share of replicates whose worst layer is the same,
and the examples it would take to reach `STABLE_RHO` (deviations scaled by ``1/√k`` for k×
the examples: variance ∝ 1/n).

NB: the sampling errors of two layers share the calibration examples (correlated); only the
common shift is taken out, the rest is treated as independent. A data-free score whose errors
differ widely across layers (one layer far off) raises τ² for all: the ranking then leans on
the calibration everywhere, the safe side.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from fxlens.analyzer.quant.samples import Pair, Spread

Z = 1.96                # 95 % intervals
MIN_DOF = 4.0           # NB: ν/(ν − 2) ≤ 2; toward 2 the variance of a variance is unbounded
MIN_EXAMPLES = 4        # fewer: no uncertainty; the calibrated score ranks alone, as before
MIN_FISHER_PAIRS = 3    # measured pairs needed to size the Fisher's spread around them
STABLE_RHO = 0.95
GROWTH = (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)

Scores = Mapping[str, Mapping[str, float]]      # layer → format → dB (+∞: exact)


@dataclass(frozen=True)
class Health:
    examples: int
    rank_stability: float | None        # expected Spearman ρ against the unlimited order
    worst_kept: float | None            # share of replicates with the same worst layer
    examples_for_stable: int | None     # for ρ ≥ STABLE_RHO; None: more than GROWTH[-1]×


@dataclass(frozen=True)
class Combination:
    score_db: dict[str, dict[str, float]]
    error_db: dict[str, dict[str, float]]               # ± Z·σ of the combined score
    calibrated_error_db: dict[str, dict[str, float]]    # ± Z·σ of the calibrated score
    weight: dict[str, dict[str, float]]                 # on the calibrated score, 0…1
    rank: dict[str, dict[str, int]]                     # layer → format → rank (ties share)
    prior_spread_db: float | None       # τ; None: too few pairs to measure it (∞)
    factor: float                       # the small-sample factor on the bootstrap variance
    health: Health | None


def combine(calibrated: Scores, evidence: Mapping[str, Mapping[str, str]], free: Scores,
            fisher_db: Scores, spread: Spread | None, score_format: str) -> Combination:
    """The combined score of every layer and format (module docstring)."""
    variance, factor = _variances(calibrated, evidence, fisher_db, spread)
    tau2, offset = prior_variance(calibrated, free, variance)
    score: dict[str, dict[str, float]] = {}
    error: dict[str, dict[str, float]] = {}
    own: dict[str, dict[str, float]] = {}
    weight: dict[str, dict[str, float]] = {}
    for layer in dict.fromkeys([*calibrated, *free]):
        for fmt in dict.fromkeys([*calibrated.get(layer, {}), *free.get(layer, {})]):
            c = calibrated.get(layer, {}).get(fmt, math.nan)
            d = free.get(layer, {}).get(fmt, math.nan) + offset.get(fmt, 0.0)
            v = variance.get((layer, fmt), math.nan)
            s, w, var = blend(c, v, d, tau2)
            if math.isnan(s):
                continue
            score.setdefault(layer, {})[fmt] = s
            weight.setdefault(layer, {})[fmt] = w
            error.setdefault(layer, {})[fmt] = Z * math.sqrt(var) if var >= 0 else math.nan
            own.setdefault(layer, {})[fmt] = Z * math.sqrt(v) if v >= 0 else math.nan
    formats = {fmt for per in score.values() for fmt in per}
    rank: dict[str, dict[str, int]] = {}
    for fmt in sorted(formats):
        for layer, r in tie_ranks({k: v[fmt] for k, v in score.items() if fmt in v},
                                  {k: v[fmt] for k, v in error.items() if fmt in v}).items():
            rank.setdefault(layer, {})[fmt] = r
    return Combination(score, error, own, weight, rank,
                       None if math.isinf(tau2) else math.sqrt(tau2), factor,
                       health(spread, factor, score_format) if spread is not None else None)


def blend(c: float, v: float, d: float, tau2: float) -> tuple[float, float, float]:
    """(combined score, weight on c, its variance) of a calibrated score c (variance v) and
    a data-free one d already shifted by the offset (variance τ²); NaN: absent."""
    if math.isnan(c) or (math.isinf(c) and c > 0):
        return (d, 0.0, tau2) if math.isnan(c) and not math.isnan(d) else (c, 1.0, 0.0)
    if math.isnan(d) or math.isinf(d) or math.isnan(v) or math.isinf(tau2) or v <= 0:
        return c, 1.0, v
    if math.isinf(v):
        return d, 0.0, tau2
    w = tau2 / (tau2 + v)
    return w * c + (1 - w) * d, w, w * v


def _variances(calibrated: Scores, evidence: Mapping[str, Mapping[str, str]],
               fisher_db: Scores, spread: Spread | None) -> tuple[dict[Pair, float], float]:
    """(v_i per (layer, format), the small-sample factor applied)."""
    if spread is None or spread.examples < MIN_EXAMPLES:
        return {}, 1.0
    n = spread.examples
    kappa = max(float(spread.kurtosis.median()), 0.0)
    dof = max(2 / (2 / (n - 1) + kappa / n), MIN_DOF)
    factor = dof / (dof - 2)
    variance = {pair: factor * v for pair, v in _pooled(_centered(spread), dof).items()}
    measured = [(layer, fmt) for (layer, fmt) in variance
                if math.isfinite(fisher_db.get(layer, {}).get(fmt, math.nan))
                and math.isfinite(calibrated.get(layer, {}).get(fmt, math.nan))]
    fisher_v = math.inf
    if len(measured) >= MIN_FISHER_PAIRS:
        residual = {p: fisher_db[p[0]][p[1]] - calibrated[p[0]][p[1]] for p in measured}
        mean = {f: statistics.fmean(r for (_, g), r in residual.items() if g == f)
                for _, f in measured}
        fisher_v = statistics.fmean((r - mean[f]) ** 2 for (_, f), r in residual.items())
    for layer, per in evidence.items():
        for fmt, kind in per.items():
            if kind == "fisher":
                variance[layer, fmt] = fisher_v
    return variance, factor


def _centered(spread: Spread) -> dict[Pair, float]:
    """Each pair's bootstrap variance with the shift common to its format's layers removed
    (a format with one layer keeps its own)."""
    reps = spread.replicates_db
    finite = torch.isfinite(spread.point_db)
    out: dict[Pair, float] = {}
    for fmt in dict.fromkeys(f for _, f in spread.pairs):
        cols = [i for i, (_, f) in enumerate(spread.pairs) if f == fmt and bool(finite[i])]
        if not cols:
            continue
        dev = reps[:, cols] - reps[:, cols].mean(0)
        if len(cols) > 1:
            dev = dev - dev.mean(1, keepdim=True)
        for j, var in zip(cols, dev.var(0).tolist(), strict=True):
            out[spread.pairs[j]] = var
    return out


def _pooled(variance: Mapping[Pair, float], dof: float) -> dict[Pair, float]:
    """Each layer's variance drawn toward its format's typical one, in log space, by
    empirical Bayes: log v̂ has a sampling variance of about 2/ν (a χ² with ν degrees of
    freedom), the true log variances spread by what the observed spread leaves over that;
    each log v̂ moves toward the format's mean log by 2/ν ÷ (2/ν + that spread)."""
    out = dict(variance)
    noise = 2 / dof
    for fmt in dict.fromkeys(f for _, f in variance):
        pairs = [p for p, v in variance.items() if p[1] == fmt and v > 0 and math.isfinite(v)]
        if len(pairs) < 3:
            continue
        logs = {p: math.log(variance[p]) for p in pairs}
        mean = statistics.fmean(logs.values())
        spread = max(statistics.variance(logs.values()) - noise, 0.0)
        pull = noise / (noise + spread)
        out.update({p: math.exp(pull * mean + (1 - pull) * logs[p]) for p in pairs})
    return out


def prior_variance(calibrated: Scores, free: Scores, variance: Mapping[Pair, float]
                   ) -> tuple[float, dict[str, float]]:
    """(τ², offset a_f per format) by Paule–Mandel over every pair with both scores finite
    and a finite v; τ² = ∞ when there are not more pairs than formats."""
    residual: dict[Pair, float] = {}
    for (layer, fmt), v in variance.items():
        c = calibrated.get(layer, {}).get(fmt, math.nan)
        d = free.get(layer, {}).get(fmt, math.nan)
        if math.isfinite(c) and math.isfinite(d) and math.isfinite(v):
            residual[layer, fmt] = c - d
    formats = {f for _, f in residual}
    dof = len(residual) - len(formats)
    if dof < 1:
        return math.inf, {}

    def q(tau2: float) -> tuple[float, dict[str, float]]:
        w = {p: 1 / max(variance[p] + tau2, 1e-12) for p in residual}
        offset = {f: sum(w[p] * r for p, r in residual.items() if p[1] == f)
                  / sum(w[p] for p in residual if p[1] == f) for f in formats}
        return sum(w[p] * (r - offset[p[1]]) ** 2 for p, r in residual.items()), offset

    if q(0.0)[0] <= dof:
        return 0.0, q(0.0)[1]
    high = 1.0
    while q(high)[0] > dof:
        high *= 4
    low = 0.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if q(mid)[0] > dof else (low, mid)
    return high, q(high)[1]


def tie_ranks(scores: Mapping[str, float], errors: Mapping[str, float]) -> dict[str, int]:
    """Rank 1 = most sensitive (lowest score); a layer whose interval (± error) overlaps that
    of its group's first layer shares its rank (an unknown error ties nothing)."""
    order = sorted(scores, key=lambda k: (scores[k], k))
    out: dict[str, int] = {}
    lead = None
    for position, layer in enumerate(order, 1):
        if lead is not None and _overlap(scores[lead], errors.get(lead, math.nan),
                                         scores[layer], errors.get(layer, math.nan)):
            out[layer] = out[lead]
        else:
            lead, out[layer] = layer, position
    return out


def _overlap(a: float, error_a: float, b: float, error_b: float) -> bool:
    if math.isinf(a) and math.isinf(b):
        return True
    if math.isnan(error_a) or math.isnan(error_b):
        return False
    return b - error_b <= a + error_a


def health(spread: Spread, factor: float, score_format: str) -> Health:
    """How far the calibrated order at `score_format` would move with a fresh calibration
    of as many examples, and how many examples would steady it (module docstring)."""
    cols = [i for i, (_, f) in enumerate(spread.pairs)
            if f == score_format and math.isfinite(float(spread.point_db[i]))]
    if len(cols) < 3 or spread.examples < MIN_EXAMPLES:
        return Health(spread.examples, None, None, None)
    point = spread.point_db[cols]
    deviation = (spread.replicates_db[:, cols] - spread.replicates_db[:, cols].mean(0)
                 ) * math.sqrt(factor)
    rho = {k: _mean_spearman(point, point + deviation / math.sqrt(k)) for k in GROWTH}
    worst = int(point.argmin())
    kept = float(((point + deviation).argmin(1) == worst).double().mean())
    enough = next((k for k in GROWTH if rho[k] >= STABLE_RHO), None)
    return Health(spread.examples, round(rho[1], 4), round(kept, 4),
                  None if enough is None else math.ceil(enough * spread.examples))


def _mean_spearman(point: torch.Tensor, replicates: torch.Tensor) -> float:
    """The mean over replicates (rows) of Spearman's ρ with `point` (no ties in floats)."""
    def ranks(x: torch.Tensor) -> torch.Tensor:
        return x.argsort(-1).argsort(-1).double()
    a = ranks(point)
    b = ranks(replicates)
    a, b = a - a.mean(), b - b.mean(-1, keepdim=True)
    rho = (b @ a) / (a.norm() * b.norm(dim=-1)).clamp(min=1e-300)
    return float(rho.mean())


def describe(weights: Sequence[float]) -> str:
    """Which score ranks, from the weights on the calibrated one (their median: the weight
    of the layer whose calibrated ± is the median one)."""
    if not weights:
        return "data-free"
    typical = statistics.median(weights)
    if typical >= 0.9:
        return "calibrated"
    if typical <= 0.1:
        return "data-free"
    return "leans on calibrated" if typical >= 0.5 else "leans on data-free"
