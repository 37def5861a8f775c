"""Second-order quantization damage: the diagonal Fisher, for every candidate and format at once.

The damage of moving the weights by Δw is, to second order, ``½·Δwᵀ F Δw`` with F the Fisher
information of the model's own output distribution; with F's diagonal (HAWQ, OBS-style),

    damage(layer, format) = ½ · Σ_i F_ii · Δw_i²,   Δw = Q(w) − w at that format,

and ``F_ii = E_x E_{y ~ p(y|x)} [(∂ log p(y|x) / ∂w_i)²]``. The labels y are *sampled from the
model's own output*, so no labels are needed, and one backward pass per example gives the
squared gradients of every weight: every layer and every format cost one pass over the data.
The output distribution read (`OutputModel`):

- ``kl``: a categorical over the class axis of the logit leaves, one label per row; the damage
  is then the expected ``KL(p ‖ p_quantized)`` per row, in nats, the quantity calibration
  measures (`fxlens.analyzer.quant.calibrated`);
- ``gaussian``: every floating output as a Gaussian of one variance for all examples; the
  damage is then ``½ · E[Σ(y − ŷ)²] / E[Σy²]``, i.e. output SQNR ``= −10·log10(2·damage)``,
  the noise power over the signal power of *all* examples, as calibration measures it. NB: each
  example is not normalised by its own power: a regression's outputs near zero would then
  weigh as much as its largest, and the score would be a mean relative error per example
  (before this was fixed, ½·Σ F·Δw² read 2·10² to 10⁴ × the measured noise power on the
  regression MLP of bench/README.md).

Examples: every batch is split along dim 0 when all its tensors share that size (a batch of B
examples → B backward passes), else used whole; at most `max_examples`, evenly spaced. NB:
with labels sampled independently per row, the cross terms of a whole batch's gradient have
zero mean, so batches are an unbiased (noisier) estimate where splitting is impossible.

`synthetic_batches` draws data-free inputs like the model's example inputs (same structure and
shapes, fresh values: floats from the example tensor's mean and std, integers resampled from the
example's own values); where the model has BatchNorms in eval mode, the float inputs are then
distilled so that every BatchNorm sees its running mean and variance (ZeroQ, Cai et al. 2020).

Known limitations: a weight read by no backward path (unused, or behind a non-differentiable
op) gets no Fisher and is reported as such; the diagonal ignores interactions inside a layer,
and second order under-reads errors large enough to flip decisions (the measured KL of the top
candidates covers those).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from fxlens.analyzer.capture.chain import plain_outputs
from fxlens.analyzer.quant.types import NumberFormatLike
from fxlens.analyzer.quant.weights import Layer

Inputs = tuple[Any, ...] | dict[str, Any]

MAX_EXAMPLES = 256
SYNTHETIC_ROWS = 16         # rows per synthetic batch (when the example has a batch axis)
WIDEN_MAX_ELEMENTS = 2**20  # NB: a larger example (long sequences, big images) is not widened
SYNTHETIC_BATCHES = 2
DISTILL_STEPS = 60          # NB: ZeroQ uses 500; the ranking settles far earlier on small nets
DISTILL_LR = 0.1


@dataclass(frozen=True)
class OutputModel:
    """How the output is read: ``kl`` (categorical over the logit leaves at `leaves`) or
    ``gaussian`` (every floating output leaf)."""

    kind: str
    leaves: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Fisher:
    """Per layer and format ``½·Σ F_ii·Δw_i²`` (module docstring); the unit is `kind`'s."""

    kind: str
    examples: int
    damage: dict[str, dict[str, float]]
    per_example: tuple[float, ...]      # each example's share of the score format's damage
    silent: tuple[str, ...]             # candidates no gradient reached

    def score_db(self, layer: str, fmt: str) -> float:
        """The damage as dB, higher safer: ``−10·log10(KL)``, or the predicted output SQNR."""
        value = self.damage.get(layer, {}).get(fmt, 0.0)
        value = 2 * value if self.kind == "gaussian" else value
        return math.inf if value <= 0 else -10 * math.log10(value)


def split_examples(batches: Sequence[Inputs], max_examples: int = MAX_EXAMPLES) -> list[Inputs]:
    """One input per example (module docstring), at most `max_examples`, evenly spaced."""
    out: list[Inputs] = []
    for batch in batches:
        tensors = [t for t in pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)]
        sizes = {t.shape[0] if t.dim() else -1 for t in tensors}
        size = sizes.pop() if len(sizes) == 1 else -1
        if size <= 1:
            out.append(batch)
            continue
        out += [pytree.tree_map(lambda t, i=i: t[i:i + 1] if isinstance(t, torch.Tensor)
                                else t, batch) for i in range(size)]
    if len(out) <= max_examples:
        return out
    step = len(out) / max_examples
    return [out[int(i * step)] for i in range(max_examples)]


def forward_leaves(module: nn.Module, inputs: Inputs) -> list[torch.Tensor]:
    """Every floating-point output leaf of one forward (grad recorded if enabled)."""
    out = module(**inputs) if isinstance(inputs, dict) else module(*inputs)
    return [t for t in pytree.tree_leaves(plain_outputs(out))
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _sampled_loss(leaves: Sequence[torch.Tensor], output: OutputModel, g: torch.Generator
                  ) -> tuple[torch.Tensor, float] | None:
    """(a loss whose gradient is ∂ log p(y|x) / ∂w for y drawn from the model's own output,
    this example's weight in the normaliser): ½ΔwᵀFΔw summed over examples and divided by
    the summed weights is the per-row KL (``kl``: weight 1, the loss already averaged over
    rows) or half the noise power over the signal power (``gaussian``: weight Σy²)."""
    if output.kind == "kl":
        rows = [t.reshape(-1, t.shape[-1]).float() for i, t in enumerate(leaves)
                if i in output.leaves]
        count = sum(r.shape[0] for r in rows)
        if not count:
            return None
        loss = torch.zeros(())
        for z in rows:
            logp = z.log_softmax(-1)
            y = torch.multinomial(logp.detach().exp(), 1, generator=g)
            loss = loss - logp.gather(1, y).sum()
        return loss / math.sqrt(count), 1.0
    flat = [t.float().flatten() for t in leaves]
    if not flat:
        return None
    y = torch.cat(flat)
    noise = torch.randn(y.shape, generator=g)
    return (noise * y).sum(), float(y.detach().double().pow(2).sum())


def diagonal_fisher(module: nn.Module, layers: Sequence[Layer], examples: Sequence[Inputs],
                    output: OutputModel, formats: dict[str, NumberFormatLike],
                    score_format: str, on_step: Callable[[str], None] = lambda _: None,
                    seed: int = 0) -> Fisher:
    """One backward per example with self-sampled labels; every layer and format scored."""
    layers = [layer for layer in layers if not layer.weight.is_meta]
    params = [layer.weight for layer in layers]
    score_fmt = formats.get(score_format) or next(iter(formats.values()))
    delta = [(layer.quantize(score_fmt).float() - layer.weight.detach().float()).pow(2)
             for layer in layers]
    squares = [torch.zeros_like(d) for d in delta]
    reached = [False] * len(layers)
    per_example: list[float] = []
    norm = 0.0                  # Σ of the examples' weights (`_sampled_loss`)
    g = torch.Generator().manual_seed(seed)
    with _frozen_in_eval(module):
        for weight in params:
            weight.requires_grad_(True)
        for k, example in enumerate(examples):
            if k % 16 == 0:
                on_step(f"Fisher {k + 1}/{len(examples)}: one backward per example")
            with torch.enable_grad():
                sampled = _sampled_loss(forward_leaves(module, example), output, g)
                if sampled is None or not sampled[0].requires_grad:
                    continue
                grads = torch.autograd.grad(sampled[0], params, allow_unused=True)
            norm += sampled[1]
            contribution = 0.0
            for i, grad in enumerate(grads):
                if grad is None:
                    continue
                square = grad.detach().float().pow(2)
                squares[i] += square
                reached[i] = reached[i] or bool(square.any())
                contribution += 0.5 * float((square * delta[i]).sum())
            per_example.append(contribution)
    n = norm if norm > 0 else 1.0
    damage = {}
    for layer, square in zip(layers, squares, strict=True):
        w = layer.weight.detach().float()
        damage[layer.name] = {name: 0.5 * float((square * (layer.quantize(fmt).float() - w)
                                                 .pow(2)).sum()) / n
                              for name, fmt in formats.items()}
    total = sum(per_example)
    return Fisher(output.kind, len(per_example), damage,
                  tuple(c / total for c in per_example) if total > 0 else (),
                  tuple(layer.name for layer, hit in zip(layers, reached, strict=True)
                        if not hit))


def top_share(shares: Sequence[float], fraction: float = 0.05) -> tuple[int, float]:
    """(k, share of the total held by the k largest examples), k the top `fraction` (≥ 1)."""
    if not shares:
        return 0, 0.0
    k = max(1, math.ceil(fraction * len(shares)))
    return k, sum(sorted(shares, reverse=True)[:k])


# --- synthetic inputs ------------------------------------------------------------------------


def synthetic_batches(module: nn.Module, example: Inputs, batch_norm_types: tuple[str, ...],
                      seed: int = 0, batches: int = SYNTHETIC_BATCHES) -> tuple[list[Inputs], bool]:
    """(data-free batches shaped like `example`, whether they were distilled from BatchNorm
    statistics) — see the module docstring."""
    g = torch.Generator().manual_seed(seed)
    drawn = [_draw(_widen(example), g) for _ in range(batches)]
    norms = [m for m in module.modules() if type(m).__name__ in batch_norm_types
             and getattr(m, "running_var", None) is not None and not m.training]
    floats = [t for b in drawn for t in pytree.tree_leaves(b)
              if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not norms or not floats:
        return drawn, False
    _distill(module, drawn, floats, norms)
    return [pytree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, b)
            for b in drawn], True


def _widen(example: Inputs) -> Inputs:
    """The example with SYNTHETIC_ROWS rows when all its tensors share a batch axis."""
    tensors = [t for t in pytree.tree_leaves(example) if isinstance(t, torch.Tensor)]
    sizes = {t.shape[0] if t.dim() else -1 for t in tensors}
    size = sizes.pop() if len(sizes) == 1 else -1
    reps = math.ceil(SYNTHETIC_ROWS / max(size, 1))
    if (size < 1 or size >= SYNTHETIC_ROWS
            or reps * sum(t.numel() for t in tensors) > WIDEN_MAX_ELEMENTS):
        return example
    return pytree.tree_map(lambda t: t.repeat(reps, *[1] * (t.dim() - 1))[:SYNTHETIC_ROWS]
                           if isinstance(t, torch.Tensor) else t, example)


def _draw(example: Inputs, g: torch.Generator) -> Inputs:
    def fresh(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.dtype == torch.bool:
            return t
        if t.is_floating_point():
            x = t.detach().float()
            std = float(x.std()) if x.numel() > 1 else 0.0
            std = std if std > 0 else 1.0
            return (torch.randn(t.shape, generator=g) * std + float(x.mean())).to(t.dtype)
        values = t.flatten()
        return values[torch.randint(values.numel(), t.shape, generator=g)]
    return pytree.tree_map(fresh, example)


def _distill(module: nn.Module, drawn: Sequence[Inputs], floats: Sequence[torch.Tensor],
             norms: Sequence[nn.Module]) -> None:
    """Move the float inputs until every BatchNorm's batch statistics match its running ones
    (ZeroQ's loss ``Σ ‖μ − μ_BN‖² + ‖σ − σ_BN‖²``)."""
    seen: list[tuple[nn.Module, torch.Tensor]] = []

    def hook(norm: nn.Module, args: tuple[Any, ...]) -> None:
        seen.append((norm, args[0]))
    handles = [m.register_forward_pre_hook(hook) for m in norms]
    for t in floats:
        t.requires_grad_(True)
    opt = torch.optim.Adam(list(floats), lr=DISTILL_LR)
    try:
        with _frozen_in_eval(module):
            for _ in range(DISTILL_STEPS):
                opt.zero_grad()
                loss = torch.zeros(())
                with torch.enable_grad():
                    for batch in drawn:
                        seen.clear()
                        forward_leaves(module, batch)
                        for norm, x in seen:
                            loss = loss + _bn_loss(norm, x)
                    if not loss.requires_grad:
                        return
                    loss.backward()
                opt.step()
    finally:
        for handle in handles:
            handle.remove()
        for t in floats:
            t.requires_grad_(False)


@contextlib.contextmanager
def _frozen_in_eval(module: nn.Module) -> Iterator[None]:
    """`module` in eval mode with no parameter requiring grad (the caller turns on the ones
    it differentiates); both put back as they were afterwards."""
    saved = [(p, p.requires_grad) for p in module.parameters()]
    was_training = module.training
    module.eval()
    try:
        for p, _ in saved:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in saved:
            p.requires_grad_(flag)
        module.train(was_training)


def _bn_loss(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    dims = [d for d in range(x.dim()) if d != 1]
    if x.dim() < 2 or x.numel() // max(x.shape[1], 1) < 2:
        return torch.zeros(())
    mean, var = x.float().mean(dims), x.float().var(dims, unbiased=False)
    running_mean, running_var = norm.running_mean, norm.running_var
    assert isinstance(running_mean, torch.Tensor) and isinstance(running_var, torch.Tensor)
    target_mean, target_std = running_mean.float(), running_var.float().sqrt()
    return ((mean - target_mean).pow(2).sum()
            + (var.clamp(min=1e-12).sqrt() - target_std).pow(2).sum())
