"""``--loss-dtype logits``: a transformers causal LM's step recorded with the cross-entropy in
the logits' dtype (no float32 cast), as trainers that skip the cast run it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fxlens.analyzer.capture.hf import load_preset
from fxlens.analyzer.capture.hf_loss import causal_lm_loss, logits_dtype_loss
from fxlens.analyzer.core.sections import Training
from fxlens.cli.main import main
from fxlens.pipeline import AnalysisOptions, run_pipeline
from fxlens.reports.views.memory import step_summary
from tests.models import hf_zoo

SMALL = {"num_hidden_layers": "2", "hidden_size": "64", "intermediate_size": "128",
         "num_attention_heads": "4", "num_key_value_heads": "2", "vocab_size": "1000"}


def test_the_loss_is_transformers_own_without_the_cast() -> None:
    model, inputs = hf_zoo.build_llama()
    ids = inputs["input_ids"]
    with torch.no_grad():
        own = model(input_ids=ids, labels=ids).loss
        with logits_dtype_loss(model):
            ours = model(input_ids=ids, labels=ids).loss
        assert "_loss_function" not in vars(model)          # the model's own put back
        half = model.to(torch.bfloat16)
        assert half(input_ids=ids, labels=ids).loss.dtype == torch.float32
        with logits_dtype_loss(half):
            assert half(input_ids=ids, labels=ids).loss.dtype == torch.bfloat16
    torch.testing.assert_close(ours, own)
    logits = torch.randn(2, 5, 7)
    labels = torch.tensor([[1, 2, -100, 4, 5], [6, 0, 1, 2, 3]])
    summed = causal_lm_loss(logits, labels, 7, num_items_in_batch=torch.tensor(7))
    torch.testing.assert_close(summed, causal_lm_loss(logits, labels, 7))  # 7 labelled


def memory_table_title(training: Training) -> str:
    return step_summary(training).title


@pytest.mark.slow
def test_the_step_saves_the_log_softmax_in_the_logits_dtype() -> None:
    def saved(loss_dtype: str) -> int:
        loaded = load_preset("llama-3-8b", SMALL, batch=2, seq_len=16)
        training = run_pipeline(loaded, AnalysisOptions(
            train=True, loss_dtype=loss_dtype, fusion=False)).get(Training)
        assert training is not None and training.precision == "amp-bf16"
        # every surface labels the step with the loss it was recorded with
        assert memory_table_title(training) == "training step · amp-bf16 · adamw" + (
            " · loss in the logits' dtype" if loss_dtype == "logits" else "")
        return training.saved_activation_bytes

    # the cross-entropy's saved log-softmax, 4 bytes per logit cast and 2 in bf16, and its
    # scalar total weight (the same 4 and 2)
    assert saved("fp32") - saved("logits") == (2 * 16 * 1000 + 1) * (4 - 2)


def test_a_model_computing_its_own_loss_is_refused_in_one_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    model = Path(__file__).parent.parent / "models" / "mlp.py"
    assert main([str(model), "--train", "--loss-dtype", "logits", "--out", str(tmp_path),
                 "--no-pages"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any("--loss-dtype logits: only a transformers causal LM" in line for line in err)


def test_an_unknown_loss_dtype_is_refused_and_a_sweep_passes_it_on() -> None:
    from fxlens.analyzer.core.errors import LoadError
    from fxlens.pipeline import check_options
    from fxlens.sweep import Point, SweepSpec

    with pytest.raises(LoadError, match="--loss-dtype 'bf16': one of fp32, logits"):
        check_options(AnalysisOptions(train=True, loss_dtype="bf16"))
    assert SweepSpec(train=True, loss_dtype="logits").options(Point("hf:gpt2")).loss_dtype == (
        "logits")
