"""Small models trained here, and the true damage of quantizing each weight matrix alone, for the
ranking checks (tests/analyzer/test_quant_ranking.py) and bench/quant_ranking.py.

Each `Case` is a trained model, its example inputs as a user would write them (random, no
data), calibration batches from a split of its own data, held-out data and the task loss on
it. `true_damage` quantizes one weight matrix at a time for real — BatchNorms folded first, as
deployment does (`Layer.quantize`) — and measures on held-out data the increase of the task
loss, and the distortion of the model's own predictions (KL to the full-precision model, or
the relative output error of a regression). NB: at 8 bits the task-loss change of one small
layer is dominated by its first-order term (the held-out gradient times Δw, of either sign),
which no sensitivity score predicts; the distortion is second order and always ≥ 0.
`ranking_rows` compares fxlens's data-free and calibrated rankings with it (Spearman ρ, and
whether the layer fxlens ranks worst is the truly worst, or one the held-out rows cannot tell
from it: `tied`, a paired test over the rows' damages).

Models: a deep MLP and a BatchNorm + depthwise CNN on sklearn's digits, a 3-layer GRU reading
the digits' rows as a sequence, a regression MLP with function-preserving outlier channels
planted after training (channels scaled up by 16, the next layer's inputs down by 16), and a
4-block character transformer LM on sklearn's dataset descriptions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.core.codec import encode
from fxlens.analyzer.quant.section import QuantSettings, quant_section
from fxlens.analyzer.quant.weights import Layer, find_layers, fold_batch_norms
from fxlens.rules import load_rules
from fxlens.rules.quant import knowledge

F = nn.functional


@dataclass(frozen=True)
class Case:
    name: str
    model: nn.Module
    example: tuple[Any, ...]                 # the example inputs a user would write
    calibration: list[tuple[Any, ...]]
    held_out: tuple[Any, ...]                # model inputs
    target: torch.Tensor                     # held-out labels (classes) or values
    task: str                                # "classify" (cross-entropy) or "regress" (MSE)

    def predict(self, model: nn.Module | None = None) -> torch.Tensor:
        with torch.no_grad():
            return (model or self.model)(*self.held_out)  # type: ignore[no-any-return]

    def loss_rows(self, out: torch.Tensor) -> torch.Tensor:
        """The task loss of each row (cross-entropy per class row, MSE per output row)."""
        if self.task == "regress":
            return (out - self.target).double().pow(2).reshape(len(out), -1).mean(-1)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]).double(),
                               self.target.reshape(-1), reduction="none")

    def distortion_rows(self, reference: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """KL(p ‖ p_quantized) of each class row (classify), or each output row's error power
        over the reference's mean power (regress): their mean is the relative error power."""
        if self.task == "regress":
            error = (out - reference).double().pow(2).reshape(len(out), -1).mean(-1)
            return error / reference.double().pow(2).mean()
        p = reference.reshape(-1, reference.shape[-1]).double().log_softmax(-1)
        q = out.reshape(-1, out.shape[-1]).double().log_softmax(-1)
        return (p.exp() * (p - q)).sum(-1)


# --- data ------------------------------------------------------------------------------------


def _digits(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                 torch.Tensor]:
    """(x, y, train, calibration, test indices) of sklearn's digits, split by `seed`."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    return x, y, perm[:900], perm[900:1400], perm[1400:]


def _fit(model: nn.Module, batches: Callable[[torch.Generator], list[tuple[Any, Any]]],
         loss: Callable[[Any, Any], torch.Tensor], epochs: int, seed: int, lr: float = 3e-3
         ) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr)
    model.train()
    for _ in range(epochs):
        for inputs, target in batches(g):
            opt.zero_grad()
            loss(model(inputs), target).backward()
            opt.step()
    return model.eval()


def _minibatches(x: torch.Tensor, y: torch.Tensor, index: torch.Tensor, size: int = 32
                 ) -> Callable[[torch.Generator], list[tuple[Any, Any]]]:
    def draw(g: torch.Generator) -> list[tuple[Any, Any]]:
        order = index[torch.randperm(len(index), generator=g)]
        return [(x[order[i:i + size]], y[order[i:i + size]])
                for i in range(0, len(order), size)]
    return draw


def relu_mlp(widths: Sequence[int]) -> nn.Sequential:
    """Linear layers of `widths` with a ReLU between each two (none after the last)."""
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:], strict=False):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _classifier_case(name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                     split: Sequence[torch.Tensor], example: torch.Tensor, epochs: int,
                     seed: int) -> Case:
    train, calib, test = split
    _fit(model, _minibatches(x, y, train), F.cross_entropy, epochs, seed)
    return Case(name, model, (example,), [(x[calib],)], (x[test],), y[test], "classify")


# --- models ----------------------------------------------------------------------------------


def deep_mlp(seed: int = 0, depth: int = 10, epochs: int = 25) -> Case:
    """`depth` Linear layers on the digits."""
    x, y, *split = _digits(seed)
    torch.manual_seed(seed)
    widths = [64] + [48] * (depth - 1) + [10]
    return _classifier_case("deep MLP", relu_mlp(widths), x, y, split,
                            torch.randn(1, 64), epochs, seed)


def _dw_block(c_in: int, c_out: int, stride: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_in, 3, stride, 1, groups=c_in, bias=False), nn.BatchNorm2d(c_in),
            nn.ReLU(), nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]


def bn_cnn(seed: int = 0) -> Case:
    """A BatchNorm + depthwise-separable CNN on the digits as 1×8×8 images."""
    x, y, *split = _digits(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        *_dw_block(16, 32, 1), *_dw_block(32, 32, 2), *_dw_block(32, 48, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(48, 10))
    images = x.reshape(-1, 1, 8, 8)
    return _classifier_case("BN + depthwise CNN", model, images, y, split,
                            torch.randn(1, 1, 8, 8), 20, seed)


class GRUClassifier(nn.Module):
    """The digits' 8 rows as a sequence of 8 pixels: projection, 3-layer GRU, MLP head."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 32)
        self.gru = nn.GRU(32, 48, num_layers=3, batch_first=True)
        self.fc = nn.Linear(48, 48)
        self.head = nn.Linear(48, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        h = self.gru(torch.relu(self.proj(x)))[0][:, -1]
        return self.head(torch.relu(self.fc(h)))


def gru(seed: int = 0) -> Case:
    x, y, *split = _digits(seed)
    torch.manual_seed(seed)
    return _classifier_case("GRU classifier", GRUClassifier(), x.reshape(-1, 8, 8), y, split,
                            torch.randn(1, 8, 8), 20, seed)


def regression_outliers(seed: int = 0, depth: int = 8, planted: float = 16.0) -> Case:
    """An MLP regressing Friedman #1; then channels 0–1 of every other hidden layer scaled up
    by `planted` and the next layer's matching inputs down by it (ReLU is positively
    homogeneous: the function is unchanged, the weights' ranges are not)."""
    from sklearn.datasets import make_friedman1

    xs, ys = make_friedman1(2000, 10, noise=0.1, random_state=seed)
    x = torch.tensor(xs, dtype=torch.float32)
    y = torch.tensor(ys, dtype=torch.float32).unsqueeze(1)
    y = (y - y.mean()) / y.std()
    torch.manual_seed(seed)
    model = relu_mlp([10] + [48] * (depth - 1) + [1])
    perm = torch.randperm(2000, generator=torch.Generator().manual_seed(seed))
    train, calib, test = perm[:1400], perm[1400:1600], perm[1600:]
    _fit(model, _minibatches(x, y, train), F.mse_loss, 40, seed)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for a, b in list(zip(linears, linears[1:], strict=False))[1::2]:
            a.weight[:2] *= planted
            a.bias[:2] *= planted
            b.weight[:, :2] /= planted
    return Case("regression MLP, planted outliers", model, (torch.randn(1, 10),),
                [(x[calib],)], (x[test],), y[test], "regress")


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, C)
        b, t, c = x.shape
        h = self.ln1(x)
        q, k, v = (p(h).reshape(b, t, self.heads, -1).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class CharLM(nn.Module):
    def __init__(self, vocab: int, d: int = 48, blocks: int = 4, heads: int = 4,
                 context: int = 32) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(blocks))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids: (B, T)
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _corpus() -> str:
    import sklearn.datasets

    descr = Path(sklearn.datasets.__file__).parent / "descr"
    return "".join(p.read_text() for p in sorted(descr.glob("*.rst")))


def char_lm(seed: int = 0, steps: int = 500, context: int = 32) -> Case:
    """4 blocks (27 weight matrices) on sklearn's dataset descriptions; the last 10 % held
    out, the 10 % before it for calibration."""
    text = _corpus()
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    n = len(ids)
    train, calib, test = ids[:int(0.8 * n)], ids[int(0.8 * n):int(0.9 * n)], ids[int(0.9 * n):]
    torch.manual_seed(seed)
    model = CharLM(len(chars), context=context)
    g = torch.Generator().manual_seed(seed)

    def windows(source: torch.Tensor, count: int, gen: torch.Generator) -> torch.Tensor:
        start = torch.randint(len(source) - context - 1, (count,), generator=gen)
        return torch.stack([source[s:s + context + 1] for s in start.tolist()])

    def batches(gen: torch.Generator) -> list[tuple[Any, Any]]:
        w = windows(train, 32, gen)
        return [(w[:, :-1], w[:, 1:])]

    def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    _fit(model, batches, lm_loss, steps, seed)
    held = windows(test, 128, g)
    calib_ids = windows(calib, 64, g)[:, :-1]
    example = torch.randint(0, len(chars), (1, context))
    return Case("char LM, 4 blocks", model, (example,), [(calib_ids,)], (held[:, :-1],),
                held[:, 1:], "classify")


CASES: dict[str, Callable[[int], Case]] = {
    "deep_mlp": deep_mlp, "bn_cnn": bn_cnn, "gru": gru,
    "regression": regression_outliers, "char_lm": char_lm,
}

# --- truth and fxlens's rankings -------------------------------------------------------------


def candidates(case: Case) -> list[Layer]:
    """fxlens's candidates with their BatchNorms folded, as the section scores them."""
    graph = capture(case.model, case.example, load_rules())
    known = knowledge()
    return fold_batch_norms(case.model, graph, find_layers(case.model, known), known)


METRICS = ("loss", "distortion")


def true_damage(case: Case, formats: Sequence[str], metrics: Sequence[str] = METRICS
                ) -> dict[tuple[str, str], dict[str, torch.Tensor]]:
    """(format, metric) → layer → the damage on each held-out row with that layer alone
    quantized for real: ``loss``, the increase of the task loss; ``distortion``, the KL of the
    model's own predictions (or their relative error power, for a regression). The damage is
    the rows' mean; the rows tell whether two layers' damages differ beyond sampling noise."""
    known = knowledge()
    reference = case.predict()
    base = case.loss_rows(reference) if "loss" in metrics else None
    out: dict[tuple[str, str], dict[str, torch.Tensor]] = {
        (f, m): {} for f in formats for m in metrics}
    for layer in candidates(case):
        weight = layer.weight
        original = weight.data
        for fmt in formats:
            weight.data = layer.quantize(known.formats[fmt])
            try:
                predicted = case.predict()
            finally:
                weight.data = original
            if base is not None:
                out[fmt, "loss"][layer.name] = case.loss_rows(predicted) - base
            if "distortion" in metrics:
                out[fmt, "distortion"][layer.name] = case.distortion_rows(reference, predicted)
    return out


def on_calibration(case: Case) -> Case:
    """The case with its calibration split as the rows `true_damage` measures (distortion
    only: the calibration split has no labels here)."""
    (inputs,) = case.calibration
    return replace(case, held_out=inputs, target=torch.zeros(0))


def fxlens_section(case: Case, calibrated: bool = True, synthetic: bool = True
                   ) -> dict[str, Any]:
    graph = capture(case.model, case.example, load_rules())
    settings = QuantSettings(calibration=case.calibration if calibrated else None,
                             example_inputs=case.example if synthetic else None)
    return encode(quant_section(case.model, graph, knowledge(), settings))  # type: ignore[no-any-return]


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b)[0])


@dataclass(frozen=True)
class Row:
    model: str
    format: str
    metric: str                     # of the true damage: "loss" or "distortion"
    layers: int
    truly_worst: str
    rho: dict[str, float]           # by fxlens score (`SCORES`)
    worst_first: dict[str, bool]
    # the pick is the worst or tied with it: the held-out rows cannot tell the two apart
    worst_or_tied: dict[str, bool]
    # the true damage of the layer fxlens ranks first ÷ the truly worst layer's (1: found)
    first_ratio: dict[str, float]


# Two layers are tied when the mean of their paired per-row damage difference is within this many
# standard errors of zero: the held-out sample cannot say which is worse (95 %, two-sided).
TIE_Z = 1.96


def tied(worst: torch.Tensor, other: torch.Tensor) -> bool:
    """`other`'s per-row damage is not significantly below `worst`'s on the same rows."""
    difference = worst - other
    spread = float(difference.std()) / math.sqrt(len(difference)) if len(difference) > 1 else 0.0
    return float(difference.mean()) <= TIE_Z * spread


def _damage_key(scores: dict[str, float | None], name: str) -> float:
    value = scores.get(name)
    return -math.inf if value is None else -float(value)     # None: exact, no damage


SCORES = ("calibrated", "fisher", "data-free", "prior", "combined")


def ranking_rows(case: Case, formats: Sequence[str] | None = None,
                 truth: dict[tuple[str, str], dict[str, torch.Tensor]] | None = None,
                 prior: dict[str, Any] | None = None) -> list[Row]:
    """One row per format (and truth metric): ρ and worst-first of each fxlens score (`SCORES`)
    against the true damage; `truth` and the weights-only `prior` section when already
    measured (one model ranked at several calibration sizes)."""
    section = fxlens_section(case)
    prior = prior or fxlens_section(case, calibrated=False, synthetic=False)
    formats = list(formats or section["formats"])
    truth = truth or true_damage(case, formats)
    by = {r["layer"]: r for r in section["layers"]}
    by_prior = {r["layer"]: r for r in prior["layers"]}
    rows = []
    for (fmt, metric), per_row in truth.items():
        if fmt not in formats:
            continue
        names = list(per_row)
        scores = {
            "calibrated": {n: by[n]["calibrated_score_db"].get(fmt) for n in names},
            "fisher": {n: -(by[n].get("fisher_damage") or {}).get(fmt, 0.0) for n in names},
            "data-free": {n: by[n]["data_free_sqnr_db"].get(fmt) for n in names},
            "prior": {n: by_prior[n]["data_free_sqnr_db"].get(fmt) for n in names},
            "combined": {n: (by[n].get("combined_score_db")
                             or by[n]["calibrated_score_db"]).get(fmt) for n in names},
        }
        rows.append(_row(case.name, fmt, metric, per_row, scores))
    return rows


def _row(model: str, fmt: str, metric: str, per_row: dict[str, torch.Tensor],
         scores: dict[str, dict[str, float | None]]) -> Row:
    names = list(per_row)
    damage = {n: float(per_row[n].mean()) for n in names}
    hurt = [damage[n] for n in names]
    worst = max(names, key=lambda n: damage[n])
    rho, first, close, ratio = {}, {}, {}, {}
    for kind, score in scores.items():
        keys = [_damage_key(score, n) for n in names]
        rho[kind] = spearman(keys, hurt)
        top = max(names, key=lambda n, s=score: _damage_key(s, n))
        first[kind] = damage[top] >= damage[worst]       # the worst, or exactly as bad
        close[kind] = first[kind] or tied(per_row[worst], per_row[top])
        ratio[kind] = damage[top] / damage[worst] if damage[worst] > 0 else 1.0
    return Row(model, fmt, metric, len(names), worst, rho, first, close, ratio)


def with_model(case: Case, model: nn.Module) -> Case:
    return replace(case, model=model)
