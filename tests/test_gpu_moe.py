"""`bench/gpu/moe.py` and `bench/gpu/attention.py` on the CPU at shrunk sizes: every case
builds, measures forward and backward (or says why a backend refused it), is predicted by
fxlens on fake tensors where the script predicts, and lands in the Markdown table."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench.gpu import moe

pytestmark = pytest.mark.slow
KEEP = ("experts", "top_k", "heads", "kv_heads")


def small(case: moe.MoECase) -> moe.MoECase:
    return replace(case, sizes={k: v if k in KEEP else max(8, v // 32)
                                for k, v in case.sizes.items()})


def test_every_case_measures_predicts_and_tabulates(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setattr(moe, "CASES", tuple(small(c) for c in moe.CASES))
    rows = moe.measure(torch.device("cpu"), warmup=0, repeat=1)
    assert [r["name"] for r in rows] == [c.name for c in moe.CASES]
    for row in rows:
        assert "error" not in row, row
        assert row["forward_s"] > 0 and row["forward_flops_per_s"] > 0
        row["predicted"] = moe.predict(moe.MoECase(row["name"], row["kind"], row["sizes"]),
                                       "h200")
        assert 0 < row["predicted"]["forward_s"] < row["predicted"]["backward_s"]
    (tmp_path / "moe.json").write_text(json.dumps({"device": "cpu", "rows": rows}))
    table = moe.table(json.loads((tmp_path / "moe.json").read_text()))
    assert table.count("\n") == len(rows) + 1 and "| qwen3-235b ep32 rank experts |" in table


def test_expert_flops_are_the_grouped_gemms() -> None:
    case = moe.MoECase("x", "experts", {"experts": 4, "rows": 8, "hidden": 16, "ffn": 4})
    assert moe.flops(case)["forward"] == 2 * 4 * 8 * 16 * 3 * 4
    block = moe.MoECase("b", "block", {"experts": 4, "top_k": 2, "tokens": 8, "hidden": 16,
                                       "ffn": 4})
    assert moe.flops(block)["forward"] == 2 * 16 * 16 * 3 * 4 + 2 * 8 * 16 * 4   # + router


def test_attention_backends_measure_or_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.gpu import attention

    monkeypatch.setattr(attention, "SHAPES", ((1, 4, 2, 64, 16),))
    rows = attention.measure(torch.device("cpu"), warmup=0, repeat=1)
    assert [r["backend"] for r in rows] == list(attention.BACKENDS)
    flash = rows[0]
    assert flash["forward_flops_per_s"] == pytest.approx(2 * 4 * 64 * 64 * 16 / flash["forward_s"])
    assert all("error" in r or r["forward_s"] > 0 for r in rows)
    table = attention.table({"rows": rows})
    assert table.count("\n") == len(rows) + 1 and "| (1, 4, 2, 64, 16) | FLASH_ATTENTION |" in table
