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

Activation statistics come from forward hooks on the layer modules
(`fxlens.analyzer.quant.activations`). NB: activations are fake-quantized with a dynamic
per-tensor scale (per batch), the scale a static calibration would pick for that batch;
embeddings' integer inputs are left alone.

`Calibration.score_db` is the measured value where a layer was measured at a format, else the
Fisher's prediction (`Calibration.evidence` says which). With ``activations`` or the
``agreement`` metric (which no Fisher predicts) every layer is measured. `Calibration.samples`
keeps what each calibration example carries of every measured damage, for its uncertainty
(`fxlens.analyzer.quant.samples`).

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
from fxlens.analyzer.quant.activations import ActivationStats, recorder
from fxlens.analyzer.quant.activations import stats as activation_stats
from fxlens.analyzer.quant.apply import Assignment, quantized
from fxlens.analyzer.quant.fisher import (
    MAX_EXAMPLES,
    Fisher,
    OutputModel,
    diagonal_fisher,
    split_examples,
)
from fxlens.analyzer.quant.samples import (
    Samples,
    example_power,
    example_sizes,
    per_example,
    row_examples,
)
from fxlens.analyzer.quant.types import NumberFormatLike, QuantKnowledge
from fxlens.analyzer.quant.weights import Layer, sqnr_db

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
    # what each calibration example carries of every measured pair's damage, in the metric
    # that ranks (`fxlens.analyzer.quant.samples`): the uncertainty of `score_db`
    samples: Samples | None = None


@dataclass(frozen=True)
class _Outputs:
    """One run over the batches: all floating outputs flat, and the logit leaves as rows."""

    flat: torch.Tensor
    logits: list[torch.Tensor]          # (rows, classes) per logit leaf per batch
    runs: Sequence[list[torch.Tensor]] = ()     # the output leaves per batch, as returned
    sizes: Sequence[int] = ()                   # examples per batch (`samples.example_sizes`)
    row_example: torch.Tensor | None = None     # the example of every logit row


def run_model(module: torch.nn.Module, inputs: Inputs) -> list[torch.Tensor]:
    """One forward; every floating-point output leaf, the very tensor objects the model
    returned (not detached: no grad is recorded, and `_logit_leaves` compares identities)."""
    with torch.no_grad():
        out = module(**inputs) if isinstance(inputs, dict) else module(*inputs)
    return [t for t in pytree.tree_leaves(plain_outputs(out))
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _collect(runs: Sequence[list[torch.Tensor]], logit_index: Sequence[frozenset[int]],
             sizes: Sequence[int] = ()) -> _Outputs:
    flat = [t.detach().float().flatten() for leaves in runs for t in leaves]
    logits = [t.detach().float().reshape(-1, t.shape[-1])
              for leaves, index in zip(runs, logit_index, strict=True)
              for i, t in enumerate(leaves) if i in index]
    counts = [[t.numel() // t.shape[-1] for i, t in enumerate(leaves) if i in index]
              for leaves, index in zip(runs, logit_index, strict=True)]
    return _Outputs(torch.cat(flat) if flat else torch.zeros(0), logits, runs, sizes,
                    row_examples(counts, sizes) if sizes else None)


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
        reference = _collect(runs, index, example_sizes(batches, runs))
        measured = _measure(module, layers, batches, knowledge, activations, chosen, index,
                            reference, on_step, score_format, metric)
    finally:
        module.train(was_training)
    score, evidence = _scores(measured, metric, layers, knowledge, fisher)
    logit_leaves = len(index[0]) if index else 0
    rows = measured.rows
    row_damage = (tuple(rows.tolist()) if rows is not None and logit_leaves
                  else fisher.per_example)
    return Calibration(len(batches), stats, measured.sqnr, metric, logit_leaves,
                       measured.kl if logit_leaves else {},
                       measured.agreement if logit_leaves else {}, score, fisher, evidence,
                       row_damage, _samples(measured, reference, metric))


def _scores(measured: _Measured, metric: str, layers: Sequence[Layer],
            knowledge: QuantKnowledge, fisher: Fisher
            ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, str]]]:
    """(the `metric` in dB per layer and format, "measured" or "fisher" behind each)."""
    by_metric = {
        "sqnr": measured.sqnr,
        "kl": {k: {f: damage_db(v) for f, v in row.items()} for k, row in measured.kl.items()},
        "agreement": {k: {f: damage_db(1.0 - v) for f, v in row.items()}
                      for k, row in measured.agreement.items()},
    }[metric]
    score: dict[str, dict[str, float]] = {}
    evidence: dict[str, dict[str, str]] = {}
    for layer in layers:
        score[layer.name], evidence[layer.name] = {}, {}
        for name in knowledge.formats:
            if name in by_metric.get(layer.name, {}):
                score[layer.name][name] = by_metric[layer.name][name]
                evidence[layer.name][name] = "measured"
            elif layer.name in fisher.damage:
                score[layer.name][name] = fisher.score_db(layer.name, name)
                evidence[layer.name][name] = "fisher"
    return score, evidence


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


@dataclass
class _Measured:
    """What `_measure` gathers: layer → format → value, and per example (`Samples`)."""

    sqnr: dict[str, dict[str, float]] = field(default_factory=dict)
    kl: dict[str, dict[str, float]] = field(default_factory=dict)
    agreement: dict[str, dict[str, float]] = field(default_factory=dict)
    rows: torch.Tensor | None = None    # KL per logit row at the score format, summed
    damage: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)
    capped: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)


def _measure(module: torch.nn.Module, layers: Sequence[Layer], batches: Sequence[Inputs],
             knowledge: QuantKnowledge, activations: bool, chosen: set[tuple[str, str]],
             index: Sequence[frozenset[int]], reference: _Outputs,
             on_step: Callable[[str], None], score_format: str, metric: str) -> _Measured:
    """(output SQNR, KL, top-1 agreement) per layer and format, for the chosen pairs; the
    KL per logit row at the score format (each layer's rows normalised to mean 1); what
    each example carries of the `metric`'s damage."""
    out = _Measured()
    done = 0
    for layer in layers:
        for name, fmt in knowledge.formats.items():
            if (layer.name, name) not in chosen:
                continue
            done += 1
            on_step(f"calibration {done}/{len(chosen)}: {layer.name or '(root)'} at {name}")
            act = (knowledge.activation_format(fmt) if activations
                   and layer.module_type not in knowledge.embedding_types else None)
            runs = _quantized_run(module, layer, fmt, act, batches)
            outputs = _collect(runs, index)
            out.sqnr.setdefault(layer.name, {})[name] = sqnr_db(reference.flat, outputs.flat)
            per_row = None
            if reference.logits:
                per_row, out.kl.setdefault(layer.name, {})[name], out.agreement.setdefault(
                    layer.name, {})[name] = softmax_damage(reference.logits, outputs.logits)
                if name == score_format:
                    normal = per_row / per_row.mean().clamp(min=1e-300)
                    out.rows = normal if out.rows is None else out.rows + normal
            _example_damage(out, (layer.name, name), metric, reference, runs, outputs, per_row)
    return out


def _example_damage(out: _Measured, pair: tuple[str, str], metric: str, reference: _Outputs,
                    runs: Sequence[list[torch.Tensor]], outputs: _Outputs,
                    per_row: torch.Tensor | None) -> None:
    """Each example's share of `pair`'s damage in the `metric` (`samples.Samples`)."""
    ids, count = reference.row_example, sum(reference.sizes)
    if metric == "sqnr" or per_row is None or ids is None:
        noise = example_power(reference.runs, reference.sizes, runs)
        out.damage[pair] = out.capped[pair] = noise
    elif metric == "agreement":
        flips = torch.cat([(z.argmax(-1) != zq.argmax(-1)).double()
                           for z, zq in zip(reference.logits, outputs.logits, strict=True)])
        out.damage[pair] = out.capped[pair] = per_example(flips, ids, count)
    else:
        top = int(len(per_row) * TAIL_SHARE)
        cap = per_row.kthvalue(len(per_row) - top).values if top else per_row.max()
        out.damage[pair] = per_example(per_row, ids, count)
        out.capped[pair] = per_example(per_row.clamp(max=cap), ids, count)


def _samples(measured: _Measured, reference: _Outputs, metric: str) -> Samples:
    count = sum(reference.sizes)
    kl_like = metric != "sqnr" and reference.row_example is not None and reference.logits
    weight = (per_example(torch.ones(len(reference.row_example)), reference.row_example, count)
              if kl_like and reference.row_example is not None
              else example_power(reference.runs, reference.sizes))
    return Samples(weight, measured.damage, measured.capped,
                   TAIL_FLOOR if kl_like and metric == "kl" else 0.0)


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
    with quantized([Assignment(layer, fmt, act)]):
        return [run_model(module, b) for b in batches]


def _reference(module: torch.nn.Module, layers: Sequence[Layer], batches: Sequence[Inputs],
               knowledge: QuantKnowledge
               ) -> tuple[list[list[torch.Tensor]], list[list[weakref.ref[torch.Tensor]]],
                          dict[str, ActivationStats]]:
    """(output leaves per batch, weak references to the linear heads' outputs per batch,
    activation statistics per layer)."""
    sums: dict[str, dict[str, Any]] = {layer.name: {} for layer in layers}
    heads: list[weakref.ref[torch.Tensor]] = []
    handles = [layer.module.register_forward_hook(recorder(sums[layer.name], layer))
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
    return runs, per_batch, {name: activation_stats(s) for name, s in sums.items() if s}


def _head_recorder(heads: list[weakref.ref[torch.Tensor]]) -> Callable[..., None]:
    """A hook keeping a weak reference to the layer's output (no memory held)."""
    def hook(_: torch.nn.Module, __: tuple[Any, ...], output: Any) -> None:
        if isinstance(output, torch.Tensor):
            heads.append(weakref.ref(output))
    return hook
