"""`routed_llama4_experts()`: Llama 4's MoE layer captured as the routed experts a GPU run
computes, not `transformers`' dense stand-in.

`transformers`' ``Llama4TextMoe`` runs every expert on every token: it repeats the tokens
once per expert, scales each copy by the router's score (0 for an expert not chosen) and
multiplies all of them by every expert's weights (two ``bmm`` over E × tokens rows), then sums
the E results. Its own docstring says it "should really not be run on a single machine". The
values are those of the routed layer — a row scaled by 0 contributes 0 — but the work is E/k
times the routed experts' (16× for Llama 4 Scout's 16 experts and top-1, 128× for
Maverick's), and so are the activations it saves. Every serving and training stack runs the
routed form (vLLM's fused MoE, Megatron-core's grouped GEMMs, torchtitan's).

While a model is captured (`fxlens.analyzer.capture.as_eager.libraries_as_eager`),
``Llama4TextMoe.forward`` runs the routed form: the router as before, each token's top-k
experts, the rows sorted by expert and scaled by their scores as the dense form scales its
copies, ``torch._grouped_mm`` over the experts' weights in the experts module
(``Llama4TextExperts.forward``: the grouped GEMMs the plan's expert parallelism sizes), and
the results added back to their tokens beside the shared expert.
Same values, the routed work. Measured on two layers at Llama 4 Scout's sizes (transformers'
default text config: hidden 5,120, 16 experts of 8,192, top-1) and one 4,096-token sequence
(``analyze --train --device h100``): the step's FLOPs 134.9 → 42.1 T, saved activations
15.2 → 5.5 GiB, the roofline's forward and backward 0.25 → 0.10 s.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch

from fxlens.analyzer.capture.replaced import attributes

MODULE = "transformers.models.llama4.modeling_llama4"


def routed_forward(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``Llama4TextMoe.forward`` with each token through its top-k experts only."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_scores, router_logits = self.router(hidden_states)
    top_k = self.router.top_k
    chosen = torch.topk(router_logits, top_k, dim=1).indices            # the router's choice
    flat = chosen.flatten()
    order = flat.argsort(stable=True)
    rows = order // top_k
    # rows per expert as a histogram, as transformers' own grouped path counts them (a
    # one-hot of every row × expert would be a T·k × E tensor); histc takes floats on a CPU
    counts = torch.histc(flat.float(), bins=self.num_experts, min=0,
                         max=self.num_experts - 1)
    offsets = counts.cumsum(0).to(torch.int32)
    scores = router_scores.gather(1, chosen).flatten()[order, None]
    routed_out = self.experts(hidden_states[rows] * scores, offsets)
    out = self.shared_expert(hidden_states)
    out.add_(torch.zeros_like(out).index_add(0, rows, routed_out.to(out.dtype)))
    return out, router_logits


def grouped_experts(self: Any, hidden_states: torch.Tensor, offsets: torch.Tensor
                    ) -> torch.Tensor:
    """``Llama4TextExperts.forward`` over rows sorted by expert, `offsets` the end of each
    expert's rows: the two grouped GEMMs and the gated activation between them."""
    gate, up = torch._grouped_mm(hidden_states, self.gate_up_proj, offs=offsets).chunk(2, -1)
    return torch._grouped_mm(up * self.act_fn(gate), self.down_proj, offs=offsets)


@contextlib.contextmanager
def routed_llama4_experts() -> Iterator[None]:
    """For the duration, a loaded Llama 4 model file's MoE layer runs `routed_forward` and
    its experts `grouped_experts` (so their work stays the experts module's)."""
    module = sys.modules.get(MODULE)
    if module is None:
        yield
        return
    with (attributes(module.Llama4TextMoe, {"forward": routed_forward}),
          attributes(module.Llama4TextExperts, {"forward": grouped_experts})):
        yield
