"""One Megatron-core MoE layer as NVIDIA's MoE layer performance test builds it, for
`bench/moe_layer.py` (``analyze bench/plan_runs/megatron_moe_layer.py --entry mixtral|deepseek``).

Megatron-LM's ``tests/functional_tests/test_cases/common/moe_perf`` times one ``MoELayer``
(Transformer Engine submodules, grouped GEMM experts) forward and backward on 8 H100s at
expert parallelism 8, over 4,096 tokens per GPU (sequence 4,096, micro-batch 1), in bf16
parameters, and keeps the timings in ``baseline.json``. Its two proxies, as
``test_cases.py`` and ``__main__.py`` configure them:

- ``MIXTRAL_PROXY``: hidden 4,096, expert FFN 14,336, 8 experts, top-2, softmax scores.
- ``DEEPSEEK_PROXY``: hidden 7,168, expert FFN 2,048, 32 experts, top-8, sigmoid scores with
  an expert bias, group-limited routing (8 groups, 4 per token), a shared expert of 2,048.

Both run the layer's defaults where the test sets nothing: no gated linear unit (each expert
is fc1 → GELU → fc2, Megatron's ``activation_func`` default), no biases (``add_bias_linear``
False), the router's logits in float32 (``moe_router_dtype`` "fp32"), the routing forced to
balance (``moe_router_force_load_balancing``: random logits into the top-k), the routed
probabilities applied to the activation's output before fc2 (``TEGroupedMLP``'s
``bias_act_func``), the experts' output rows summed back into their tokens.

Written as fxlens recognises a MoE: the experts as 3-D weights under a module named
``experts`` run by ``torch._grouped_mm`` over the rows sorted by expert, the router as a
module owning one weight row per expert. Megatron's auxiliary load-balancing loss (a few
element-wise ops over tokens × experts) is left out.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SEQUENCE, MICRO_BATCH = 4096, 1


class Router(nn.Module):
    """Scores in float32; top-k experts per token (group-limited where `groups` > 1)."""

    def __init__(self, hidden: int, experts: int, top_k: int, sigmoid: bool,
                 groups: int = 1, groups_per_token: int = 1) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(experts, hidden) * hidden ** -0.5)
        self.expert_bias = nn.Parameter(torch.zeros(experts), requires_grad=False)
        self.top_k, self.sigmoid = top_k, sigmoid
        self.groups, self.groups_per_token = groups, groups_per_token

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x.float(), self.weight.float())
        if not self.sigmoid:    # top-k of the logits, then softmax over the chosen
            top, chosen = logits.topk(self.top_k, dim=-1)
            return top.softmax(-1), chosen
        scores = logits.sigmoid()
        biased = scores + self.expert_bias
        if self.groups > 1:     # keep the best groups (each scored by its best two experts)
            tokens, experts = biased.shape
            grouped = biased.view(tokens, self.groups, experts // self.groups)
            group_scores = grouped.topk(2, dim=-1).values.sum(-1)
            kept = group_scores.topk(self.groups_per_token, dim=-1).indices
            mask = torch.zeros_like(group_scores).scatter(1, kept, 1.0)
            biased = biased.masked_fill(
                mask.repeat_interleave(experts // self.groups, dim=1) == 0, float("-inf"))
        chosen = biased.topk(self.top_k, dim=-1).indices
        probs = scores.gather(1, chosen)
        return probs / probs.sum(-1, keepdim=True), chosen


class GroupedExperts(nn.Module):
    """Every expert's fc1 → GELU → fc2 over rows sorted by expert (`offsets`: their ends)."""

    def __init__(self, experts: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Parameter(torch.randn(experts, hidden, ffn) * hidden ** -0.5)
        self.fc2 = nn.Parameter(torch.randn(experts, ffn, hidden) * ffn ** -0.5)

    def forward(self, rows: torch.Tensor, offsets: torch.Tensor,
                probs: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(torch._grouped_mm(rows, self.fc1, offs=offsets))
        return torch._grouped_mm(hidden * probs[:, None].to(rows.dtype), self.fc2, offs=offsets)


class Permute(torch.autograd.Function):
    """Each token's row once per chosen expert, sorted by expert (`tokens`: whose row each
    is); its gradient sums a token's rows back — what Transformer Engine's fused
    ``moe_permute`` does (``moe_permute_fusion``), both ways a gather."""

    @staticmethod
    def forward(ctx: Any, flat: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(tokens.argsort())
        ctx.top_k = tokens.numel() // flat.shape[0]
        return flat[tokens]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (back,) = ctx.saved_tensors
        return grad[back].view(-1, ctx.top_k, grad.shape[-1]).sum(1), None


class Unpermute(torch.autograd.Function):
    """Each token's expert rows summed back into it (`order`: the rows' order by expert);
    its gradient hands each row its token's gradient — ``moe_unpermute``, both ways a
    gather."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, order: torch.Tensor, top_k: int) -> torch.Tensor:
        ctx.save_for_backward(order)
        ctx.top_k = top_k
        return rows[order.argsort()].view(-1, top_k, rows.shape[-1]).sum(1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (order,) = ctx.saved_tensors
        return grad[order // ctx.top_k], None, None


class MoELayer(nn.Module):
    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int, sigmoid: bool = False,
                 groups: int = 1, groups_per_token: int = 1, shared: int = 0) -> None:
        super().__init__()
        self.router = Router(hidden, experts, top_k, sigmoid, groups, groups_per_token)
        self.experts = GroupedExperts(experts, hidden, ffn)
        self.shared_experts = (nn.Sequential(nn.Linear(hidden, shared, bias=False), nn.GELU(),
                                             nn.Linear(shared, hidden, bias=False))
                               if shared else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:     # (sequence, batch, hidden)
        flat = x.reshape(-1, x.shape[-1])
        probs, chosen = self.router(flat)
        order = chosen.flatten().argsort(stable=True)
        tokens = order // chosen.shape[1]
        counts = torch.bincount(chosen.flatten(), minlength=self.experts.fc1.shape[0])
        offsets = counts.cumsum(0).to(torch.int32)
        out = self.experts(Permute.apply(flat, tokens), offsets, probs.flatten()[order])
        y = Unpermute.apply(out, order, chosen.shape[1])
        if self.shared_experts is not None:
            y = y + self.shared_experts(flat)
        return y.view_as(x)


class OneLayer(nn.Module):
    """The layer as the only block of a model (fxlens plans blocks)."""

    def __init__(self, layer: MoELayer) -> None:
        super().__init__()
        self.layers = nn.ModuleList([layer])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[0](x)


def _built(hidden: int, **layer: Any) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """On the meta device: shapes without weights (DeepSeek's 32 experts would be 1.9 GB)."""
    with torch.device("meta"):
        model = OneLayer(MoELayer(hidden, **layer)).to(torch.bfloat16)
        return model, (torch.randn(SEQUENCE, MICRO_BATCH, hidden, dtype=torch.bfloat16),)


def mixtral() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """``MIXTRAL_PROXY``."""
    return _built(4096, ffn=14336, experts=8, top_k=2)


def deepseek() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """``DEEPSEEK_PROXY``; its group limit also told as `transformers` configurations tell it
    (``n_group``, ``topk_group``), which is where fxlens's plan reads it."""
    model, inputs = _built(7168, ffn=2048, experts=32, top_k=8, sigmoid=True, groups=8,
                           groups_per_token=4, shared=2048)
    model.config = SimpleNamespace(n_group=8, topk_group=4)
    return model, inputs
