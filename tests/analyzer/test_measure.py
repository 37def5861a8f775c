"""Real runs: the storage tracker on hand-derived cases, then every zoo model's predicted
activation peak (`liveness`, eager lifetimes) against its measured CPU run.

Inference must agree within `TOLERANCE`. A model that cannot, for a reason we can name, is in
`KNOWN_DIVERGENCES` with that reason and the bound we measured; it must still stay within it,
never over-predict by more than `TOLERANCE`, and leave the table once it agrees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.capture.hf_llama4_moe import routed_llama4_experts
from fxlens.analyzer.memory.liveness import liveness
from fxlens.analyzer.memory.measure import measure_memory, simulate_eager_memory
from fxlens.rules import load_rules
from tests.models import OWN_ZOO
from tests.models.diffusers_zoo import ZOO as DIFFUSERS_ZOO
from tests.models.hf_zoo import ZOO as HF_ZOO

F32 = 4
X = 4 * 8 * F32   # a (4, 8) fp32 tensor
TOLERANCE = 0.05

NAMED_LOCALS = (
    "eager keeps names bound in a forward until it returns ({names}); the graph frees them at "
    "their last use and `fxlens.analyzer.memory.eager` extends only call arguments and names "
    "read by "
    "a later statement"
)


EAGER_HOLDS_MORE = (
    "the eager run keeps tensors past their last use that graph liveness frees ({what}; not "
    "yet named tensor by tensor); the simulated eager peak agrees within tolerance"
)

SSD_REFERENCE = (
    "the real CPU run calls transformers' reference scan (mamba_ssm needs a GPU): its per-chunk "
    "scores, decay masks and float32 states, which the fused kernel the graph counts keeps on "
    "chip, are live at its peak"
)

SELECTIVE_SCAN_REFERENCE = (
    "the real CPU run calls transformers' reference selective scan (mamba_ssm needs a GPU): "
    "its discretised A and B·u for every channel, token and state, float32, which the fused "
    "kernel the graph counts never materialises, are live at its peak"
)

GDN_REFERENCE = (
    "the real CPU run calls transformers' reference gated delta rule (flash-linear-attention "
    "needs a GPU): its float32 copies of q, k and v, per-chunk decay (KDA's per key channel), "
    "system and score matrices, which the fused kernels the graph counts keep on chip, are "
    "live at its peak"
)


@dataclass(frozen=True)
class Divergence:
    reason: str
    lowest_ratio: float          # predicted / measured, as measured (torch 2.13, CPU) minus ~3 %


KNOWN_DIVERGENCES: dict[str, Divergence] = {
    "lstm": Divergence(
        "the CPU LSTM/GRU kernels run per-step ops whose intermediates (every step's input "
        "projection, each step's hidden state until the final stack) one graph node hides", 0.30),
    "branchy": Divergence(NAMED_LOCALS.format(names="the MoE's probs, chosen, y"), 0.80),
    "hf-gpt2": Divergence(NAMED_LOCALS.format(names="inputs_embeds, position_embeds, "
                                              "attn_output"), 0.85),
    "hf-llama": Divergence(NAMED_LOCALS.format(names="inputs_embeds"), 0.88),
    "hf-mixtral": Divergence(NAMED_LOCALS.format(names="inputs_embeds, the experts' sorted "
                                                 "token states"), 0.82),
    "hf-whisper": Divergence(NAMED_LOCALS.format(names="the encoder's inputs_embeds, the "
                                                 "attention's q, k, v"), 0.84),
    "hf-vit": Divergence(NAMED_LOCALS.format(names="hidden_states_norm, attention_output, "
                                             "q, k, v"), 0.85),
    "hf-wav2vec2": Divergence(NAMED_LOCALS.format(names="the attention's q, k, v and the "
                                                  "feature projection"), 0.90),
    # the whole gap, 3,072 B: one (2, 12, 32) fp32 tensor, T5LayerFF's normed input while
    # its MLP runs (until the capture made T5's skipped masks as its eager run does, the
    # graph's materialised masks had hidden it)
    "hf-t5": Divergence(NAMED_LOCALS.format(names="forwarded_states"), 0.86),
    # The wider zoo (issue 19): what eager holds is not broken down by tensor yet; the
    # simulated eager peak agrees within TOLERANCE on each (test below), which is why
    # fxlens.analyzer.memory.liveness says to lead with it.
    **{f"hf-{name}": Divergence(EAGER_HOLDS_MORE.format(what=what), bound) for name, what, bound
       in (("deepseek_v3", "MoE routing and MLA latents", 0.52),
           ("falcon", "names in forward", 0.81),
           ("gpt_neox", "names in forward", 0.87),
           ("opt", "names in forward", 0.63),
           ("phi3", "names in forward", 0.89),
           ("qwen2", "names in forward", 0.87),
           ("qwen3_moe", "MoE routing", 0.55),
           ("rwkv", "the recurrence's per-step states", 0.72),
           ("ast", "names in forward", 0.84),
           ("bloom", "the ALiBi scores and names in forward", 0.82),
           ("modernbert", "the unpadded rotary states, names in forward", 0.82),
           ("gemma3", "names in forward", 0.90),
           ("mistral", "names in forward", 0.87),
           # the 2025–26 hybrids (tests/models/hf_zoo_hybrid.py): names held in their
           # Python code (MiniMax's lightning-attention block loop, Llama 4's routing)
           ("minimax", "the lightning-attention scan's names", 0.74),
           ("lfm2", "names in forward", 0.87),
           ("gpt_oss", "the sink-extended scores, MoE routing", 0.50),
           ("llama4", "names in forward, MoE routing", 0.72),
           ("gemma3n", "the AltUp and per-layer inputs' names", 0.58))},
    # Mamba-2's chunked scan is one op in the graph, as mamba_ssm's kernel (its per-chunk
    # score and decay matrices on chip, fxlens.analyzer.capture.hf_ssd)
    **{f"hf-{name}": Divergence(SSD_REFERENCE, bound) for name, bound
       in (("mamba2", 0.29), ("falcon_h1", 0.37), ("bamba", 0.29), ("granite_moe_hybrid", 0.29),
           ("nemotron_h", 0.30), ("zamba2", 0.44))},
    # Mamba-1's selective scan is one op, as mamba_ssm's kernel
    # (fxlens.analyzer.capture.hf_selective_scan)
    **{f"hf-{name}": Divergence(SELECTIVE_SCAN_REFERENCE, bound) for name, bound
       in (("mamba", 0.23), ("jamba", 0.26))},
    # chunked gated delta rules are one op, as flash-linear-attention's kernels
    # (fxlens.analyzer.capture.hf_gdn); at 24 tokens the reference's chunk of 64 is mostly
    # padding, and KDA's holds a chunk × chunk decay per key channel
    **{f"hf-{name}": Divergence(GDN_REFERENCE, bound) for name, bound
       in (("qwen3_next", 0.13), ("qwen3_5", 0.14), ("olmo_hybrid", 0.13),
           ("kimi_linear", 0.027))},
    "diffusers-dit": Divergence(EAGER_HOLDS_MORE.format(what="the adaLN modulation chunks"),
                                0.89),
}


# --- the tracker on hand-derived cases ---------------------------------------------------------

class Probe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.w.t()        # X (the transposed weight is a view of the parameter)
        v = y.view(32)            # a view: nothing new
        v.add_(1)                 # in place: nothing new
        z = torch.relu(v)         # X
        del y, v                  # frees y's storage
        return z * 3              # X


def test_tracker_counts_each_new_storage_once_until_released() -> None:
    measured = measure_memory(Probe(), (torch.randn(4, 8),))
    assert measured.peak_bytes == 2 * X
    assert measured.end_bytes == X           # z died with the forward; the output is held
    assert measured.storages == 3 and measured.allocated_bytes == 3 * X
    assert measured.ops[measured.timeline.index(2 * X)].startswith("aten.relu")


def test_training_step_counts_gradients_and_adamw_state() -> None:
    model = nn.Linear(4, 3)
    before = model.weight.detach().clone()
    measured = measure_memory(model, (torch.randn(2, 4),), train=True)
    output, grads = 2 * 3 * F32, (4 * 3 + 3) * F32
    adam_moments = 2 * grads                 # exp_avg and exp_avg_sq, fp32
    assert measured.end_bytes == output + grads + adam_moments
    assert measured.peak_bytes >= measured.end_bytes
    assert torch.equal(model.weight, before) and model.weight.grad is None   # a copy trained


def test_training_step_takes_an_optimizer_factory() -> None:
    def sgd(params: Any) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.1)

    measured = measure_memory(nn.Linear(4, 3), (torch.randn(2, 4),), train=True,
                              optimizer_factory=sgd)
    assert measured.end_bytes == 2 * 3 * F32 + (4 * 3 + 3) * F32   # output + grads, no state


# --- predicted against measured on the zoo -----------------------------------------------------

def ratio_of(build: Callable[[], tuple[Any, Any]]) -> tuple[int, int]:
    module, inputs = build()
    module.eval()
    registry = load_rules()
    with torch.no_grad():
        graph = capture(module, inputs, registry)
    predicted = liveness(graph, registry).peak_activation_bytes
    with routed_llama4_experts():     # the routed experts a GPU runs, as the graph holds
        measured = measure_memory(module, inputs).peak_bytes
    return predicted, measured


def check(name: str, build: Callable[[], tuple[Any, Any]]) -> None:
    predicted, measured = ratio_of(build)
    ratio = predicted / measured
    assert ratio <= 1 + TOLERANCE, f"{name}: predicted {predicted} B over measured {measured} B"
    known = KNOWN_DIVERGENCES.get(name)
    if known is None:
        assert ratio >= 1 - TOLERANCE, (
            f"{name}: predicted {predicted} B, measured {measured} B (ratio {ratio:.3f})")
    else:
        assert ratio >= known.lowest_ratio, f"{name}: ratio {ratio:.3f} below its bound"
        assert ratio < 1 - TOLERANCE, f"{name} now agrees ({ratio:.3f}): drop it from the table"


@pytest.mark.parametrize("name", sorted(OWN_ZOO))
def test_predicted_peak_matches_a_real_run(name: str) -> None:
    check(name, OWN_ZOO[name])


# Models written by others: transformers and diffusers architectures (tests/models/*_zoo.py).
OTHERS = {**{f"hf-{n}": build for n, build in HF_ZOO.items()},
          **{f"diffusers-{n}": build for n, build in DIFFUSERS_ZOO.items()}}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OTHERS))
def test_predicted_peak_matches_a_real_run_of_models_by_others(name: str) -> None:
    check(name, OTHERS[name])


def test_every_known_divergence_names_a_zoo_model() -> None:
    assert set(KNOWN_DIVERGENCES) <= set(OWN_ZOO) | set(OTHERS)


# --- the eager figure: simulated on fake tensors, against the real run ---------------------------

ZOO = {**OWN_ZOO, **OTHERS}
# SSD_REFERENCE, GDN_REFERENCE, SELECTIVE_SCAN_REFERENCE: the lowest simulated / measured
# eager peak (torch 2.13, CPU) minus ~3 %
REFERENCE_SIMULATED = {f"hf-{name}": bound for name, bound in (
    ("mamba2", 0.39), ("falcon_h1", 0.49), ("bamba", 0.36), ("granite_moe_hybrid", 0.36),
    ("nemotron_h", 0.37), ("zamba2", 0.45), ("qwen3_next", 0.18), ("qwen3_5", 0.14),
    ("olmo_hybrid", 0.13), ("kimi_linear", 0.027), ("mamba", 0.24), ("jamba", 0.31))}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO))
def test_simulated_eager_peak_within_5_percent_of_a_real_run(name: str) -> None:
    """The eager simulation keeps Python's own references; it diverges only where the real
    run is not the run we model (`REFERENCE_SIMULATED`)."""
    module, inputs = ZOO[name]()
    module.eval()
    simulated = simulate_eager_memory(module, inputs).peak_bytes
    with routed_llama4_experts():
        measured = measure_memory(module, inputs).peak_bytes
    if name not in REFERENCE_SIMULATED:
        assert simulated == pytest.approx(measured, rel=TOLERANCE)
        return
    ratio = simulated / measured
    bound = REFERENCE_SIMULATED[name]
    assert bound <= ratio < 1 - TOLERANCE, f"{name}: {ratio:.3f}: update the table"


def test_simulation_needs_no_weights() -> None:
    with torch.device("meta"):
        big = nn.Sequential(nn.Linear(8192, 8192), nn.GELU(), nn.Linear(8192, 8192))
    x = torch.empty(4, 8192, device="meta")
    simulated = simulate_eager_memory(big, (x,))
    assert simulated.peak_bytes == 2 * 4 * 8192 * F32   # the GELU reads the first output
