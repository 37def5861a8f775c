"""Calibrated quantization sensitivity: real forwards on real inputs.

`calibrate` runs the model (eval mode, no grad) on each calibration batch once for the
reference: per layer the input activation range and outlier channels, the output max/std, and
the model's outputs. Then one backward per calibration example gives the diagonal Fisher
(`fxlens.analyzer.quant.fisher`), which predicts every layer's damage at every format at once
in the units of the metric below (KL in nats, or output SQNR). Every layer is then measured
for real when layers × formats is at most `MEASURE_ALL_PAIRS`, else the `measure_top` layers the
Fisher finds most damaging at each format: only that layer's weight
is fake-quantized (and with ``activations`` its input too) and the damage to the outputs over
all batches is measured three ways:

- model-output SQNR ``10·log10(Σy² / Σ(y − ŷ)²)`` on every floating-point output leaf;
- on the *logit* leaves (below): the KL divergence ``KL(softmax(z) ‖ softmax(ẑ))`` in nats
  over every row of the last (class) dimension, averaged with its top 1 % of rows capped
  (`tail_capped_mean`, `TAIL_SHARE`), and the top-1 agreement (share of rows whose argmax is
  unchanged).

Which of them ranks the layers (`Calibration.score_db`, higher is safer) is the *metric*:

- ``sqnr``: the output SQNR;
- ``kl``: ``−10·log10(KL)`` — KL in dB, so that 10^(−dB/10) is again the damage;
- ``agreement``: ``−10·log10(1 − agreement)``, the top-1 flip rate in dB;
- ``auto`` (the default): ``kl`` when the model returns logits, else ``sqnr``.

Rule (``auto``): an output leaf is a *logit* leaf when it is the very tensor a linear layer
(`QuantKnowledge.logit_layer_types`: ``nn.Linear``, GPT-2's ``Conv1D``) returned, with no op
after it, and its last dimension has at least 2 entries: a classifier or LM head whose class
axis is last. Its consumer (argmax, softmax, cross-entropy) reads the output only through the
softmax, so the damage that matters is in that space: a layer can move the logits a lot (low
SQNR) without moving the argmax, and small shifts among near-tied logits flip it. Any other
output (embeddings, normalised or pooled outputs, regressions, images) is ranked by SQNR. With
the metric named explicitly (``kl``/``agreement``), every floating output leaf whose last
dimension has at least 2 entries is read as logits; if none has, SQNR is used.
NB: a linear head that regresses several values (not classes) is mistaken for logits by
``auto``; name ``sqnr`` for it. Every logit row counts, padding positions of a sequence model
included. Measured (bench/README.md): on a digits MLP the KL ranks the real int2 accuracy drop
at Spearman ρ 0.83–1.0 over six training seeds, the logit SQNR at 0.37–0.94; MiniLM's
embedding (SQNR) at 0.99. The precision plan keeps using the output SQNR.

Activation statistics come from forward hooks on the layer modules. NB: the design keeps module
attribution of the *graph* off hooks (``nn_module_stack``); here hooks see real tensors of a real
run, which is what they are for. Input channels are the last dim (linear) or dim 1 (conv).
NB: activations are fake-quantized with a dynamic per-tensor scale (per batch), the scale a
static calibration would pick for that batch; embeddings' integer inputs are left alone.

`Calibration.score_db` is the measured value where a layer was measured at a format, else the
Fisher's prediction (`Calibration.evidence` says which). With ``activations`` or the
``agreement`` metric (which no Fisher predicts) every layer is measured.

Cost: one forward and backward per example (at most `MAX_EXAMPLES`), plus
``layers × formats + 1`` forwards per batch up to `MEASURE_ALL_PAIRS` pairs, else
``measure_top × formats + 1``. Progress goes to `on_step` as
plain text (``calibration 3/40: fc1 at int8_per_channel``); drawing it is the caller's.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from fxlens.analyzer.capture.chain import plain_outputs
from fxlens.analyzer.quant.fisher import (
    MAX_EXAMPLES,
    Fisher,
    OutputModel,
    diagonal_fisher,
    split_examples,
)
from fxlens.analyzer.quant.types import NumberFormatLike, QuantKnowledge
from fxlens.analyzer.quant.weights import OUTLIER_RATIO, Layer, sqnr_db

# NB: the Fisher ranks every layer; the few it finds worst per format are measured for real,
# where second order under-reads large errors and where the ranking's top matters most.
MEASURE_TOP = 8
# NB: when every (layer, format) pair costs at most this many forwards over the calibration
# batches, all are measured and the Fisher ranks nothing: the measured damage is the quantity
# itself, the Fisher a diagonal second-order estimate of it (it under-reads structured errors,
# e.g. int4 rounding a whole down-scaled input column to zero: 5–11× on bench/README.md's
# regression MLP). Bigger models keep `MEASURE_TOP` per format, so their cost is unchanged.
MEASURE_ALL_PAIRS = 128
# NB: a confident classifier's KL sits on few rows, those near a decision boundary: most rows'
# KL is ~0 and a handful carry the mean, so which handful the calibration drew reorders the
# top of the ranking. The measured KL is a winsorized mean — the top 1 % of rows capped at the
# value below them — which cuts that noise; the floor keeps a layer whose damage truly lives in
# a few rows from reading more than 2× (3 dB) safer than its plain mean. Measured
# (bench/README.md, 160 rows of 5 trained models × 8 seeds): the calibrated pick is the
# held-out worst in 144 rows against 139 with the plain mean (5 gained, none lost); over 200
# re-splits of the same rows (bench/quant_split_noise.py) 90.2 % against 89.3 % expected.
TAIL_SHARE = 0.01
TAIL_FLOOR = 0.5

Inputs = tuple[Any, ...] | dict[str, Any]


@dataclass(frozen=True)
class ActivationStats:
    """One layer's input (and output) activations over the calibration batches."""

    input_absmax: float
    input_max_over_std: float
    outlier_channels: int            # input channels whose max|x| > OUTLIER_RATIO × median
    outlier_channel_share: float
    output_max_over_std: float


METRICS = ("auto", "sqnr", "kl", "agreement")


@dataclass(frozen=True)
class Calibration:
    """What calibration measured; every mapping is layer → format → value."""

    batches: int
    activations: Mapping[str, ActivationStats]
    output_sqnr_db: Mapping[str, Mapping[str, float]]
    metric: str = "sqnr"                 # what `score_db` is: "sqnr", "kl" or "agreement"
    logit_leaves: int = 0                # output leaves read as logits (0: no KL, no agreement)
    output_kl: Mapping[str, Mapping[str, float]] = field(default_factory=dict)      # nats
    top1_agreement: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # 0…1
    score_db: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # ranks; ↑ safer
    fisher: Fisher | None = None
    evidence: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # measured|fisher
    # each calibration row's share of the damage at the score format (measured KL per logit
    # row, each measured layer weighing alike; else the Fisher per example): health checks
    row_damage: tuple[float, ...] = ()


@dataclass(frozen=True)
class _Outputs:
    """One run over the batches: all floating outputs flat, and the logit leaves as rows."""

    flat: torch.Tensor
    logits: list[torch.Tensor]          # (rows, classes) per logit leaf per batch


def run_model(module: torch.nn.Module, inputs: Inputs) -> list[torch.Tensor]:
    """One forward; every floating-point output leaf, the very tensor objects the model
    returned (not detached: no grad is recorded, and `_logit_leaves` compares identities)."""
    with torch.no_grad():
        out = module(**inputs) if isinstance(inputs, dict) else module(*inputs)
    return [t for t in pytree.tree_leaves(plain_outputs(out))
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _collect(runs: Sequence[list[torch.Tensor]], logit_index: Sequence[frozenset[int]]
             ) -> _Outputs:
    flat = [t.detach().float().flatten() for leaves in runs for t in leaves]
    logits = [t.detach().float().reshape(-1, t.shape[-1])
              for leaves, index in zip(runs, logit_index, strict=True)
              for i, t in enumerate(leaves) if i in index]
    return _Outputs(torch.cat(flat) if flat else torch.zeros(0), logits)


def softmax_damage(reference: Sequence[torch.Tensor], quantized: Sequence[torch.Tensor]
                   ) -> tuple[torch.Tensor, float, float]:
    """(KL(softmax(z) ‖ softmax(ẑ)) of every logit row in nats, their `tail_capped_mean`,
    top-1 agreement) over every logit row."""
    per_row = row_kl(reference, quantized)
    agree = sum(float((z.argmax(-1) == zq.argmax(-1)).sum())
                for z, zq in zip(reference, quantized, strict=True))
    return per_row, tail_capped_mean(per_row), agree / max(len(per_row), 1)


def tail_capped_mean(rows: torch.Tensor) -> float:
    """The rows' mean with the top `TAIL_SHARE` of them capped at the value below them (a
    winsorized mean), never under `TAIL_FLOOR` × the plain mean; the plain mean when there
    are fewer than 1 / `TAIL_SHARE` rows."""
    mean = float(rows.mean()) if len(rows) else 0.0
    top = int(len(rows) * TAIL_SHARE)
    if top == 0:
        return mean
    cap = rows.kthvalue(len(rows) - top).values
    return max(float(rows.clamp(max=cap).mean()), TAIL_FLOOR * mean)


def damage_db(damage: float) -> float:
    """``−10·log10(damage)``: a damage in [0, ∞) as dB, higher is safer; +inf when none."""
    return math.inf if damage <= 0.0 else -10 * math.log10(damage)


def calibrate(module: torch.nn.Module, layers: Sequence[Layer], batches: Iterable[Inputs],
              knowledge: QuantKnowledge, activations: bool = False,
              on_step: Callable[[str], None] = lambda _: None, metric: str = "auto",
              score_format: str = "", measure_top: int | None = MEASURE_TOP,
              max_examples: int = MAX_EXAMPLES) -> Calibration:
    """Reference forwards, the Fisher over every example, then one forward per measured layer
    and format with that layer quantized (`measure_top` per format; None: every layer).

    `metric` (`METRICS`) picks the damage measure that `Calibration.score_db` ranks by; see
    the module docstring for the ``auto`` rule.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown calibration metric {metric!r}; known: {', '.join(METRICS)}")
    batches = list(batches)
    was_training = module.training
    module.eval()
    try:
        on_step("calibration: reference forwards")
        runs, heads, stats = _reference(module, layers, batches, knowledge)
        index = [_logit_leaves(leaves, head, metric == "auto")
                 for leaves, head in zip(runs, heads, strict=True)]
        if metric == "auto" or not any(index):
            metric = "kl" if metric == "auto" and any(index) else "sqnr"
        output = (OutputModel("kl", index[0]) if metric != "sqnr" and index
                  else OutputModel("gaussian"))
        fisher = diagonal_fisher(module, layers, split_examples(batches, max_examples), output,
                                 dict(knowledge.formats), score_format, on_step)
        if activations or metric == "agreement":
            measure_top = None
        chosen = _to_measure(fisher, layers, knowledge.formats, measure_top)
        score_format = score_format if score_format in knowledge.formats else next(
            iter(knowledge.formats))
        sqnr, kl, agreement, rows = _measure(module, layers, batches, knowledge, activations,
                                             chosen, index, _collect(runs, index), on_step,
                                             score_format)
    finally:
        module.train(was_training)
    measured = {
        "sqnr": sqnr,
        "kl": {k: {f: damage_db(v) for f, v in row.items()} for k, row in kl.items()},
        "agreement": {k: {f: damage_db(1.0 - v) for f, v in row.items()}
                      for k, row in agreement.items()},
    }[metric]
    score: dict[str, dict[str, float]] = {}
    evidence: dict[str, dict[str, str]] = {}
    for layer in layers:
        score[layer.name], evidence[layer.name] = {}, {}
        for name in knowledge.formats:
            if name in measured.get(layer.name, {}):
                score[layer.name][name] = measured[layer.name][name]
                evidence[layer.name][name] = "measured"
            elif layer.name in fisher.damage:
                score[layer.name][name] = fisher.score_db(layer.name, name)
                evidence[layer.name][name] = "fisher"
    logit_leaves = len(index[0]) if index else 0
    row_damage = (tuple(rows.tolist()) if rows is not None and logit_leaves
                  else fisher.per_example)
    return Calibration(len(batches), stats, sqnr, metric, logit_leaves,
                       kl if logit_leaves else {}, agreement if logit_leaves else {}, score,
                       fisher, evidence, row_damage)


def _to_measure(fisher: Fisher, layers: Sequence[Layer], formats: Mapping[str, Any],
                top: int | None) -> set[tuple[str, str]]:
    """(layer, format) pairs to measure: all of them when there are at most
    `MEASURE_ALL_PAIRS` (or `top` is None), else the `top` worst by the Fisher per format."""
    live = [layer.name for layer in layers if not layer.weight.is_meta]
    if top is None or len(live) * len(formats) <= MEASURE_ALL_PAIRS:
        return {(name, fmt) for name in live for fmt in formats}
    chosen = set()
    for fmt in formats:
        ranked = sorted(live, key=lambda n: fisher.score_db(n, fmt))
        chosen |= {(name, fmt) for name in ranked[:top]}
    return chosen


def _measure(module: torch.nn.Module, layers: Sequence[Layer], batches: Sequence[Inputs],
             knowledge: QuantKnowledge, activations: bool, chosen: set[tuple[str, str]],
             index: Sequence[frozenset[int]], reference: _Outputs,
             on_step: Callable[[str], None], score_format: str
             ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]],
                        dict[str, dict[str, float]], torch.Tensor | None]:
    """(output SQNR, KL, top-1 agreement) per layer and format, for the chosen pairs, and
    the KL per logit row at the score format (each layer's rows normalised to mean 1)."""
    sqnr: dict[str, dict[str, float]] = {}
    kl: dict[str, dict[str, float]] = {}
    agreement: dict[str, dict[str, float]] = {}
    rows: torch.Tensor | None = None
    done = 0
    for layer in layers:
        for name, fmt in knowledge.formats.items():
            if (layer.name, name) not in chosen:
                continue
            done += 1
            on_step(f"calibration {done}/{len(chosen)}: {layer.name or '(root)'} at {name}")
            act = (knowledge.activation_format(fmt) if activations
                   and layer.module_type not in knowledge.embedding_types else None)
            outputs = _collect(_quantized_run(module, layer, fmt, act, batches), index)
            sqnr.setdefault(layer.name, {})[name] = sqnr_db(reference.flat, outputs.flat)
            if reference.logits:
                per_row, kl.setdefault(layer.name, {})[name], agreement.setdefault(
                    layer.name, {})[name] = softmax_damage(reference.logits, outputs.logits)
                if name == score_format:
                    per_row = per_row / per_row.mean().clamp(min=1e-300)
                    rows = per_row if rows is None else rows + per_row
    return sqnr, kl, agreement, rows


def row_kl(reference: Sequence[torch.Tensor], quantized: Sequence[torch.Tensor]
           ) -> torch.Tensor:
    """KL(softmax(z) ‖ softmax(ẑ)) of every logit row, in nats (float64)."""
    out = [(p.exp() * (p - q)).sum(-1).clamp(min=0)
           for p, q in ((z.double().log_softmax(-1), zq.double().log_softmax(-1))
                        for z, zq in zip(reference, quantized, strict=True))]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def output_model(module: torch.nn.Module, layers: Sequence[Layer], batch: Inputs,
                 knowledge: QuantKnowledge) -> tuple[str, OutputModel]:
    """(metric, how the Fisher reads the output) by the ``auto`` rule, from one forward."""
    runs, heads, _ = _reference(module, layers, [batch], knowledge)
    index = _logit_leaves(runs[0], heads[0], True)
    return ("kl", OutputModel("kl", index)) if index else ("sqnr", OutputModel("gaussian"))


def _logit_leaves(leaves: Sequence[torch.Tensor], heads: Sequence[weakref.ref[torch.Tensor]],
                  auto: bool) -> frozenset[int]:
    """Indices of the output leaves read as logits (module docstring: the ``auto`` rule)."""
    return frozenset(
        i for i, t in enumerate(leaves)
        if t.dim() >= 1 and t.shape[-1] >= 2
        and (not auto or any(ref() is t for ref in heads)))


def _quantized_run(module: torch.nn.Module, layer: Layer, fmt: NumberFormatLike,
                   act: NumberFormatLike | None, batches: Sequence[Inputs]
                   ) -> list[list[torch.Tensor]]:
    weight = layer.weight
    original = weight.data
    handle = None
    if act is not None:
        def quantize_input(_: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
            first = args[0]
            if isinstance(first, torch.Tensor) and first.is_floating_point():
                return (act.fake_quantize(first.reshape(1, -1), 0).reshape(first.shape),
                        *args[1:])
            return args
        handle = layer.module.register_forward_pre_hook(quantize_input)
    try:
        weight.data = layer.quantize(fmt)
        return [run_model(module, b) for b in batches]
    finally:
        weight.data = original
        if handle is not None:
            handle.remove()


def _reference(module: torch.nn.Module, layers: Sequence[Layer], batches: Sequence[Inputs],
               knowledge: QuantKnowledge
               ) -> tuple[list[list[torch.Tensor]], list[list[weakref.ref[torch.Tensor]]],
                          dict[str, ActivationStats]]:
    """(output leaves per batch, weak references to the linear heads' outputs per batch,
    activation statistics per layer)."""
    sums: dict[str, dict[str, Any]] = {layer.name: {} for layer in layers}
    heads: list[weakref.ref[torch.Tensor]] = []
    handles = [layer.module.register_forward_hook(_recorder(sums[layer.name], layer))
               for layer in layers]
    handles += [layer.module.register_forward_hook(_head_recorder(heads)) for layer in layers
                if layer.module_type in knowledge.logit_layer_types]
    runs, per_batch = [], []
    try:
        for batch in batches:
            heads.clear()
            runs.append(run_model(module, batch))
            per_batch.append(list(heads))
    finally:
        for handle in handles:
            handle.remove()
    return runs, per_batch, {name: _stats(s) for name, s in sums.items() if s}


def _head_recorder(heads: list[weakref.ref[torch.Tensor]]) -> Callable[..., None]:
    """A hook keeping a weak reference to the layer's output (no memory held)."""
    def hook(_: torch.nn.Module, __: tuple[Any, ...], output: Any) -> None:
        if isinstance(output, torch.Tensor):
            heads.append(weakref.ref(output))
    return hook


def _recorder(acc: dict[str, Any], layer: Layer) -> Callable[..., None]:
    channel_dim = 1 if "Conv" in layer.module_type and layer.module_type != "Conv1D" else -1

    def hook(_: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() >= 1:
            x = x.detach().float()
            channels = x.movedim(channel_dim, 0).reshape(x.shape[channel_dim], -1).abs()
            prev = acc.get("channel_absmax")
            current = channels.amax(dim=1)
            acc["channel_absmax"] = current if prev is None else torch.maximum(prev, current)
            _moments(acc, "in", x)
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            _moments(acc, "out", output.detach().float())
    return hook


def _moments(acc: dict[str, Any], key: str, x: torch.Tensor) -> None:
    n, s, s2, m = acc.get(key, (0, 0.0, 0.0, 0.0))
    acc[key] = (n + x.numel(), s + float(x.sum()), s2 + float((x * x).sum()),
                max(m, float(x.abs().max())) if x.numel() else m)


def _ratio(moments: tuple[int, float, float, float] | None) -> tuple[float, float]:
    """(absmax, absmax / std) from accumulated moments."""
    if not moments or moments[0] == 0:
        return 0.0, 0.0
    n, s, s2, m = moments
    std = math.sqrt(max(s2 / n - (s / n) ** 2, 1e-30))
    return m, m / std


def _stats(acc: Mapping[str, Any]) -> ActivationStats:
    absmax, ratio = _ratio(acc.get("in"))
    _, out_ratio = _ratio(acc.get("out"))
    channels = acc.get("channel_absmax")
    outliers, share = 0, 0.0
    if channels is not None and channels.numel():
        flags = channels > OUTLIER_RATIO * channels.median().clamp(min=1e-30)
        outliers, share = int(flags.sum()), float(flags.float().mean())
    return ActivationStats(absmax, ratio, outliers, share, out_ratio)
