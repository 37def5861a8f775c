"""`transformers` model code takes its eager path while captured
(`fxlens.analyzer.capture.hf_paths`): the gated DeltaNet solves its triangular systems as
eager does, under every capture method, and nothing stays replaced afterwards."""

from __future__ import annotations

import sys

import pytest
import torch
import transformers.models.qwen3_next.modeling_qwen3_next as qwen3_next

from fxlens.analyzer.capture.as_eager import libraries_as_eager
from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.capture.hf_paths import QUESTIONS, model_modules
from fxlens.analyzer.cost.engine import analyze
from fxlens.rules import load_rules


def test_model_files_answer_as_eager_while_captured_and_are_restored() -> None:
    """Qwen3-Next asks only whether it is exported; Mamba also whether it is compiled
    (its ``associative_scan`` path runs when compiling but not exporting)."""
    import transformers.models.mamba.modeling_mamba as mamba

    def asked() -> dict[str, object]:
        return {f"{m.__name__}.{q}": getattr(m, q) for m in (qwen3_next, mamba)
                for q in QUESTIONS if hasattr(m, q)}

    originals = asked()
    assert len(originals) == 3 and qwen3_next.__name__ in model_modules()
    with libraries_as_eager():
        assert qwen3_next.is_torchdynamo_exporting() is False
        assert mamba.is_torchdynamo_compiling() is mamba.is_torchdynamo_exporting() is False
        masking = sys.modules["transformers.masking_utils"]
        assert masking.is_torchdynamo_exporting is originals[
            f"{qwen3_next.__name__}.is_torchdynamo_exporting"]
    assert asked() == originals


class DeltaRuleFromAState(torch.nn.Module):
    """Qwen3-Next's chunked gated delta rule continued from a cache's state: the call the
    fused kernel op leaves to transformers' reference (`fxlens.analyzer.capture.hf_gdn`)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return qwen3_next.torch_chunk_gated_delta_rule(
            q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True)


@pytest.mark.parametrize("method", [pytest.param("export", marks=pytest.mark.slow),
                                    pytest.param("make_fx", marks=pytest.mark.slow), "record"])
def test_gated_deltanet_is_captured_as_its_eager_run_solves(method: str) -> None:
    """Eager solves each chunk's unit lower-triangular system (2 solves per call); under
    export transformers would invert it by forward substitution and two more batched GEMMs.
    The capture follows eager whatever the method: 2 solves, the same FLOPs."""
    batch, tokens, heads, dim = 2, 24, 4, 16
    inputs = (torch.randn(batch, tokens, 2, dim), torch.randn(batch, tokens, 2, dim),
              torch.randn(batch, tokens, heads, dim), -torch.rand(batch, tokens, heads),
              torch.rand(batch, tokens, heads), torch.zeros(batch, heads, dim, dim))
    registry = load_rules()
    graph = capture(DeltaRuleFromAState(), inputs, registry, methods=(method,))
    report = analyze(graph, registry, strict=True)
    solves = [n for n in report.nodes if n.target.startswith("aten.linalg_solve_triangular")]
    assert len(solves) == 2
    # chunk 64 > 24 tokens: one chunk of 64 padded rows; B·H = 2·4 systems, 16 columns each
    assert [n.flops for n in solves] == [batch * heads * dim * 64 * 63] * 2
