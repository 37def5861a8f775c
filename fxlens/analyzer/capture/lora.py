"""LoRA fine-tuning (``--lora R``): low-rank adapters trained beside a frozen model, the step
that PEFT, NeMo and Megatron-Bridge run when they fine-tune with LoRA (Hu et al. 2021,
arXiv:2106.09685).

Each targeted linear layer ``y = W x`` (an ``nn.Linear``, or GPT-2's ``Conv1D``) gains two
trainable matrices, A (in → R) and B (R → out), and computes ``y = W x + s · B(A x)`` with
s = alpha / R; every weight of the model is frozen.
The step then has no weight gradient for W (its backward still runs the input gradient for the
layers below), no gradient, master copy or optimizer state for the model's weights, and a
data-parallel reduction of the adapters' gradients only.

Targets (``targets``): the names of the linear layers to adapt, matched against the tail of
each module's path as PEFT matches ``target_modules`` (``q_proj`` adapts every ``….q_proj``,
``mlp.down_proj`` every ``….mlp.down_proj``); None adapts every linear layer but the output
head (PEFT's ``all-linear``) and those no wider than the rank (Mixtral's router, 8 outputs,
under rank 16); a named layer that narrow is refused.
Megatron's fused layers map to Hugging Face names as: ``linear_qkv`` → q_proj, k_proj, v_proj
(NB: one adapter there, three here: the A GEMMs read the input three times, 2·T·h·R FLOPs
each, under 1 % of a layer); ``linear_proj`` → o_proj; ``linear_fc1`` → gate_proj, up_proj;
``linear_fc2`` → down_proj. Experts stored as one 3-D weight (transformers' fused MoE
experts) are not ``nn.Linear`` and take no adapter. No dropout on the adapter's input (the
recipes' 0.0; a dropout would add one pointwise op per adapter).

`lora_attached(model, rank, targets)` adds the adapters for the length of a ``with`` block
(child modules ``lora_A`` and ``lora_B`` of each targeted layer, a forward hook adding their
output, the model's weights frozen) and takes them away after, every ``requires_grad`` restored:
the user's module is left as it was.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from fxlens.analyzer.capture.fp8_weights import fp8_weights
from fxlens.analyzer.capture.nf4 import nf4_bytes, nf4_weights
from fxlens.analyzer.core.errors import LoadError
from fxlens.checks import LORA_BASES, MAX_LORA_RANK

ALPHA = 32.0          # the scale s = ALPHA / rank: one multiply whatever its value

ADAPTER_A = ".lora.lora_A.weight"     # the name of an adapted layer's A matrix, under the layer


def adapted_layers(params: Iterable[Any]) -> int:
    """How many layers of a recorded step carry an adapter (params: with a ``name``)."""
    return sum(p.name.endswith(ADAPTER_A) for p in params)


def widths(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) of a linear layer: an ``nn.Linear``, or `transformers`' ``Conv1D`` (GPT-2's,
    its weight stored (in, out)); None for any other module."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[0]), int(weight.shape[1])
    return None


def targets_of(model: nn.Module, names: Sequence[str] | None) -> list[tuple[str, nn.Module]]:
    """The linear layers ``--lora`` adapts, in module order: those whose last name is one of
    `names`, or (None) every linear layer (`widths`) but the output head."""
    head_of = getattr(model, "get_output_embeddings", None)
    head = head_of() if callable(head_of) else None
    linears = [(path, m) for path, m in model.named_modules()
               if widths(m) is not None and m is not head]
    if names is None:
        if not linears:
            raise LoadError("--lora: the model has no linear layer to adapt")
        return linears
    unknown = [name for name in names if not any(_named(path, name) for path, _ in linears)]
    if unknown:
        leaf = sorted({path.rsplit(".", 1)[-1] for path, _ in linears})
        hint = difflib.get_close_matches(unknown[0].rsplit(".", 1)[-1], leaf, n=3)
        raise LoadError(f"--lora-targets: no linear layer named {unknown[0]!r}"
                        + (f" (did you mean {', '.join(hint)}?)" if hint else "")
                        + f"; the model's linear layers are named {_listed(leaf)}")
    return [(path, m) for path, m in linears if any(_named(path, name) for name in names)]


def _named(path: str, name: str) -> bool:
    """`path` is the module `name` names: the whole path or its dotted tail (PEFT's match)."""
    return path == name or path.endswith("." + name)


class Adapter(nn.Module):
    """A layer's two low-rank matrices and their scale: ``s · B(A x)``."""

    def __init__(self, layer: nn.Module, rank: int) -> None:
        super().__init__()
        weight, (width_in, width_out) = layer.get_parameter("weight"), _widths_of(layer)
        self.lora_A = nn.Linear(width_in, rank, bias=False, dtype=weight.dtype,
                                device=weight.device)
        self.lora_B = nn.Linear(rank, width_out, bias=False, dtype=weight.dtype,
                                device=weight.device)
        self.scaling = ALPHA / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The adapter's term in its own dtype: the input cast to it first, as PEFT casts it
        (T5 hands its ``wo`` bf16 inputs that a float32 adapter cannot multiply)."""
        return self.lora_B(self.lora_A(x.to(self.lora_A.weight.dtype))) * self.scaling


@contextlib.contextmanager
def lora_attached(model: nn.Module, rank: int, targets: Sequence[str] | None = None,
                  base: str | None = None) -> Iterator[nn.Module]:
    """`model` with rank-`rank` adapters on its `targets` and its own weights frozen, inside
    the ``with`` block; `base` ``"nf4"``: every linear layer but the head holds its weight
    in 4-bit NormalFloat (QLoRA, `fxlens.analyzer.capture.nf4`), ``"fp8"``: in FP8 alone
    (`fxlens.analyzer.capture.fp8_weights`)."""
    if base is not None and base not in LORA_BASES:
        raise LoadError(f"--lora-base {base!r}: one of {', '.join(LORA_BASES)}")
    if not 1 <= rank <= MAX_LORA_RANK:
        raise LoadError(f"--lora {rank}: the adapters' rank, 1 to {MAX_LORA_RANK:,}")
    layers = targets_of(model, targets)
    quantized = [m for _, m in targets_of(model, None)] if base else []
    if targets is None:   # every linear layer: those narrower than the rank (a router's) are left
        layers = [(p, m) for p, m in layers if rank < min(_widths_of(m))]
        if not layers:
            raise LoadError(f"--lora {rank}: not low rank for any linear layer of the model; "
                            "a rank under their widths")
    too_wide = next(((p, m) for p, m in layers if rank >= min(_widths_of(m))), None)
    if too_wide is not None:
        path, layer = too_wide
        width_in, width_out = _widths_of(layer)
        raise LoadError(f"--lora {rank}: not low rank for {path} ({width_in} → {width_out}); "
                        "a rank under both widths")
    trainable = {name: p.requires_grad for name, p in model.named_parameters()}
    adapters = [Adapter(layer, rank) for _, layer in layers]
    hooks = []
    for (_, layer), adapter in zip(layers, adapters, strict=True):
        layer.add_module("lora", adapter)
        hooks.append(layer.register_forward_hook(_add_adapter))
    mine = {id(p) for adapter in adapters for p in adapter.parameters()}
    for param in model.parameters():
        param.requires_grad_(id(param) in mine)
    try:
        with _stored(base, quantized):
            yield model
    finally:
        for hook in hooks:
            hook.remove()
        for _, layer in layers:
            del layer.lora
        for name, param in model.named_parameters():
            param.requires_grad_(trainable[name])


def nf4_note(model: nn.Module) -> str:
    """What the report says of a QLoRA step's 4-bit weights, which it holds as buffers."""
    weights = [m.get_parameter("weight").numel() for _, m in targets_of(model, None)]
    stored = sum(nf4_bytes(n) for n in weights)
    return (f"QLoRA: the weights of {len(weights):,} linear layers ({sum(weights):,} parameters) "
            f"held in NF4, {stored:,} bytes (4.127 bits each, double-quantized), as buffers: "
            "not in the parameter count")


def _stored(base: str | None, layers: list[nn.Module]) -> contextlib.AbstractContextManager[None]:
    """The frozen linear weights in `base`'s format for the ``with`` block."""
    if base == "nf4":
        return nf4_weights([(m, *_widths_of(m)) for m in layers])
    if base == "fp8":
        return fp8_weights([(m, not isinstance(m, nn.Linear)) for m in layers])
    return contextlib.nullcontext()


def _widths_of(layer: nn.Module) -> tuple[int, int]:
    found = widths(layer)
    assert found is not None, f"{type(layer).__name__} is no linear layer"
    return found


def _add_adapter(layer: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
    adapter = layer.get_submodule("lora")
    return (output + adapter(args[0])).to(output.dtype)


def _listed(names: list[str], most: int = 12) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")
