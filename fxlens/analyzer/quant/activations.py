"""Activation statistics of the calibration run: per layer, the input range and its outlier
channels, the output's max over std, from forward hooks on the layer modules.

NB: the design keeps module attribution of the *graph* off hooks (``nn_module_stack``); here
hooks see real tensors of a real run, which is what they are for. Input channels are the last
dim (linear) or dim 1 (conv).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fxlens.analyzer.quant.weights import OUTLIER_RATIO, Layer


@dataclass(frozen=True)
class ActivationStats:
    """One layer's input (and output) activations over the calibration batches."""

    input_absmax: float
    input_max_over_std: float
    outlier_channels: int            # input channels whose max|x| > OUTLIER_RATIO × median
    outlier_channel_share: float
    output_max_over_std: float


def recorder(acc: dict[str, Any], layer: Layer) -> Callable[..., None]:
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


def stats(acc: Mapping[str, Any]) -> ActivationStats:
    absmax, ratio = _ratio(acc.get("in"))
    _, out_ratio = _ratio(acc.get("out"))
    channels = acc.get("channel_absmax")
    outliers, share = 0, 0.0
    if channels is not None and channels.numel():
        flags = channels > OUTLIER_RATIO * channels.median().clamp(min=1e-30)
        outliers, share = int(flags.sum()), float(flags.float().mean())
    return ActivationStats(absmax, ratio, outliers, share, out_ratio)
