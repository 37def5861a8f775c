"""Multi-token prediction (MTP) trained beside a causal LM, as DeepSeek-V3 trains it
(``--mtp N``): the step a recipe with ``mtp_num_layers`` runs, which `transformers` never
builds (it skips the checkpoint's MTP weights).

Depth k (1 … N) predicts the token k + 1 ahead (DeepSeek-V3 technical report, §2.2,
arXiv:2412.19437; Megatron-Core's ``MultiTokenPredictionBlock``): the previous depth's hidden
states (depth 1: what enters the decoder's final norm) and the embeddings of
the tokens shifted by k, each RMS-normed, concatenated and projected from 2·hidden back to
hidden, run through a transformer layer of the model's own kind, normed, and read out by the
model's shared output head into one more cross-entropy added to the loss. The embedding and the
head are the model's (shared, no new weights); each depth owns two input norms, the
projection, its layer and its final norm.

The layer of a depth is a copy of the decoder's last layer, or, where the config lists the
MTP layer's block kinds (``mtp_layers_block_type``: Nemotron 3's attention then MoE), a copy of
the decoder's last layer of each kind in turn. ``shared``: one depth's weights run N times
(Megatron-Bridge's Nemotron 3 recipes, ``mtp_use_repeated_layer``).

`mtp_attached(model, depths, shared)` adds the depths to the model for the length of a
``with`` block (a child module ``mtp`` and a forward hook adding their losses to the model's)
and takes them away after: the user's module is left as it was. NB: the loss weight (0.1 in
DeepSeek-V3, 0.3 in Nemotron 3) scales gradients, not work, so every depth's loss is added
as is.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from fxlens.analyzer.core.errors import LoadError

# the names configs give the MTP layers they declare (DeepSeek-V3, GLM, Nemotron 3; Qwen3-Next)
DECLARED = ("num_nextn_predict_layers", "num_mtp_layers", "mtp_num_hidden_layers")
LAYER_LISTS = ("layers", "h", "blocks")                        # Llama …, GPT-2, others
FINAL_NORMS = ("norm", "norm_f", "final_layernorm", "ln_f")     # Llama …, NemotronH, Phi, GPT-2


class MTPDepth(nn.Module):
    """One prediction depth: input norms, the 2·hidden → hidden projection, the layers, the
    final norm (`layers` run in order with the keyword arguments the decoder gave each kind)."""

    def __init__(self, norm: nn.Module, layers: list[nn.Module], hidden: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.hidden_norm = copy.deepcopy(norm)
        self.embedding_norm = copy.deepcopy(norm)
        self.projection = nn.Linear(2 * hidden, hidden, bias=False, dtype=dtype, device=device)
        self.layers = nn.ModuleList(layers)
        self.final_norm = copy.deepcopy(norm)

    def forward(self, hidden: torch.Tensor, embedded: torch.Tensor,
                layer_kwargs: list[dict[str, Any]]) -> torch.Tensor:
        x = self.projection(torch.cat([self.hidden_norm(hidden),
                                       self.embedding_norm(embedded)], dim=-1))
        for layer, kwargs in zip(self.layers, layer_kwargs, strict=True):
            out = layer(x, **kwargs)
            x = out[0] if isinstance(out, tuple) else out
        return x


@contextlib.contextmanager
def mtp_attached(model: Any, depths: int, shared: bool = False) -> Iterator[Any]:
    """`model` training `depths` MTP depths beside its own loss, inside the ``with`` block."""
    if depths < 1:
        raise LoadError(f"--mtp {depths}: at least one prediction depth")
    layers, norm = _parts(model)
    originals = _depth_layers(model, layers)
    weight = next(originals[0].parameters())
    built = [MTPDepth(norm, [copy.deepcopy(layer) for layer in originals],
                      model.config.hidden_size, weight.dtype, weight.device)
             for _ in range(1 if shared else depths)]
    seen: dict[int, dict[str, Any]] = {}
    hidden: list[torch.Tensor] = []
    hooks = [layer.register_forward_pre_hook(_keep_kwargs(seen, i), with_kwargs=True)
             for i, layer in enumerate(originals)]
    hooks.append(norm.register_forward_pre_hook(lambda _m, args: hidden.append(args[0])))
    model.add_module("mtp", nn.ModuleList(built))

    def add_losses(_module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                   output: Any) -> Any:
        ids, labels = kwargs.get("input_ids"), kwargs.get("labels")
        loss = getattr(output, "loss", None)
        if ids is None or labels is None or loss is None or not hidden:
            raise LoadError("--mtp: the model must be a causal LM trained on input_ids and "
                            "labels (an hf: preset, or a transformers model given labels)")
        state = hidden[-1]
        layer_kwargs = [seen[i] for i in range(len(originals))]
        for k in range(depths):
            # the tokens k ahead, rolled: the wrapped tail costs what a masked one would
            ids, labels = torch.roll(ids, -1, dims=1), torch.roll(labels, -1, dims=1)
            depth = built[0 if shared else k]
            state = depth(state, model.get_input_embeddings()(ids), layer_kwargs)
            logits = model.get_output_embeddings()(depth.final_norm(state))
            loss = loss + model.loss_function(logits=logits, labels=labels,
                                              vocab_size=model.config.vocab_size)
        output.loss = loss
        return output

    hooks.append(model.register_forward_hook(add_losses, with_kwargs=True))
    try:
        yield model
    finally:
        for hook in hooks:
            hook.remove()
        del model.mtp
        hidden.clear()


def _parts(model: Any) -> tuple[nn.ModuleList, nn.Module]:
    """The decoder's layer list and final norm, as `transformers` causal LMs name them."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = next((getattr(decoder, name) for name in LAYER_LISTS
                   if isinstance(getattr(decoder, name, None), nn.ModuleList)), None)
    norm = next((getattr(decoder, name) for name in FINAL_NORMS
                 if isinstance(getattr(decoder, name, None), nn.Module)), None)
    if (not isinstance(layers, nn.ModuleList) or not len(layers) or norm is None
            or not hasattr(model, "get_output_embeddings") or not hasattr(model, "config")):
        raise LoadError("--mtp: needs a transformers causal LM (a decoder with a layer list "
                        f"and a final norm); {type(model).__name__} is not one")
    return layers, norm


def _depth_layers(model: Any, layers: nn.ModuleList) -> list[nn.Module]:
    """The decoder layers a depth copies: the last of each kind the config's MTP lists, else
    the last layer."""
    config = model.config
    kinds = getattr(config, "mtp_layers_block_type", None)
    of_layer = getattr(config, "layers_block_type", None) or getattr(config, "layer_types", None)
    if not kinds or not of_layer:
        return [layers[-1]]
    chosen = []
    for kind in kinds:
        last = next((i for i in reversed(range(len(layers))) if of_layer[i] == kind), None)
        if last is None:
            raise LoadError(f"--mtp: the config's MTP layer kind {kind!r} is none of the "
                            "decoder's layers")
        chosen.append(layers[last])
    return chosen


def _keep_kwargs(seen: dict[int, dict[str, Any]], index: int) -> Any:
    def keep(_module: nn.Module, _args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen[index] = dict(kwargs)
    return keep


def declared_depths(model: Any) -> int:
    """The MTP layers `model`'s config declares (0: none or no config)."""
    config = getattr(model, "config", None)
    for name in DECLARED:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return max(value, 0)
    return 0


def untrained_note(model: Any, depths: int) -> str | None:
    """What a step without ``--mtp`` leaves out when the config declares MTP layers."""
    declared = declared_depths(model)
    if depths or not declared:
        return None
    layers = "layer" if declared == 1 else "layers"
    return (f"the config declares {declared} multi-token prediction {layers}, which "
            f"transformers does not build: not in this step (--mtp {declared} trains "
            f"{'it' if declared == 1 else 'them'} beside the LM)")
