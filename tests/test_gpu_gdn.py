"""`bench/gpu/gdn.py`: flash-linear-attention's delta-rule kernels timed on a GPU, kernel by
kernel. On the CPU (no Triton, no FLA) every case says why it was not measured; FLA's own
kernels are told from PyTorch's in a kernel table; and the committed H200 run stays within
what fxlens's rule (roofline plus the state kernels' serial steps) says of it."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench.gpu import gdn

RUN = Path(__file__).resolve().parent.parent / "bench/gpu/runs/gdn-h200-2026-11-29.json"


def test_without_the_library_every_case_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gdn, "CASES", tuple(replace(c, tokens=64, sequences=1)
                                            for c in gdn.CASES[:2]))
    rows = gdn.measure(torch.device("cpu"), warmup=0, repeat=1)
    assert [r["name"] for r in rows] == [c.name for c in gdn.CASES]
    assert all("error" in r and "forward_s" not in r for r in rows)


def test_inputs_pack_several_sequences_into_one_row_as_vllm_did() -> None:
    case = gdn.GDNCase("x", "gdn", 4, 128, 2, 8, varlen=True, backward=True)
    tensors = gdn.inputs(case, torch.device("cpu"))
    assert tensors["v"].shape == (1, 512, 8, gdn.HEAD_DIM)
    assert tensors["cu_seqlens"].tolist() == [0, 128, 256, 384, 512]
    assert (tensors["g"] < 0).all() and tensors["q"].requires_grad
    per_channel = gdn.inputs(replace(case, kind="kda", varlen=False), torch.device("cpu"))
    assert per_channel["g"].shape == (4, 128, 8, gdn.HEAD_DIM)


def test_fla_kernels_are_told_from_pytorchs() -> None:
    row = {"forward_kernels": [{"kernel": "chunk_fwd_kernel_o", "us_per_step": 30.0},
                               {"kernel": "void at::native::FillFunctor<>", "us_per_step": 5.0}],
           "step_kernels": [{"kernel": "chunk_fwd_kernel_o", "us_per_step": 30.0},
                            {"kernel": "chunk_bwd_kernel_dqkwg", "us_per_step": 50.0},
                            {"kernel": "Memcpy DtoD (Device -> Device)", "us_per_step": 9.0}]}
    assert gdn.kernel_seconds(row) == pytest.approx({"forward_s": 30e-6, "backward_s": 50e-6})
    assert math.isnan(gdn.kernel_seconds({})["forward_s"])


def test_the_h200_run_is_within_what_fxlens_says_of_it(tmp_path: Path) -> None:
    """FLA's kernels on an H200 against the rule on the ``h200`` entry: forward within
    0.9–1.35× from 2,048 tokens a sequence (at 1,024 a fixed ~18 µs kernel dominates),
    backward 1.2–1.45× (the gradient kernels' work runs below the roofline)."""
    result = json.loads(RUN.read_text())
    measured = [row for row in result["rows"] if "error" not in row]
    assert len(measured) == 11
    for row in measured:
        row["predicted"] = gdn.predict(row, "h200")
        kernels = gdn.kernel_seconds(row)
        if row["tokens"] >= 2048:
            assert 0.9 < kernels["forward_s"] / row["predicted"]["forward_s"] < 1.35, row["name"]
        if row["backward"]:
            assert 1.2 < kernels["backward_s"] / row["predicted"]["backward_s"] < 1.45
    table = gdn.table(result)
    assert table.count("\n") == len(result["rows"]) + 1
    assert "| qwen3-next rank 4×4096 |" in table and "not measured" in table
