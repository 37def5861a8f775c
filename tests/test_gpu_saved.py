"""`bench/gpu/saved.py` on the CPU with a small Llama: the saved-tensor count leaves the
parameters out, and fxlens's captured saved set matches what eager autograd keeps; under
torch.compile (its real partitioner) fxlens's fused set is close to what the compiler keeps."""

from __future__ import annotations

import pytest
import torch

from bench.gpu import saved

pytestmark = pytest.mark.slow
TINY = {"name": "tiny llama", "preset": "llama-3-8b", "layers": 2, "tokens": 128,
        "overrides": {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
                      "num_key_value_heads": 2, "vocab_size": 512}}


def test_saved_bytes_measured_and_predicted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(saved, "CASES", (TINY,))
    (row,) = saved.measure(torch.device("cpu"))
    row["predicted"] = saved.predict(row)
    eager, compiled = row["eager"]["saved_bytes"], row["compiled"]["saved_bytes"]
    assert compiled < eager
    assert row["predicted"]["captured"] == pytest.approx(eager, rel=0.15)
    assert row["predicted"]["fused"] == pytest.approx(compiled, rel=0.15)
    assert "| tiny llama |" in saved.table({"rows": [row]})
