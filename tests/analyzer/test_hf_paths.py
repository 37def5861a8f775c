"""`transformers` model code takes its eager path while captured
(`fxlens.analyzer.capture.hf_paths`): the gated DeltaNet solves its triangular systems as
eager does, under every capture method, and nothing stays replaced afterwards."""

from __future__ import annotations

import sys

import pytest
import transformers.models.qwen3_next.modeling_qwen3_next as qwen3_next

from fxlens.analyzer.capture.as_eager import libraries_as_eager
from fxlens.analyzer.capture.chain import capture
from fxlens.analyzer.capture.hf_paths import QUESTIONS, model_modules
from fxlens.analyzer.cost.engine import analyze
from fxlens.rules import load_rules
from tests.models.hf_zoo_hybrid import build_qwen3_next


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


@pytest.mark.parametrize("method", [pytest.param("export", marks=pytest.mark.slow),
                                    pytest.param("make_fx", marks=pytest.mark.slow), "record"])
def test_gated_deltanet_is_captured_as_its_eager_run_solves(method: str) -> None:
    """Eager solves each chunk's unit lower-triangular system (2 solves per DeltaNet layer);
    under export transformers would invert it by forward substitution and two more batched
    GEMMs. The capture follows eager whatever the method: 2 solves, 8 matmuls of the chunked
    algorithm in the one DeltaNet layer, the same FLOPs."""
    module, inputs = build_qwen3_next()
    registry = load_rules()
    graph = capture(module, inputs, registry, methods=(method,))
    report = analyze(graph, registry, strict=True)
    layer = [n for n in report.nodes if n.module.endswith("linear_attn")]
    solves = [n for n in layer if n.target.startswith("aten.linalg_solve_triangular")]
    assert len(solves) == 2
    # chunk 64 > 24 tokens: one chunk of 64 padded rows; B·H = 2·4 systems, 16 columns each
    assert [n.flops for n in solves] == [2 * 4 * 16 * 64 * 63] * 2
